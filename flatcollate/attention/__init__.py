"""Packed attention for flattened rows: the `flatcollate` backend, its kernels and boundary handling.

Imports from flatcollate: `_conventions`, `boundaries`.
"""

from .dispatch import ATTN_IMPLEMENTATION, packed_attention_forward, select_kernel

__all__ = ["ATTN_IMPLEMENTATION", "packed_attention_forward", "select_kernel"]
