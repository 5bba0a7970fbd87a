"""Data pipeline: raw examples to tokens and labels, bin packing, packed datasets and token-budget batches.

Imports from flatcollate: `flatcollate` (its version), `_conventions`, `_lazy`, `collate`.
"""

from .dart import make_supervised_dset
from .dataset import PackedDataset, PackingStats, pack_dataset
from .encode import Encoder
from .encoders import build_encoder
from .packing import pack_lengths, split_lengths
from .prompt_templates import BUILTIN_TEMPLATES, load_template
from .row_errors import RowError, SkippedRow
from .sampler import TokenBudgetBatchSampler, balanced_batches
from .supervised import EncodeStats, load_source, make_supervised_dataset

__all__ = [
    "BUILTIN_TEMPLATES",
    "EncodeStats",
    "Encoder",
    "PackedDataset",
    "PackingStats",
    "RowError",
    "SkippedRow",
    "TokenBudgetBatchSampler",
    "balanced_batches",
    "build_encoder",
    "load_source",
    "load_template",
    "make_supervised_dataset",
    "make_supervised_dset",
    "pack_dataset",
    "pack_lengths",
    "split_lengths",
]
