"""Data pipeline: bin packing of sequences into fixed-size packs, packed datasets and token-budget batches."""

from .dataset import PackedDataset, PackingStats, pack_dataset
from .packing import pack_lengths, split_lengths
from .sampler import TokenBudgetBatchSampler, balanced_batches

__all__ = [
    "PackedDataset",
    "PackingStats",
    "TokenBudgetBatchSampler",
    "balanced_batches",
    "pack_dataset",
    "pack_lengths",
    "split_lengths",
]
