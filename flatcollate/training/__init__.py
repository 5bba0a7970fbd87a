"""Training glue: loss normalization across accumulation steps and data-parallel ranks.

Imports from flatcollate: `_conventions`.
"""

from .loss import (
    count_items,
    global_num_items,
    normalized_loss,
    sequence_loss_terms,
    token_loss_terms,
)

__all__ = ["count_items", "global_num_items", "normalized_loss", "sequence_loss_terms", "token_loss_terms"]
