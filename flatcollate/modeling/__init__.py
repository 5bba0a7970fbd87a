"""Making models safe for flattened batches: backend selection, family support, and the argument guard."""

from .families import UNSUPPORTED_FAMILIES, unsupported_reason
from .guard import install_guard, is_flattened
from .prepare import prepare_model_for_flattening

__all__ = [
    "UNSUPPORTED_FAMILIES",
    "install_guard",
    "is_flattened",
    "prepare_model_for_flattening",
    "unsupported_reason",
]
