"""Data pipeline: bin packing of sequences into fixed-size packs."""

from .packing import pack_lengths, split_lengths

__all__ = ["pack_lengths", "split_lengths"]
