"""Sequence parallelism (DeepSpeed-Ulysses style) for flattened rows: split a row over a group of ranks, exchange
heads for tokens inside attention, and normalise the loss over the whole row.

Imports from flatcollate: `_conventions`, `boundaries`, `families`, `attention`, `collate`, `modeling`.
"""

from .loss import count_shifted_items, sequence_parallel_loss
from .prepare import prepare_model_for_sequence_parallel, sequence_parallel_mesh
from .split import DataCollatorForSequenceParallel, split_for_sequence_parallel

__all__ = [
    "DataCollatorForSequenceParallel",
    "count_shifted_items",
    "prepare_model_for_sequence_parallel",
    "sequence_parallel_loss",
    "sequence_parallel_mesh",
    "split_for_sequence_parallel",
]
