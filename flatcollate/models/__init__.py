"""Tiny random models built offline from configs, the project's test and benchmark models: text causal LMs
(`text`: any `model_type`, a config folder or a config, shrunk to a few layers) and image-text-to-text families
(`vision`: one recipe per family in `vision_recipes`, with examples laid out as the family's processor lays them out;
a recipe picks its image fields from `vision_pixels` and its token blocks from `vision_blocks`).

`flatcollate check`, the compatibility table, the benchmarks and the tests all build their models here. Imports run one
way: `vision` -> `vision_recipes`, `vision_blocks`, `text`; `vision_recipes` -> `vision_pixels`, `vision_blocks`; this
package imports nothing else of flatcollate.

Each public name is imported from its module on first use.

Imports from flatcollate: `_lazy`.
"""

from .._lazy import lazy_exports

_SOURCES = {
    "TINY_FAMILY_SIZES": "text",
    "TINY_SIZES": "text",
    "apply_overrides": "text",
    "check_overrides": "text",
    "load_config": "text",
    "tiny_causal_lm": "text",
    "tiny_config": "text",
    "FAMILIES": "vision_recipes",
    "TINY_BUILD_NOTES": "vision",
    "tiny_vision_examples": "vision",
    "tiny_vision_lm": "vision",
}
"""Public name -> the module that defines it."""

__all__ = sorted(_SOURCES)

__getattr__, __dir__ = lazy_exports(__name__, _SOURCES, __all__)
