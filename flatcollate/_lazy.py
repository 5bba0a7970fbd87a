"""Public names imported from their module on first use (PEP 562), so importing a package loads no torch."""

import importlib
from collections.abc import Callable


def lazy_exports(package: str, sources: dict[str, str], public: list[str]) -> tuple[Callable, Callable]:
    """`(__getattr__, __dir__)` for `package`: `sources` maps each public name to the submodule it comes from."""
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name: str):
        if name not in sources:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{sources[name]}", package), name)
        namespace[name] = value  # later lookups find it without this function
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *public})

    return __getattr__, __dir__


def moved_module(old: str, new: str, removed_in: str = "0.3") -> Callable:
    """`__getattr__` for a module that moved: every name is looked up in `new`, with a `DeprecationWarning` at import.

    Old import paths keep working for one release (`from flatcollate.check_lengths import plan_check`).
    """
    import warnings

    warnings.warn(
        f"`{old}` moved to `{new}`; import from `{new}` (the old path is removed in flatcollate {removed_in}).",
        DeprecationWarning,
        stacklevel=3,
    )

    def __getattr__(name: str):
        return getattr(importlib.import_module(new), name)

    return __getattr__
