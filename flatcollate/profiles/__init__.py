"""Length profiles of real datasets: how long prompts, completions and preference pairs are, so benchmarks and
examples can draw realistic batches without the data. Named profiles ship in `data/` (`names`); `load_profile` and
`load_pair_profile` also read your own data; `python -m flatcollate.profiles.make` rebuilds the named ones.

Each public name is imported from its module on first use, so listing the names loads no numpy or torch.

Imports from flatcollate: `_conventions`, `_lazy`, `_paths`.
"""

from .._lazy import lazy_exports

_SOURCES = {
    "load_pair_profile": "pair_profile",
    "load_profile": "load",
    "padded_fill": "load",
}
"""Public name -> the module that defines it."""

__all__ = sorted(_SOURCES)

__getattr__, __dir__ = lazy_exports(__name__, _SOURCES, __all__)
