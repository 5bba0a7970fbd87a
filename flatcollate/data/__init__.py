"""Data pipeline: raw examples to tokens and labels, bin packing, packed datasets and token-budget batches.

Imports from flatcollate: `flatcollate` (its version), `_conventions`, `_lazy`, `_paths`, `boundaries`,
`collate`, `profiles` (the padded batches packing is compared with).
"""

from .dataset import PackedDataset, pack_dataset
from .encoders import build_encoder
from .packing import pack_lengths
from .row_errors import RowError, SkippedRow
from .sampler import TokenBudgetBatchSampler
from .supervised import make_supervised_dataset

__all__ = [
    "PackedDataset",
    "RowError",
    "SkippedRow",
    "TokenBudgetBatchSampler",
    "build_encoder",
    "make_supervised_dataset",
    "pack_dataset",
    "pack_lengths",
]
