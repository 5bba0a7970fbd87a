"""Loss normalization that does not depend on how examples were packed, split into micro-batches or spread over ranks.

A mean over each micro-batch weighs a token by how many other tokens share its micro-batch, so the same global batch
gives another gradient when it is packed, accumulated or sharded differently. The remedy (transformers'
`num_items_in_batch` with `average_tokens_across_devices=True`) is to sum per micro-batch and divide by one count taken
over the whole optimizer step: every accumulation micro-batch on every rank. Two counts are offered:

- `"token"`: every label token weighs the same (transformers' default). Long sequences weigh more.
- `"sequence"`: every sequence weighs the same whatever its length and whatever the packing: each sequence's mean
  token loss, summed, divided by the number of sequences with at least one label token. Needs `seq_idx` from the
  flattened batch; a sequence cut by `overlong="split"` counts as several sequences.

Positions follow the causal-LM shift: logits at position `t` predict `labels[t + 1]`. In a flattened row the first label
of every sequence is -100, so no sequence predicts the next one's first token::

    labels    [-100 a1 a2 | -100 b1]     seq_idx [0 0 0 | 1 1]
    targets        a1 a2    -100 b1      (labels[1:], owned by seq_idx[1:])
"""

from typing import Literal

import torch
import torch.nn.functional as F

from .._conventions import IGNORE_INDEX

Normalization = Literal["token", "sequence"]


def token_loss_terms(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed cross-entropy over label tokens and their count, for one micro-batch.

    Args:
        logits (`torch.Tensor` of shape `(B, T, V)`, float): model outputs.
        labels (`torch.Tensor` of shape `(B, T)`, int64): -100 where a token carries no loss.

    Returns:
        `(loss_sum, num_tokens)`: a float32 scalar (differentiable) and an int64 scalar.
    """
    targets = labels[:, 1:]
    per_token = F.cross_entropy(
        logits[:, :-1].flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
    )
    return per_token, (targets != IGNORE_INDEX).sum()


def sequence_loss_terms(
    logits: torch.Tensor, labels: torch.Tensor, seq_idx: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum over sequences of each sequence's mean token loss, and the number of sequences with a label token.

    Args:
        logits (`torch.Tensor` of shape `(B, T, V)`, float).
        labels (`torch.Tensor` of shape `(B, T)`, int64).
        seq_idx (`torch.Tensor` of shape `(B, T)`, integer): sequence of each token within its row, from the
            flattening collator.

    Returns:
        `(loss_sum, num_sequences)`: a float32 scalar (differentiable) and an int64 scalar.
    """
    targets = labels[:, 1:]
    per_token = F.cross_entropy(
        logits[:, :-1].flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE_INDEX, reduction="none"
    )
    owners = _global_sequence_ids(seq_idx)[:, 1:].flatten()
    counted = targets.flatten() != IGNORE_INDEX
    num_slots = int(owners.max()) + 1 if owners.numel() else 0
    sums = torch.zeros(num_slots, dtype=per_token.dtype, device=per_token.device).index_add(0, owners, per_token)
    counts = torch.bincount(owners[counted], minlength=num_slots)
    present = counts > 0
    return (sums[present] / counts[present]).sum(), present.sum()


def count_items(labels: torch.Tensor, *, normalization: Normalization = "token", seq_idx: torch.Tensor | None = None):
    """What one micro-batch adds to the step's denominator: label tokens, or sequences with a label token.

    Count every micro-batch of the accumulation window before the first forward, then `global_num_items`.

    Args:
        labels (`torch.Tensor` of shape `(B, T)`, int64).
        normalization (`"token"` or `"sequence"`).
        seq_idx (`torch.Tensor` of shape `(B, T)`, integer): required for `"sequence"`.

    Returns:
        int64 scalar tensor.

    >>> count_items(torch.tensor([[-100, 5, 6, -100, 7]]))
    tensor(3)
    >>> count_items(torch.tensor([[-100, 5, 6, -100, -100]]), normalization="sequence",
    ...             seq_idx=torch.tensor([[0, 0, 0, 1, 1]]))
    tensor(1)
    """
    targets = labels[:, 1:]
    if normalization == "token":
        return (targets != IGNORE_INDEX).sum()
    _check_sequence_inputs(normalization, seq_idx, labels)
    owners = _global_sequence_ids(seq_idx)[:, 1:]
    return torch.unique(owners[targets != IGNORE_INDEX]).numel() * torch.ones((), dtype=torch.int64)


def normalized_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    *,
    num_items_in_batch: int | torch.Tensor,
    normalization: Normalization = "token",
    seq_idx: torch.Tensor | None = None,
    world_size: int = 1,
) -> torch.Tensor:
    """This micro-batch's share of the step loss, scaled so data-parallel gradient averaging gives the exact gradient.

    Summed over the micro-batches of an accumulation window on one rank, then averaged over `world_size` ranks (what
    DDP and FSDP do to gradients), the result is `sum(per-item loss) / num_items_in_batch` over the global batch.

    Args:
        logits (`torch.Tensor` of shape `(B, T, V)`, float).
        labels (`torch.Tensor` of shape `(B, T)`, int64).
        num_items_in_batch: the step's count over every micro-batch on every rank (`global_num_items`).
        normalization (`"token"` or `"sequence"`): see the module docstring.
        seq_idx (`torch.Tensor` of shape `(B, T)`, integer): required for `"sequence"`.
        world_size (`int`): number of data-parallel ranks whose gradients are averaged.

    Returns:
        float32 scalar tensor to call `backward` on. `Accelerator.backward` divides by the accelerator's
        `gradient_accumulation_steps`; either keep that at 1 (accumulate with `no_sync`) or multiply by it.
    """
    if normalization == "token":
        loss_sum, _ = token_loss_terms(logits, labels)
    else:
        _check_sequence_inputs(normalization, seq_idx, labels)
        loss_sum, _ = sequence_loss_terms(logits, labels, seq_idx)
    total = int(num_items_in_batch)
    if total <= 0:
        raise ValueError(
            f"`num_items_in_batch` is {total}: no label tokens in this step. Check that labels are not all -100."
        )
    return loss_sum * (world_size / total)


