"""The public surface holds: every name of every `__all__` resolves on its module, and the surface stays small.

The modules with an `__all__` are found in the source, so a new package is covered without being listed here.
"""

import ast
import importlib
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1] / "flatcollate"
MAX_TOP_LEVEL = 20
MAX_PUBLIC = 85


def exporting_modules() -> list[str]:
    """Every module of flatcollate that assigns `__all__`."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        tree = ast.parse(path.read_text())
        targets = [t for node in tree.body if isinstance(node, ast.Assign) for t in node.targets]
        if any(isinstance(target, ast.Name) and target.id == "__all__" for target in targets):
            parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
            found.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


EXPORTING = exporting_modules()


def public(module: str) -> list[str]:
    return list(importlib.import_module(module).__all__)


def test_the_public_lists_are_found():
    assert {"flatcollate", "flatcollate.data", "flatcollate.preference", "flatcollate.testing"} <= set(EXPORTING)


@pytest.mark.parametrize("module", EXPORTING)
def test_every_exported_name_resolves(module):
    imported = importlib.import_module(module)
    missing = [name for name in imported.__all__ if not hasattr(imported, name)]
    assert missing == [], f"{module}.__all__ names {missing}, which it does not define"
    assert len(set(imported.__all__)) == len(imported.__all__), f"{module}.__all__ repeats a name"


def test_the_public_surface_is_small():
    """The top level holds what the quick starts use; each subpackage what users call; internals stay unexported."""
    assert len(public("flatcollate")) <= MAX_TOP_LEVEL, public("flatcollate")
    counts = {module: len(public(module)) for module in EXPORTING}
    assert sum(counts.values()) <= MAX_PUBLIC, counts


DOCUMENTS = [ROOT.parent / "README.md", *sorted((ROOT.parent / "docs").glob("*.md"))]
IMPORT = re.compile(r"^\s*(?:>>> )?from (flatcollate[\w.]*) import (\([^)]*\)|[^\n#]*)", re.MULTILINE)
"""An import statement of a code block (names in parentheses may span lines)."""


def documented_imports() -> list[tuple[str, str, str]]:
    """`(document, module, name)` of every `from flatcollate... import name` in the README and docs/."""
    found = []
    for path in DOCUMENTS:
        for module, names in IMPORT.findall(path.read_text()):
            for name in names.strip("()").replace("\n", " ").split(","):
                if name.strip():
                    found.append((path.name, module, name.split(" as ")[0].strip()))
    return found


def test_every_import_the_readme_and_docs_show_works():
    imports = documented_imports()
    assert ("README.md", "flatcollate", "DataCollatorWithFlattening") in imports
    broken = []
    for document, module, name in imports:
        imported = importlib.import_module(module)
        if not hasattr(imported, name) and importlib.util.find_spec(f"{module}.{name}") is None:
            broken.append((document, module, name))
    assert broken == []
    top = {name for _, module, name in imports if module == "flatcollate"}
    assert top <= set(public("flatcollate")), top - set(public("flatcollate"))
