"""Boundaries of a flattened row as torch tensors, read from the collator's kwargs or derived once from positions.

A flattened row of three sequences, and what attention sees::

    position_ids   [0 1 2 | 0 | 0 1 2 3]
    cu_seqlens     [0, 3, 4, 8]            (N + 1,) int32
    max_length     4                       Python int

    allowed keys (causal, never across `|`)
         k: 0 1 2 3 4 5 6 7
    q 0     x
    q 1     x x
    q 2     x x x
    q 3           x
    q 4             x
    q 5             x x
    q 6             x x x
    q 7             x x x x

The collator's `cu_seq_lens_q/k` and `max_length_q/k` are used as they are: no recomputation and no host sync per
layer. Without them, boundaries come from `position_ids` (a sequence starts wherever the position does not grow by
one, the rule of transformers' mask builders) and are cached on the identity and version of that tensor, so every
layer of one forward reuses the first layer's result.
"""

from dataclasses import dataclass

import torch

from .._conventions import CU_SEQLENS_DTYPE


@dataclass(frozen=True)
class PackedSegments:
    """Where the sequences of a flattened row start and end.

    Args:
        cu_seqlens (`torch.Tensor` of shape `(N + 1,)`, int32): cumulative lengths with a leading zero, on the device
            of the attention inputs.
        max_length (`int`): longest sequence.
    """

    cu_seqlens: torch.Tensor
    max_length: int


# One-entry caches: all layers of a forward pass see the same `position_ids` / `cu_seq_lens` tensor objects. The
# cache holds the tensor itself, so a hit needs the very same object, unmodified since (`_version`).
_DERIVED: dict[str, tuple[torch.Tensor, int, PackedSegments]] = {}
_HOST: dict[str, tuple[torch.Tensor, int, list[int]]] = {}
_CHUNKED: dict[str, tuple[torch.Tensor, int, PackedSegments]] = {}


def _cached(cache: dict, tensor: torch.Tensor):
    entry = cache.get("last")
    if entry is not None and entry[0] is tensor and entry[1] == tensor._version:
        return entry[2]
    return None


def position_starts(position_ids: torch.Tensor) -> torch.Tensor:
    """`(B * T,)` bool: True where a sequence starts, i.e. the position does not grow by one (the rule of
    transformers' mask builders), and at every row start.

    >>> position_starts(torch.tensor([[0, 1, 2, 0, 0, 1]])).tolist()
    [True, False, False, True, True, False]
    """
    rows = position_ids.reshape(-1, position_ids.shape[-1])
    starts = torch.ones_like(rows, dtype=torch.bool)
    starts[:, 1:] = rows[:, 1:] - rows[:, :-1] != 1
    return starts.reshape(-1)


def seq_idx_starts(seq_idx: torch.Tensor) -> torch.Tensor:
    """`(B * T,)` bool: True where a token's `seq_idx` differs from its left neighbour's, and at every row start.

    >>> seq_idx_starts(torch.tensor([[0, 0, 0, 1, 2, 2]])).tolist()
    [True, False, False, True, True, False]
    """
    rows = seq_idx.reshape(-1, seq_idx.shape[-1])
    starts = torch.ones_like(rows, dtype=torch.bool)
    starts[:, 1:] = rows[:, 1:] != rows[:, :-1]
    return starts.reshape(-1)


def segments_from_position_ids(position_ids: torch.Tensor) -> PackedSegments:
    """Boundaries from restarting positions, computed once per tensor (one host sync for `max_length`).

    Args:
        position_ids (`torch.Tensor` of shape `(B, T)` or `(T,)`, integer): rows are read back to back, so a row of
            a batch of several rows always starts a new sequence.

    Returns:
        `PackedSegments` over the `B * T` flattened tokens.

    >>> segments_from_position_ids(torch.tensor([[0, 1, 2, 0, 0, 1, 2, 3]])).cu_seqlens.tolist()
    [0, 3, 4, 8]
    """
    cached = _cached(_DERIVED, position_ids)
    if cached is not None:
        return cached
    segments = _segments_from_starts(position_starts(position_ids))
    _DERIVED["last"] = (position_ids, position_ids._version, segments)
    return segments


def _segments_from_starts(starts: torch.Tensor) -> PackedSegments:
    """Boundaries of `(B * T,)` bool sequence starts (one host sync for `max_length`)."""
    flat_starts = torch.nonzero(starts).reshape(-1)
    total = torch.tensor([starts.numel()], device=starts.device, dtype=flat_starts.dtype)
    cu_seqlens = torch.cat([flat_starts, total]).to(CU_SEQLENS_DTYPE)
    return PackedSegments(cu_seqlens=cu_seqlens, max_length=int(cu_seqlens.diff().max()))


def _repeat_rows(segments: PackedSegments, rows: int, length: int) -> PackedSegments:
    """The boundaries of one row of `length` tokens, repeated for `rows` rows read back to back (no host sync)."""
    starts = segments.cu_seqlens[:-1].long()
    offsets = torch.arange(rows, device=starts.device)[:, None] * length
    total = torch.tensor([rows * length], device=starts.device)
    cu_seqlens = torch.cat([(starts[None] + offsets).reshape(-1), total]).to(CU_SEQLENS_DTYPE)
    return PackedSegments(cu_seqlens=cu_seqlens, max_length=segments.max_length)


