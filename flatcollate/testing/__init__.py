"""What the tests, `flatcollate check` and the benchmarks build on, not what training needs: tiny random models built
offline from configs, and slow references of the CUDA attention kernels.

- `tiny_text`: text causal LMs (any `model_type`, a config folder or a config, shrunk to a few layers), hybrids laid
  out by `tiny_hybrids` (attention between two state-carrying layers);
- `tiny_vision`: image-text-to-text families, one recipe per family in `vision_recipes` (its image fields from
  `vision_pixels`, its token blocks from `vision_blocks`), with examples laid out as the family's processor lays them
  out;
- `reference_kernels`, `reference_flash_attn`: stand-ins for PyTorch's `varlen_attn` and flash-attn 2, 3 and 4 with
  their real signatures and refusals, computed by a readable loop over sequences (`tests/attention` patches them in).

Imports run one way: `tiny_vision` -> `vision_recipes`, `vision_blocks`, `tiny_text`; `tiny_text` -> `tiny_hybrids`;
`vision_recipes` -> `vision_pixels`, `vision_blocks`; `reference_flash_attn` -> `reference_kernels`. The library's
training path (collate, modeling, data, ...) never imports this package; `check`, `bench` and `synthetic` do.

Each public name is imported from its module on first use.

Imports from flatcollate: `_lazy`, `_paths`.
"""

from .._lazy import lazy_exports

_SOURCES = {
    "tiny_causal_lm": "tiny_text",
    "tiny_config": "tiny_text",
    "tiny_vision_examples": "tiny_vision",
    "tiny_vision_lm": "tiny_vision",
}
"""Public name -> the module that defines it."""

__all__ = sorted(_SOURCES)

__getattr__, __dir__ = lazy_exports(__name__, _SOURCES, __all__)
