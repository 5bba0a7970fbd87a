"""Cross-check the boundary arguments of a flattened batch, and derive the positions a batch left out.

A flattened batch can say where its sequences start in three ways; each consumer reads a different one::

    cu_seq_lens_q/k  [0, 3, 4, 8]              flash-attn, the flatcollate backend
    seq_idx          [[0 0 0 1 2 2 2 2]]       state-space kernels
    position_ids     [[0 1 2 0 0 1 2 3]]       RoPE / learned positions, transformers' mask builders

When they disagree, every layer still runs and the result is silently wrong: with `cu_seq_lens` but arange
positions, learned absolute positions keep counting across sequences and SDPA's mask builder sees one long sequence.
`check_boundaries` refuses any disagreement and returns the batch's one `Boundaries` (with the restarting positions
they imply when `position_ids` are missing). It runs once per forward on the top-level model: one host copy of
`cu_seq_lens_q` (kept as the boundaries' `host` view, which the attention kernels read) and one comparison on the
device.
"""

import numpy as np
import torch

from .._conventions import CU_SEQLENS_DTYPE, FLASH_KWARG_KEYS
from ..boundaries import Boundaries, position_starts
from .prepared_state import FlatBatch

BOUNDARY_KEYS = (*FLASH_KWARG_KEYS, "seq_idx")
"""Arguments that say where a batch's sequences start: their presence makes a batch flattened."""


def token_count(arguments: dict, positions: torch.Tensor | None = None) -> tuple[int, int, torch.device]:
    """`(rows, tokens per row, device)` of the batch, from `input_ids` `(B, T)` or `inputs_embeds` `(B, T, D)`, else
    from its text `positions` `(B, T)`; `ValueError` when it has none of them."""
    for value in (arguments.get("input_ids"), arguments.get("inputs_embeds"), positions):
        if isinstance(value, torch.Tensor) and value.dim() >= 2:
            return value.shape[0], value.shape[1], value.device
    raise ValueError(
        "A flattened batch (it carries `cu_seq_lens_*` or `seq_idx`) needs `input_ids` or `inputs_embeds` of shape "
        "(batch, sequence_length) to check its boundaries against; pass the collator's batch as it is."
    )


_CUT_BATCH = (
    "A batch cut on dimension 0 after the collator looks like this: accelerate's dispatcher does it when "
    "`transformers.Trainer` reads an `IterableDataset` (`dispatch_batches=True`, its default there); pass "
    "`TrainingArguments(accelerator_config={'dispatch_batches': False}, remove_unused_columns=False)`, or train with "
    "`flatcollate.integrations.trl.FlatSFTTrainer`."
)


def first_difference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """`(1,)` int64 on the device: the first token where two start masks differ, or -1 where they agree (no sync)."""
    differ = a != b
    return torch.where(differ.any(), differ.to(torch.int64).argmax(), -1).reshape(1)


def starts_of(cu_seqlens: torch.Tensor, total: int) -> torch.Tensor:
    """`(total,)` bool: True where `cu_seqlens` `(N + 1,)` starts a sequence, computed on the device without a sync
    (indices clamped, so malformed boundaries give a wrong mask, never an error: they are refused on the host)."""
    starts = torch.zeros(total, dtype=torch.bool, device=cu_seqlens.device)
    return starts.index_fill_(0, cu_seqlens[:-1].long().clamp(0, max(total - 1, 0)), True)


