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

