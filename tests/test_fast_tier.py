"""The fast tier, `python -m pytest -m "not slow"`: the `slow` marker is registered, the README names the command, and
every package of flatcollate keeps a test module outside the slow tier (read from the source: a module is wholly slow
when its `pytestmark` holds `pytest.mark.slow`)."""

import ast
import functools
from pathlib import Path

import pytest

import flatcollate

TESTS = Path(__file__).parent
ROOT = TESTS.parent / "flatcollate"
PACKAGES = sorted(path.name for path in ROOT.iterdir() if (path / "__init__.py").is_file())
FAST_COMMAND = 'python -m pytest -m "not slow"'


def wholly_slow(tree: ast.Module) -> bool:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(target, "id", None) == "pytestmark" for target in node.targets):
            return "pytest.mark.slow" in ast.unparse(node.value)
    return False


def packages_tested(tree: ast.Module) -> set[str]:
    """The packages a test module imports, a name of the top level counted for the package it comes from."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("flatcollate"):
            parts = node.module.split(".")
            if len(parts) > 1:
                found.add(parts[1])
            else:
                found |= {flatcollate._SOURCES.get(alias.name, alias.name) for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {alias.name.split(".")[1] for alias in node.names if alias.name.startswith("flatcollate.")}
    return found


@functools.cache
def fast_modules() -> dict[str, set[str]]:
    """Test module -> the packages it tests, for every test module not wholly marked slow."""
    found = {}
    for path in sorted(TESTS.rglob("test_*.py")):
        tree = ast.parse(path.read_text())
        if not wholly_slow(tree):
            found[path.relative_to(TESTS).as_posix()] = packages_tested(tree)
    return found


def test_the_reader_sees_a_slow_module():
    assert wholly_slow(ast.parse("import pytest\npytestmark = [needs_gloo, pytest.mark.slow]\n"))
    assert not wholly_slow(ast.parse("pytestmark = pytest.mark.filterwarnings('ignore')\n"))


@pytest.mark.parametrize("package", PACKAGES)
def test_every_package_has_a_fast_test_module(package):
    assert any(package in tested for tested in fast_modules().values()), f"only slow tests import flatcollate.{package}"


def test_the_slow_marker_is_registered_and_the_readme_names_the_fast_tier():
    assert '"slow: ' in (TESTS.parent / "pyproject.toml").read_text()
    readme = (TESTS.parent / "README.md").read_text()
    assert FAST_COMMAND in readme