def check_cu_seqlens(
    arguments: dict,
    total: int,
    device: torch.device,
    *,
    ranks: int = 1,
    compare: dict[str, torch.Tensor] | None = None,
) -> tuple[Boundaries, dict[str, int]]:
    """The `Boundaries` of `cu_seq_lens_q` after checking it against the batch (`total` tokens on each of `ranks`),
    `cu_seq_lens_k` and `max_length_q/k`, with the first token where each start mask of `compare` (`(T,)` bool, by
    name) disagrees with them (-1 where it agrees): everything read back in one host copy, kept as the boundaries'
    `host` view."""
    cu_q, cu_k = arguments.get("cu_seq_lens_q"), arguments.get("cu_seq_lens_k")
    if cu_q is None:
        cu_q = cu_k
    if cu_q.dim() != 1 or cu_q.dtype.is_floating_point or cu_q.numel() < 2:
        raise ValueError(
            f"`cu_seq_lens_q` must be a 1-D integer tensor `[0, ..., total_tokens]`, got shape {tuple(cu_q.shape)} "
            f"and dtype {cu_q.dtype}; build it with `flatcollate.DataCollatorWithFlattening`. {_CUT_BATCH}"
        )
    separate_k = cu_k is not None and cu_k is not cu_q
    if separate_k and cu_k.shape != cu_q.shape:
        raise ValueError(
            f"`cu_seq_lens_k` {tuple(cu_k.shape)} differs from `cu_seq_lens_q` {tuple(cu_q.shape)}; a flattened "
            "training batch attends within each sequence only, so both must hold the same boundaries."
        )
    # A copy on the device: a buffer the caller refills in place later cannot change this forward's boundaries.
    cu = cu_q.to(device=device, dtype=CU_SEQLENS_DTYPE, copy=True)
    starts = starts_of(cu, total * ranks)
    compare = compare or {}
    parts = [cu.long(), *([cu_k.to(device).long()] if separate_k else [])]
    parts += [first_difference(mask.to(device), starts) for mask in compare.values()]
    values = Boundaries.copy_to_host(torch.cat(parts))  # the one host copy of this forward's boundaries
    count = cu_q.numel()
    bounds = values[:count]
    firsts = dict(zip(compare, values[len(values) - len(compare) :], strict=True))
    if bounds[0] != 0 or bounds[-1] != total * ranks:
        on_ranks = f" on each of {ranks} ranks" if ranks > 1 else ""
        raise ValueError(
            f"`cu_seq_lens_q` starts at {bounds[0]} and ends at {bounds[-1]}, but the batch holds {total} tokens"
            f"{on_ranks}; it must run from 0 to the number of tokens. Collate the batch and its boundaries together. "
            f"{_CUT_BATCH}"
        )
    lengths = np.diff(bounds)
    if lengths.min() < 1:
        raise ValueError(
            f"`cu_seq_lens_q` must be strictly increasing (every sequence at least one token), got {bounds[:12]}."
        )
    if separate_k and values[count : 2 * count] != bounds:
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
    given = arguments.get("max_length_q") or arguments.get("max_length_k")
    boundaries = Boundaries(cu, longest if given is None else int(given), bounds[-1]).with_host(bounds)
    boundaries.view("starts", lambda _: starts)
    return boundaries, firsts


def check_boundaries(
    arguments: dict, positions: torch.Tensor | None, *, restarting: Boundaries | None = None
) -> FlatBatch:
    """The `Boundaries` of a flattened batch, after refusing boundary arguments that disagree, and its positions.

    Args:
        arguments (`dict`): the forward's arguments; reads `input_ids` / `inputs_embeds`, `cu_seq_lens_q/k`,
            `max_length_q/k` and `seq_idx` `(B, T)`.
        positions (`torch.Tensor` of shape `(B, T)`, *optional*): the batch's text positions.
        restarting (`Boundaries`, *optional*): the boundaries of `positions`, where the caller read them already.

    Returns:
        `FlatBatch`: the boundaries, and the positions (restarting at 0 at every boundary, `derived`, when the batch
        has none).

    Raises:
        `ValueError` naming the argument that disagrees and the first token where it does.

    With `cu_seq_lens`, every check reads back in one host copy (`check_cu_seqlens`); from restarting positions or
    `seq_idx` alone, the boundaries take one `nonzero` and one copy.
    """
    rows, length, device = token_count(arguments, positions)
    total = rows * length
    seq_idx = arguments.get("seq_idx")
    cu_given = arguments.get("cu_seq_lens_q") is not None or arguments.get("cu_seq_lens_k") is not None
    if seq_idx is not None and seq_idx.numel() != total and not cu_given:
        raise ValueError(f"`seq_idx` has {seq_idx.numel()} entries but the batch holds {total} tokens.")
    fits = positions is None or (positions.dim() <= 2 and positions.numel() == total)
    if not cu_given:
        _refuse_shape(fits, positions, rows, length, "the boundaries")
        if seq_idx is None:  # restarting positions are the batch's only boundaries
            if restarting is None:
                restarting = Boundaries.from_position_ids(positions.to(device))
            return FlatBatch(restarting, positions)
        boundaries = Boundaries.from_seq_idx(seq_idx.to(device))
        if positions is None:
            return FlatBatch(boundaries, boundaries.position_ids().reshape(rows, length), derived=True)
        token = int(first_difference(position_starts(positions.to(device)), boundaries.starts))  # a second sync
        refuse_other_starts(token, boundaries.starts, "seq_idx")
        return FlatBatch(boundaries, positions)
    compare = {}
    if seq_idx is not None and seq_idx.numel() == total:
        compare["seq_idx"] = position_starts(seq_idx.to(device), step=0)
    if positions is not None and fits:
        compare["position_ids"] = position_starts(positions.to(device))
    boundaries, firsts = check_cu_seqlens(arguments, total, device, compare=compare)
    if seq_idx is not None and seq_idx.numel() != total:  # after the boundaries' own checks, which name more
        raise ValueError(f"`seq_idx` has {seq_idx.numel()} entries but the batch holds {total} tokens.")
    if firsts.get("seq_idx", -1) >= 0:
        raise ValueError(
            f"`seq_idx` and `cu_seq_lens_q` disagree on where sequences start (first at token {firsts['seq_idx']}); "
            "collate the batch with `flatcollate.DataCollatorWithFlattening`, which derives both from the same "
            "lengths."
        )
    if positions is None:
        return FlatBatch(boundaries, boundaries.position_ids().reshape(rows, length), derived=True)
    _refuse_shape(fits, positions, rows, length, "`cu_seq_lens_q`")
    refuse_other_starts(firsts["position_ids"], boundaries.starts, "cu_seq_lens_q")
    return FlatBatch(boundaries, positions)


