"""Cross-check the boundary arguments of a flattened batch, and derive the positions a batch left out.

A flattened batch can say where its sequences start in three ways; each consumer reads a different one::

    cu_seq_lens_q/k  [0, 3, 4, 8]              flash-attn, the flatcollate backend
    seq_idx          [[0 0 0 1 2 2 2 2]]       state-space kernels
    position_ids     [[0 1 2 0 0 1 2 3]]       RoPE / learned positions, transformers' mask builders

When they disagree, every layer still runs and the result is silently wrong: with `cu_seq_lens` but arange
positions, learned absolute positions keep counting across sequences and SDPA's mask builder sees one long sequence.
`check_boundaries` refuses any disagreement and, when `position_ids` are missing, returns the restarting positions
that the boundaries imply. It runs once per forward on the top-level model: one host copy of `cu_seq_lens_q`
(cached for the attention kernels, `host_boundaries`) and one comparison on the device.
"""

import numpy as np
import torch

from .._conventions import IDS_DTYPE
from ..attention.packed_segments import host_boundaries, position_starts, seq_idx_starts

BOUNDARY_KEYS = ("cu_seq_lens_q", "cu_seq_lens_k", "seq_idx")
"""Arguments whose presence makes the guard check the batch's boundaries."""


def _token_count(arguments: dict) -> tuple[int, int, torch.device] | None:
    """`(rows, tokens per row, device)` of the batch, from `input_ids` `(B, T)` or `inputs_embeds` `(B, T, D)`."""
    for key in ("input_ids", "inputs_embeds"):
        value = arguments.get(key)
        if isinstance(value, torch.Tensor) and value.dim() >= 2:
            return value.shape[0], value.shape[1], value.device
    return None


def _starts_from_cu(bounds: list[int], total: int, device: torch.device) -> torch.Tensor:
    starts = torch.zeros(total, dtype=torch.bool, device=device)
    starts[torch.tensor(bounds[:-1], device=device)] = True
    return starts


def _first_difference(a: torch.Tensor, b: torch.Tensor) -> int | None:
    """Index of the first token where two start masks differ, or None when they agree (one host sync)."""
    differ = torch.nonzero(a != b)
    return int(differ[0, 0]) if differ.numel() else None


def _check_cu_seqlens(arguments: dict, total: int, *, ranks: int = 1) -> list[int]:
    """`cu_seq_lens_q` as Python ints after checking it against the batch (`total` tokens on each of `ranks`),
    `cu_seq_lens_k` and `max_length_q/k`."""
    cu_q, cu_k = arguments.get("cu_seq_lens_q"), arguments.get("cu_seq_lens_k")
    if cu_q is None:
        cu_q = cu_k
    if cu_q.dim() != 1 or cu_q.dtype.is_floating_point or cu_q.numel() < 2:
        raise ValueError(
            f"`cu_seq_lens_q` must be a 1-D integer tensor `[0, ..., total_tokens]`, got shape {tuple(cu_q.shape)} "
            f"and dtype {cu_q.dtype}; build it with `flatcollate.DataCollatorWithFlattening`."
        )
    bounds = host_boundaries(cu_q)
    if bounds[0] != 0 or bounds[-1] != total * ranks:
        on_ranks = f" on each of {ranks} ranks" if ranks > 1 else ""
        raise ValueError(
            f"`cu_seq_lens_q` starts at {bounds[0]} and ends at {bounds[-1]}, but the batch holds {total} tokens"
            f"{on_ranks}; it must run from 0 to the number of tokens. Collate the batch and its boundaries together."
        )
    lengths = np.diff(bounds)
    if lengths.min() < 1:
        raise ValueError(
            f"`cu_seq_lens_q` must be strictly increasing (every sequence at least one token), got {bounds[:12]}."
        )
    if cu_k is not None and cu_k is not cu_q and (cu_k.shape != cu_q.shape or not torch.equal(cu_k.cpu(), cu_q.cpu())):
        raise ValueError(
            "`cu_seq_lens_k` differs from `cu_seq_lens_q`; a flattened training batch attends within each sequence "
            "only, so both must hold the same boundaries."
        )
    longest = int(lengths.max())
    for key in ("max_length_q", "max_length_k"):
        value = arguments.get(key)
        if value is not None and int(value) < longest:
            raise ValueError(
                f"`{key}` is {int(value)} but the longest sequence of `cu_seq_lens_q` has {longest} tokens; kernels "
                f"would read past it. Pass `{key}={longest}` (the collator computes it)."
            )
    return bounds


