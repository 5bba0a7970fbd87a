"""Making models safe for flattened batches: backend selection, family support, mask patches and the argument guard.

Imports from flatcollate: `_conventions`, `boundaries`, `forward_slot`, `families`, `attention`.
"""

from .guard import is_flattened
from .prepare import prepare_model_for_flattening
from .prepared_state import is_prepared
from .support import unsupported_reason

__all__ = [
    "is_flattened",
    "is_prepared",
    "prepare_model_for_flattening",
    "unsupported_reason",
]