def global_num_items(local: int | torch.Tensor) -> int:
    """Sum of a count over all ranks (`torch.distributed` all-reduce when initialized, else the count itself)."""
    total = torch.as_tensor(local, dtype=torch.int64).reshape(())
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        # The all-reduce runs on the process group's device; gloo takes CPU tensors, nccl needs CUDA.
        device = "cuda" if torch.distributed.get_backend() == "nccl" else "cpu"
        total = total.to(device).clone()
        torch.distributed.all_reduce(total)
    return int(total)


def _global_sequence_ids(seq_idx: torch.Tensor) -> torch.Tensor:
    """`(B, T)` ids, distinct across rows, of the sequence each token belongs to."""
    seq_idx = seq_idx.long()
    per_row = int(seq_idx.max()) + 1 if seq_idx.numel() else 1
    rows = torch.arange(seq_idx.shape[0], device=seq_idx.device).unsqueeze(1)
    return seq_idx + rows * per_row


def _check_sequence_inputs(normalization: str, seq_idx: torch.Tensor | None, labels: torch.Tensor) -> None:
    if normalization != "sequence":
        raise ValueError(f"`normalization` must be 'token' or 'sequence', got {normalization!r}.")
    if seq_idx is None:
        raise ValueError("normalization='sequence' needs `seq_idx` (emitted by DataCollatorWithFlattening).")
    if seq_idx.shape != labels.shape:
        raise ValueError(f"`seq_idx` has shape {tuple(seq_idx.shape)} but `labels` has {tuple(labels.shape)}.")
