"""Data pipeline: bin packing of sequences into fixed-size packs and packed datasets."""

from .dataset import PackedDataset, PackingStats, pack_dataset
from .packing import pack_lengths, split_lengths

__all__ = ["PackedDataset", "PackingStats", "pack_dataset", "pack_lengths", "split_lengths"]
