"""Packed attention for flattened rows: the `flatcollate` backend, its kernels and boundary handling.

Imports from flatcollate: `_conventions`.
"""

from .dispatch import ATTN_IMPLEMENTATION, packed_attention_forward, register_packed_attention, select_kernel
from .packed_segments import PackedSegments, segments_from_kwargs, segments_from_position_ids

__all__ = [
    "ATTN_IMPLEMENTATION",
    "PackedSegments",
    "packed_attention_forward",
    "register_packed_attention",
    "segments_from_kwargs",
    "segments_from_position_ids",
    "select_kernel",
]
