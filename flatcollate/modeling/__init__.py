"""Making models safe for flattened batches: backend selection, family support, mask patches and the argument guard.

Imports from flatcollate: `_conventions`, `boundaries`, `attention`.
"""

from .families import KEEP_OWN_BACKEND, UNSUPPORTED_FAMILIES, takes_packed_backend, unsupported_reason
from .guard import install_guard, is_flattened
from .mask_patch import patch_mask_builders
from .prepare import prepare_model_for_flattening
from .prepared_state import is_prepared
from .stateful_layers import SEGMENTED_MIXERS, row_bounds, segment_mixers

__all__ = [
    "KEEP_OWN_BACKEND",
    "SEGMENTED_MIXERS",
    "UNSUPPORTED_FAMILIES",
    "install_guard",
    "is_flattened",
    "is_prepared",
    "patch_mask_builders",
    "prepare_model_for_flattening",
    "row_bounds",
    "segment_mixers",
    "takes_packed_backend",
    "unsupported_reason",
]