def _refuse_shape(fits: bool, positions: torch.Tensor, rows: int, length: int, source: str) -> None:
    if not fits:
        raise ValueError(
            f"`position_ids` of shape {tuple(positions.shape)} cannot be checked against {source} for a batch of "
            f"{rows} x {length} tokens: flattened batches take text positions of shape (batch, sequence_length)."
        )


def refuse_other_starts(token: int, starts: torch.Tensor, source: str) -> None:
    """Raise where positions restart at other tokens than the boundaries start sequences: `token` is the first
    token where they differ (`first_difference`), -1 where they agree; `starts` `(T,)` the boundaries' starts."""
    if token >= 0:
        happens = "a sequence starts there but the positions go on" if starts[token] else "they restart inside one"
        raise ValueError(
            f"`position_ids` do not restart where `{source}` starts sequences (first at token {token}: {happens}). "
            "Sequences would share positions or attention. Let the collator emit positions "
            "(`DataCollatorWithFlattening(return_position_ids=True)`) or leave `position_ids` out, and flatcollate "
            "derives them from the boundaries."
        )


def packed_under_mask(positions: torch.Tensor, mask: torch.Tensor) -> bool:
    """Whether a row with a 2-D `attention_mask` `(B, T)` holds packed sequences: positions `(B, T)` restart between
    two attended tokens, or an integer mask of sequence ids changes id between them. Left padding (positions
    restarting only where the mask goes from 0 to 1) is not packing.

    >>> packed_under_mask(torch.tensor([[0, 1, 0, 1]]), torch.tensor([[1, 1, 1, 1]]))
    True
    >>> packed_under_mask(torch.tensor([[1, 1, 0, 1]]), torch.tensor([[0, 0, 1, 1]]))  # left padding
    False
    """
    rows, length = positions.shape
    restarts = position_starts(positions).reshape(rows, length)[:, 1:]
    attended = mask != 0
    inside = attended[:, 1:] & attended[:, :-1]
    return bool((inside & (restarts | (mask[:, 1:] != mask[:, :-1]))).any())


def check_mask(positions: torch.Tensor, mask: torch.Tensor) -> None:
    """Refuse a 2-D `attention_mask` `(B, T)` whose zeros or ids do not say where a packed row's sequences are.

    Mask zeros are padding when they lie before, between or after sequences: the first attended token after them
    starts a sequence (its position does not continue the last attended token's). An integer mask of sequence ids
    (1, 1, 2, 2, 2, 0 ...) must change id exactly where positions restart. Anything else (zeros inside a sequence,
    ids and positions that disagree) is ambiguous: `ValueError` naming the row and token.
    """
    if mask.dtype.is_floating_point or mask.dtype.is_complex:
        if not bool(((mask == 0) | (mask == 1)).all()):
            raise ValueError(
                "`attention_mask` of a flattened row must hold 0/1 or integer sequence ids, got non-integer values; "
                "pass a 2-D integer mask or none (the flattening collators emit none)."
            )
        mask = mask.long()
    rows, length = positions.shape
    attended = mask != 0
    index = torch.arange(length, device=mask.device).expand(rows, length)
    last = torch.cummax(torch.where(attended, index, -1), dim=1).values[:, :-1]  # last attended token before t
    opens = attended[:, 1:] & ~attended[:, :-1] & (last >= 0)
    before = positions.gather(1, last.clamp(min=0))
    after = positions[:, 1:]
    continues = (after == before + 1) | (after == before + (index[:, 1:] - last))
    problem = _first_true(opens & continues)
    if problem is not None:
        row, token = problem
        raise ValueError(
            f"`attention_mask` has zeros inside a sequence of this flattened batch (row {row}, token {token}): the "
            "positions go on through them, so they are neither padding between sequences nor a boundary. Put padding "
            "only before, between or after sequences (positions restarting after it), or pass no mask: the "
            "flattening collators need none."
        )
    if mask.max() <= 1:
        return
    inside = attended[:, 1:] & attended[:, :-1]
    restarts = position_starts(positions).reshape(rows, length)[:, 1:]
    problem = _first_true(inside & (restarts != (mask[:, 1:] != mask[:, :-1])))
    if problem is not None:
        row, token = problem
        raise ValueError(
            f"`attention_mask` holds sequence ids that change where `position_ids` do not restart, or the reverse "
            f"(row {row}, token {token}); the batch does not say where that sequence starts. Number positions from 0 "
            "in every sequence, as `flatcollate.DataCollatorWithFlattening` does."
        )


def _first_true(found: torch.Tensor) -> tuple[int, int] | None:
    """`(row, token)` of the first True of `(B, T - 1)` pairs `(t - 1, t)`, as token `t`; None when none (one sync)."""
    hits = torch.nonzero(found)
    return (int(hits[0, 0]), int(hits[0, 1]) + 1) if hits.numel() else None