def segments_from_kwargs(kwargs: dict, *, total_tokens: int) -> PackedSegments:
    """The collator's boundaries if present, else boundaries derived from `position_ids`.

    Args:
        kwargs (`dict`): the keyword arguments an attention function receives; reads `cu_seq_lens_q`,
            `cu_seq_lens_k`, `max_length_q`, `max_length_k` and `position_ids`.
        total_tokens (`int`): number of tokens of the flattened attention inputs (`B * T`).

    Raises:
        `ValueError` when neither boundaries nor `position_ids` are given (`with_row_boundaries` adds them), or when
        query and key boundaries differ.
    """
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if cu_q is not None:
        if cu_k is not None and cu_k is not cu_q and cu_k.shape != cu_q.shape:
            raise ValueError(
                f"`cu_seq_lens_q` {tuple(cu_q.shape)} and `cu_seq_lens_k` {tuple(cu_k.shape)} differ; the flatcollate "
                "backend runs self-attention over one flattened row, so pass the same boundaries for both."
            )
        max_length = kwargs.get("max_length_q") or kwargs.get("max_length_k")
        if max_length is None:
            max_length = int(cu_q.diff().max())
        return PackedSegments(cu_seqlens=cu_q.to(CU_SEQLENS_DTYPE), max_length=int(max_length))
    position_ids = kwargs.get("position_ids")
    if position_ids is None:
        raise ValueError(
            "The flatcollate attention backend needs sequence boundaries: pass `cu_seq_lens_q/k` and "
            "`max_length_q/k` (as `flatcollate.DataCollatorWithFlattening` emits) or restarting `position_ids`."
        )
    rows = total_tokens // max(position_ids.shape[-1], 1)
    shared = position_ids.dim() == 2 and position_ids.shape[0] == 1 and rows > 1
    if shared and position_ids.numel() * rows == total_tokens:
        # Models build `(1, T)` positions for a batch of ordinary rows: every row has the same boundaries.
        return _repeat_rows(segments_from_position_ids(position_ids), rows, position_ids.shape[-1])
    if position_ids.numel() != total_tokens:
        raise ValueError(
            f"`position_ids` has {position_ids.numel()} entries but the attention inputs hold {total_tokens} tokens; "
            "pass position ids of shape (batch, sequence_length), one per token (text models only)."
        )
    return segments_from_position_ids(position_ids)


def with_row_boundaries(kwargs: dict, *, rows: int, length: int, device: torch.device) -> dict:
    """`kwargs` with `cu_seq_lens_q/k` and `max_length_q/k` added where they carry neither boundaries nor positions.

    Attention layers of families that consume `position_ids` in their embeddings (BERT, RoBERTa) see none. A
    flattened batch reaches them with `cu_seq_lens` (the guard adds them) or `seq_idx`, whose boundaries are used;
    a call with none of these is ordinary rows, one sequence each::

        rows 2, length 4, no boundaries   ->   cu_seq_lens [0, 4, 8], max_length 4

    Args:
        kwargs (`dict`): the attention function's keyword arguments.
        rows, length (`int`): `B` and `T` of the attention inputs.
        device (`torch.device`): where the attention inputs are.
    """
    if kwargs.get("cu_seq_lens_q") is not None or kwargs.get("cu_seq_lens_k") is not None:
        return kwargs
    if kwargs.get("position_ids") is not None:
        return kwargs
    seq_idx = kwargs.get("seq_idx")
    if seq_idx is not None:
        segments = _segments_from_starts(seq_idx_starts(seq_idx).to(device))
    else:
        cu_seqlens = torch.arange(0, rows * length + 1, length, dtype=CU_SEQLENS_DTYPE, device=device)
        segments = PackedSegments(cu_seqlens=cu_seqlens, max_length=length)
    cu = segments.cu_seqlens
    return {
        **kwargs,
        "cu_seq_lens_q": cu,
        "cu_seq_lens_k": cu,
        "max_length_q": segments.max_length,
        "max_length_k": segments.max_length,
    }


def host_boundaries(cu_seqlens: torch.Tensor) -> list[int]:
    """`cu_seqlens` as Python ints, copied to the host once per tensor (paths that slice per sequence need them)."""
    cached = _cached(_HOST, cu_seqlens)
    if cached is not None:
        return cached
    bounds = cu_seqlens.tolist()
    _HOST["last"] = (cu_seqlens, cu_seqlens._version, bounds)
    return bounds


def split_into_chunks(segments: PackedSegments, chunk: int) -> PackedSegments:
    """Chunked attention as plain causal attention over finer segments: each sequence cut every `chunk` tokens.

    In a chunked-attention layer (Llama 4) a token sees the earlier tokens of its own chunk only, chunks counted from
    the start of its sequence; that is exactly causal attention with every chunk as a sequence of its own::

        cu_seqlens  [0, 5, 8]       chunk 2   ->   [0, 2, 4, 5, 7, 8]

    Cached like the other derived boundaries (one computation per boundaries tensor and chunk size).

    >>> split_into_chunks(PackedSegments(torch.tensor([0, 5, 8], dtype=torch.int32), 5), 2).cu_seqlens.tolist()
    [0, 2, 4, 5, 7, 8]
    """
    key = str(chunk)
    entry = _CHUNKED.get(key)
    if entry is not None and entry[0] is segments.cu_seqlens and entry[1] == segments.cu_seqlens._version:
        return entry[2]
    cu = segments.cu_seqlens.long()
    lengths = cu.diff()
    counts = (lengths + chunk - 1) // chunk
    first_piece = torch.cumsum(counts, 0) - counts
    sequence = torch.repeat_interleave(torch.arange(len(lengths), device=cu.device), counts)
    rank = torch.arange(len(sequence), device=cu.device) - first_piece[sequence]
    starts = cu[:-1][sequence] + rank * chunk
    chunked = PackedSegments(
        cu_seqlens=torch.cat([starts, cu[-1:]]).to(CU_SEQLENS_DTYPE), max_length=min(segments.max_length, chunk)
    )
    _CHUNKED[key] = (segments.cu_seqlens, segments.cu_seqlens._version, chunked)
    return chunked
