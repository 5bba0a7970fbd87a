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


def _first_difference(a: torch.Tensor, b: torch.Tensor) -> int | None:
    """Index of the first token where two start masks differ, or None when they agree (one host sync)."""
    differ = torch.nonzero(a != b)
    return int(differ[0, 0]) if differ.numel() else None


def check_cu_seqlens(arguments: dict, total: int, device: torch.device, *, ranks: int = 1) -> Boundaries:
    """The `Boundaries` of `cu_seq_lens_q` after checking it against the batch (`total` tokens on each of `ranks`),
    `cu_seq_lens_k` and `max_length_q/k`: one host copy, kept as the boundaries' `host` view."""
    cu_q, cu_k = arguments.get("cu_seq_lens_q"), arguments.get("cu_seq_lens_k")
    if cu_q is None:
        cu_q = cu_k
    if cu_q.dim() != 1 or cu_q.dtype.is_floating_point or cu_q.numel() < 2:
        raise ValueError(
            f"`cu_seq_lens_q` must be a 1-D integer tensor `[0, ..., total_tokens]`, got shape {tuple(cu_q.shape)} "
            f"and dtype {cu_q.dtype}; build it with `flatcollate.DataCollatorWithFlattening`."
        )
    bounds = cu_q.tolist()
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
    given = arguments.get("max_length_q") or arguments.get("max_length_k")
    cu = cu_q.to(device=device, dtype=CU_SEQLENS_DTYPE)
    boundaries = Boundaries(cu, longest if given is None else int(given), bounds[-1])
    boundaries.view("host", lambda _: bounds)  # the one host copy of this forward
    return boundaries


def check_boundaries(arguments: dict, positions: torch.Tensor | None) -> FlatBatch:
    """The `Boundaries` of a flattened batch, after refusing boundary arguments that disagree, and its positions.

    Args:
        arguments (`dict`): the forward's arguments; reads `input_ids` / `inputs_embeds`, `cu_seq_lens_q/k`,
            `max_length_q/k` and `seq_idx` `(B, T)`.
        positions (`torch.Tensor` of shape `(B, T)`, *optional*): the batch's text positions.

    Returns:
        `FlatBatch`: the boundaries, and the positions (restarting at 0 at every boundary, `derived`, when the batch
        has none).

    Raises:
        `ValueError` naming the argument that disagrees and the first token where it does.
    """
    rows, length, device = token_count(arguments, positions)
    total = rows * length
    boundaries, source = None, None
    if arguments.get("cu_seq_lens_q") is not None or arguments.get("cu_seq_lens_k") is not None:
        boundaries, source = check_cu_seqlens(arguments, total, device), "cu_seq_lens_q"
    seq_idx = arguments.get("seq_idx")
    if seq_idx is not None:
        if seq_idx.numel() != total:
            raise ValueError(f"`seq_idx` has {seq_idx.numel()} entries but the batch holds {total} tokens.")
        if boundaries is None:
            boundaries, source = Boundaries.from_seq_idx(seq_idx.to(device)), "seq_idx"
        elif (token := _first_difference(position_starts(seq_idx.to(device), step=0), boundaries.starts)) is not None:
            raise ValueError(
                f"`seq_idx` and `cu_seq_lens_q` disagree on where sequences start (first at token {token}); collate "
                "the batch with `flatcollate.DataCollatorWithFlattening`, which derives both from the same lengths."
            )
    if boundaries is None:  # restarting positions are the batch's only boundaries
        return FlatBatch(Boundaries.from_position_ids(positions.to(device)), positions)
    if positions is None:
        return FlatBatch(boundaries, boundaries.position_ids().reshape(rows, length), derived=True)
    if positions.dim() > 2 or positions.numel() != total:
        raise ValueError(
            f"`position_ids` of shape {tuple(positions.shape)} cannot be checked against `{source}` for a batch "
            f"of {rows} x {length} tokens: flattened batches take text positions of shape (batch, sequence_length)."
        )
    refuse_other_starts(position_starts(positions.to(device)), boundaries.starts, source)
    return FlatBatch(boundaries, positions)


def refuse_other_starts(observed: torch.Tensor, starts: torch.Tensor, source: str) -> None:
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
