"""The public surface holds: every name of every `__all__` resolves on its module.

The modules with an `__all__` are read from the source, so a new package is covered without being listed here.
"""

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1] / "flatcollate"


def public_lists() -> dict[str, list[str]]:
    """Module -> its `__all__`, for every module of flatcollate that assigns one (a list, or `sorted(_SOURCES)`)."""
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        tree = ast.parse(path.read_text())
        constants = {
            target.id: node.value
            for node in tree.body
            if isinstance(node, ast.Assign)
            for target in node.targets
            if isinstance(target, ast.Name)
        }
        if "__all__" not in constants:
            continue
        value = constants["__all__"]
        if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "sorted":
            value = constants[value.args[0].id]  # `sorted(_SOURCES)`: the keys of the dict
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[module] = sorted(ast.literal_eval(value))
    return found


PUBLIC = public_lists()


def test_the_public_lists_are_found():
    assert "flatcollate" in PUBLIC and "flatcollate.data" in PUBLIC
    assert all(PUBLIC.values())


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_every_exported_name_resolves(module):
    imported = importlib.import_module(module)
    missing = [name for name in PUBLIC[module] if not hasattr(imported, name)]
    assert missing == [], f"{module}.__all__ names {missing}, which it does not define"
    assert sorted(imported.__all__) == PUBLIC[module]