def check_boundaries(arguments: dict, *, shard: tuple[int, int] | None = None) -> torch.Tensor | None:
    """Refuse boundary arguments that disagree; return restarting `position_ids` when the batch has none.

    Args:
        arguments (`dict`): the forward's arguments; reads `input_ids` / `inputs_embeds`, `cu_seq_lens_q/k`,
            `max_length_q/k`, `seq_idx` `(B, T)` and `position_ids` `(B, T)`.
        shard (`tuple[int, int]`, *optional*): `(rank, size)` of a sequence-parallel group: the batch is slice
            `rank` of a row split into `size` equal slices, and `cu_seq_lens_q/k` are the whole row's.

    Returns:
        `torch.Tensor` of shape `(B, T)`, int64: positions restarting at 0 at every boundary, to pass to the model
        because `position_ids` is missing; None when the batch already has them (checked) or has no boundaries.

    Raises:
        `ValueError` naming the argument that disagrees and the first token where it does.
    """
    shape = _token_count(arguments)
    if shape is None or not any(arguments.get(key) is not None for key in BOUNDARY_KEYS):
        return None
    rows, length, device = shape
    if shard is not None:
        return _check_slice(arguments, length, device, shard, rows=rows)
    total = rows * length
    starts, source = None, None
    if arguments.get("cu_seq_lens_q") is not None or arguments.get("cu_seq_lens_k") is not None:
        starts, source = _starts_from_cu(_check_cu_seqlens(arguments, total), total, device), "cu_seq_lens_q"
    seq_idx = arguments.get("seq_idx")
    if seq_idx is not None:
        if seq_idx.numel() != total:
            raise ValueError(f"`seq_idx` has {seq_idx.numel()} entries but the batch holds {total} tokens.")
        from_seq_idx = seq_idx_starts(seq_idx.to(device))
        if starts is None:
            starts, source = from_seq_idx, "seq_idx"
        elif (token := _first_difference(from_seq_idx, starts)) is not None:
            raise ValueError(
                f"`seq_idx` and `cu_seq_lens_q` disagree on where sequences start (first at token {token}); collate "
                "the batch with `flatcollate.DataCollatorWithFlattening`, which derives both from the same lengths."
            )
    position_ids = arguments.get("position_ids")
    if position_ids is None:
        # Positions restart at 0 at every start: token index minus the index of its sequence's first token.
        index = torch.arange(total, device=device)
        first = torch.cummax(torch.where(starts, index, torch.zeros_like(index)), dim=0).values
        return (index - first).to(IDS_DTYPE).reshape(rows, length)
    if position_ids.dim() > 2 or position_ids.numel() != total:
        raise ValueError(
            f"`position_ids` of shape {tuple(position_ids.shape)} cannot be checked against `{source}` for a batch "
            f"of {rows} x {length} tokens: flattened batches take text positions of shape (batch, sequence_length)."
        )
    _refuse_other_starts(position_starts(position_ids.to(device)), starts, source)
    return None


def _refuse_other_starts(observed: torch.Tensor, starts: torch.Tensor, source: str) -> None:
    """Raise where positions restart (`observed`) at other tokens than the boundaries start sequences (`starts`)."""
    token = _first_difference(observed, starts)
    if token is not None:
        happens = "a sequence starts there but the positions go on" if starts[token] else "they restart inside one"
        raise ValueError(
            f"`position_ids` do not restart where `{source}` starts sequences (first at token {token}: {happens}). "
            "Sequences would share positions or attention. Let the collator emit positions "
            "(`DataCollatorWithFlattening(return_position_ids=True)`) or leave `position_ids` out, and flatcollate "
            "derives them from the boundaries."
        )


def _check_slice(
    arguments: dict, length: int, device: torch.device, shard: tuple[int, int], *, rows: int
) -> torch.Tensor | None:
    """`check_boundaries` for slice `rank` of `size` (sequence parallelism): this rank's `length` positions against
    the whole row's `cu_seq_lens_q` cut to the same tokens.

    The slice's first token is a start in the slice's own positions; inside a sequence of the row it must continue
    that sequence instead: its position is at least its offset in the sequence (positions count up from a start of
    0 or more), which positions restarted per slice are not.
    """
    rank, size = shard
    if rows != 1 or arguments.get("seq_idx") is not None:
        raise ValueError(
            f"A sequence-parallel batch is one row per rank with `cu_seq_lens_q/k` and no `seq_idx`; got {rows} rows"
            f"{' and `seq_idx`' if arguments.get('seq_idx') is not None else ''}. Split rows with "
            "`flatcollate.parallel.split_for_sequence_parallel`."
        )
    bounds = _check_cu_seqlens(arguments, length, ranks=size)
    index = torch.arange(length * size, device=device)
    row_starts = _starts_from_cu(bounds, length * size, device)
    first = torch.cummax(torch.where(row_starts, index, torch.zeros_like(index)), dim=0).values
    part = slice(rank * length, (rank + 1) * length)
    offsets, starts = (index - first)[part], row_starts[part]
    position_ids = arguments.get("position_ids")
    if position_ids is None:
        return offsets.to(IDS_DTYPE).reshape(1, length)
    if position_ids.numel() != length:
        raise ValueError(
            f"`position_ids` of shape {tuple(position_ids.shape)} do not match this rank's {length} tokens; pass the "
            "positions of `split_for_sequence_parallel` (this rank's slice, shape (1, T / size))."
        )
    observed = position_starts(position_ids.to(device))
    observed[0] = starts[0] | (position_ids.reshape(-1)[0].to(device) < offsets[0])
    _refuse_other_starts(observed, starts, "cu_seq_lens_q")
    return None
