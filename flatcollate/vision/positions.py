"""Moved to `flatcollate.modeling.multimodal_positions`; this path works, with a `DeprecationWarning`, until
flatcollate 0.3."""

from .._lazy import moved_module

__getattr__ = moved_module(__name__, "flatcollate.modeling.multimodal_positions")
