"""The token-normalised loss of a row split over a sequence-parallel group.

Each rank holds a slice of the row and its already-shifted labels (`split_for_sequence_parallel`). The step's loss is
the sum of token losses over every rank divided by the number of label tokens over every rank; each rank
backpropagates its share, and the gradients summed over the group (or averaged over `world_size` ranks, as DDP and
FSDP do, with `world_size` passed here) are the gradient of the unsplit row::

    loss = sum over ranks of  sum(token losses on the rank) / N      N = label tokens on all ranks
"""

import torch
import torch.nn.functional as F

from .._conventions import IGNORE_INDEX


def count_shifted_items(shift_labels: torch.Tensor) -> torch.Tensor:
    """Label tokens of this rank's slice: what it adds to the step's `num_items_in_batch`.

    Sum it over every rank and micro-batch (`flatcollate.training.global_num_items`) before the first forward.

    Args:
        shift_labels (`torch.Tensor` of shape `(1, T / P)`, int64): next-token labels, -100 where none.

    >>> count_shifted_items(torch.tensor([[5, -100, 7]]))
    tensor(2)
    """
    return (shift_labels != IGNORE_INDEX).sum()


def sequence_parallel_loss(
    logits: torch.Tensor,
    shift_labels: torch.Tensor,
    *,
    num_items_in_batch: int | torch.Tensor,
    world_size: int = 1,
) -> torch.Tensor:
    """This rank's share of the step loss: its summed token losses, scaled by `world_size / num_items_in_batch`.

    Args:
        logits (`torch.Tensor` of shape `(1, T / P, V)`, float): this rank's slice of the logits.
        shift_labels (`torch.Tensor` of shape `(1, T / P)`, int64): labels already shifted over the whole row, so
            position `t` is scored against `shift_labels[t]` (no shift here).
        num_items_in_batch: label tokens of the step over every rank (`global_num_items(count_shifted_items(...))`).
        world_size (`int`): ranks whose gradients are averaged (DDP/FSDP over data- and sequence-parallel ranks
            together); 1 when gradients are summed over the group instead.

    Returns:
        float32 scalar to call `backward` on; summed over ranks, the step's token-normalised loss times `world_size`.

    >>> logits = torch.zeros(1, 3, 4)
    >>> sequence_parallel_loss(logits, torch.tensor([[1, -100, 2]]), num_items_in_batch=2)  # ln 4 per token
    tensor(1.3863)
    """
    if logits.shape[:2] != shift_labels.shape:
        raise ValueError(
            f"`logits` {tuple(logits.shape)} and `shift_labels` {tuple(shift_labels.shape)} cover different tokens; "
            "pass this rank's logits with the `shift_labels` of the same `split_for_sequence_parallel` batch."
        )
    total = int(num_items_in_batch)
    if total <= 0:
        raise ValueError(
            f"`num_items_in_batch` is {total}: no label tokens in this step on any rank. Check that labels are not "
            "all -100."
        )
    loss_sum = F.cross_entropy(
        logits.flatten(0, 1).float(), shift_labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
    )
    return loss_sum * (world_size / total)
