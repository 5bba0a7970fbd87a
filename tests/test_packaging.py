"""The library installs without its tooling: matplotlib, which only the benchmark's plots use, is the `bench` extra;
the tiny models and reference kernels (`flatcollate.testing`) serve the tests, `flatcollate check` and the benchmarks,
never training; `tools/setup_env.sh` still installs everything the README's commands need."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
PLOTTING = ("matplotlib",)
"""What the bench's plots import and the library does not depend on."""


def project() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def requirement_names(requirements: list[str]) -> set[str]:
    return {re.match(r"[\w.-]+(\[[\w,]+\])?", requirement).group(0).lower() for requirement in requirements}


def test_the_core_depends_on_no_plotting_library():
    extras = project()["optional-dependencies"]
    assert not requirement_names(project()["dependencies"]) & set(PLOTTING)
    assert requirement_names(extras["bench"]) == set(PLOTTING)
    assert "flatcollate[bench]" in requirement_names(extras["test"])  # the tests draw the report's plots


def test_only_the_bench_plots_import_matplotlib():
    importers = set()
    for path in sorted((ROOT / "flatcollate").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names += [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            if any(name.split(".")[0] in PLOTTING for name in names):
                importers.add(path.relative_to(ROOT).as_posix())
    assert importers == {"flatcollate/bench/plots.py"}


def test_setup_env_installs_the_bench_and_the_test_extras():
    """The README's two commands (`bash tools/setup_env.sh && ...`) need both: the bench writes plots."""
    script = (ROOT / "tools" / "setup_env.sh").read_text()
    assert '-e ".[${EXTRAS:-bench,test}]"' in script
