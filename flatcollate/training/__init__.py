"""Training glue: loss normalization across accumulation steps and data-parallel ranks, and per-example evaluation.

Imports from flatcollate: `_conventions`, `boundaries`.
"""

from .evaluation import split_flattened_predictions
from .loss import count_items, global_num_items, normalized_loss

__all__ = ["count_items", "global_num_items", "normalized_loss", "split_flattened_predictions"]
