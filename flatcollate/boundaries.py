"""Where the sequences of a flattened row start: one type, `Boundaries`, and the pure functions it is made of.

A flattened row holds N sequences back to back. Everything that tells a model where sequences start derives from
their lengths::

    lengths        [3, 1, 4]
    cu_seqlens     [0, 3, 4, 8]                 (N + 1,) int32
    max_length     4                            Python int
    position_ids   [0 1 2 | 0 | 0 1 2 3]        (T,) int64, restarting at every boundary
    seq_idx        [0 0 0 | 1 | 2 2 2 2]        (T,) int32
    attention      causal inside each sequence, never across `|`

The numpy functions are the collators' edge. `Boundaries` is what a model's forward runs with: built once per forward
by the guard and handed to every layer in the forward's keyword arguments (`BOUNDARIES_KEY`), or, for layers that
take none, in `flatcollate.forward_slot`; its views are computed once. No loop over tokens: `cumsum`, `repeat`, `diff`.
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ._conventions import (
    BOUNDARIES_KEY,
    CU_SEQLENS_DTYPE,
    FLASH_KWARG_KEYS,
    IDS_DTYPE,
    IGNORE_INDEX,
    NP_CU_SEQLENS_DTYPE,
    NP_IDS_DTYPE,
)


def lengths_to_cu_seqlens(lengths: np.ndarray) -> np.ndarray:
    """`(N + 1,)` int32 cumulative lengths with a leading zero, from `(N,)` integer lengths.

    >>> lengths_to_cu_seqlens(np.array([3, 1, 4])).tolist()
    [0, 3, 4, 8]
    """
    cu = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=cu[1:])
    if cu[-1] > np.iinfo(NP_CU_SEQLENS_DTYPE).max:
        raise ValueError(f"A flattened row of {cu[-1]} tokens does not fit int32 `cu_seq_lens`; use smaller batches.")
    return cu.astype(NP_CU_SEQLENS_DTYPE)


def cu_seqlens_to_position_ids(cu_seqlens: np.ndarray, start: int = 0) -> np.ndarray:
    """`(T,)` int64 positions restarting at `start` at every boundary of `cu_seqlens` `(N + 1,)`.

    >>> cu_seqlens_to_position_ids(np.array([0, 3, 4, 8])).tolist()
    [0, 1, 2, 0, 0, 1, 2, 3]
    """
    cu = np.asarray(cu_seqlens, dtype=NP_IDS_DTYPE)
    # Each token's position is its flat index minus the start offset of its own sequence.
    return np.arange(int(cu[-1]), dtype=NP_IDS_DTYPE) - np.repeat(cu[:-1], np.diff(cu)) + start


def cu_seqlens_to_seq_idx(cu_seqlens: np.ndarray) -> np.ndarray:
    """`(T,)` int32: the index of the sequence each token belongs to.

    >>> cu_seqlens_to_seq_idx(np.array([0, 3, 4, 8])).tolist()
    [0, 0, 0, 1, 2, 2, 2, 2]
    """
    cu = np.asarray(cu_seqlens)
    return np.repeat(np.arange(len(cu) - 1, dtype=NP_CU_SEQLENS_DTYPE), np.diff(cu))


def sequence_starts(cu_seqlens: np.ndarray) -> np.ndarray:
    """Flat index of the first token of every non-empty sequence.

    >>> sequence_starts(np.array([0, 3, 4, 8])).tolist()
    [0, 3, 4]
    """
    cu = np.asarray(cu_seqlens, dtype=NP_IDS_DTYPE)
    return cu[:-1][np.diff(cu) > 0]


def position_ids_to_cu_seqlens(position_ids: np.ndarray) -> np.ndarray:
    """`(N + 1,)` int32 boundaries of restarting positions `(T,)`: a sequence starts wherever the position does not
    grow by one (the rule of transformers' mask builders), the inverse of `cu_seqlens_to_position_ids`.

    >>> position_ids_to_cu_seqlens(np.array([0, 1, 2, 0, 0, 1, 2, 3])).tolist()
    [0, 3, 4, 8]
    """
    pos = np.asarray(position_ids, dtype=NP_IDS_DTYPE).reshape(-1)
    breaks = np.flatnonzero(np.diff(pos) != 1) + 1
    return np.concatenate([[0], breaks, [pos.size]] if pos.size else [[0]]).astype(NP_CU_SEQLENS_DTYPE)


def max_length(cu_seqlens: np.ndarray) -> int:
    """Longest sequence, as a Python int (what flash-attn's `max_seqlen` takes).

    >>> max_length(np.array([0, 3, 4, 8]))
    4
    """
    cu = np.asarray(cu_seqlens)
    return int(np.diff(cu).max()) if len(cu) > 1 else 0


def next_token_labels(labels, cu_seqlens):
    """The label each token predicts: the next token's inside its sequence, -100 on every sequence's last token, so no
    sequence predicts the next one's first token. `labels` `(..., T)` int64 (numpy or torch, returned alike),
    `cu_seqlens` `(N + 1,)`.

    >>> next_token_labels(np.array([-100, 5, 6, -100, 8]), np.array([0, 3, 5])).tolist()
    [5, 6, -100, 8, -100]
    """
    shifted = labels.copy() if isinstance(labels, np.ndarray) else labels.clone()
    shifted[..., :-1] = labels[..., 1:]
    last = cu_seqlens[1:] - 1
    shifted[..., last if isinstance(labels, np.ndarray) else last.to(labels.device)] = IGNORE_INDEX
    shifted[..., -1:] = IGNORE_INDEX
    return shifted


def position_starts(values: torch.Tensor, step: int = 1) -> torch.Tensor:
    """`(B * T,)` bool: True at every row start and where a value is not its left neighbour's plus `step`: where
    restarting positions start a sequence (`step=1`, the rule of transformers' mask builders), or `seq_idx` (`step=0`).

    >>> position_starts(torch.tensor([[0, 1, 2, 0, 0, 1]])).tolist()
    [True, False, False, True, True, False]
    >>> position_starts(torch.tensor([[0, 0, 0, 1, 2, 2]]), step=0).tolist()
    [True, False, False, True, True, False]
    """
    rows = values.reshape(-1, values.shape[-1])
    new = rows[:, 1:] - rows[:, :-1] != step
    return torch.cat([torch.ones_like(rows[:, :1], dtype=torch.bool), new], dim=1).reshape(-1)


@dataclass(frozen=True, eq=False)
class Boundaries:
    """Where the sequences of a flattened row (or of rows read back to back) start and end.

    Args:
        cu_seqlens (`torch.Tensor` of shape `(N + 1,)`, int32): cumulative lengths with a leading zero, on the device
            of the tokens.
        max_length (`int`): longest sequence (what flash-attn's `max_seqlen` takes).
        total (`int`, *optional*): number of tokens, `cu_seqlens[-1]`, as a Python int (read when not given).

    Views (`host`, `starts`, `position_ids`, `seq_idx`, `chunked`, ...) are computed once per object: build one per
    forward and hand it to every layer (`kwargs()`), never one per layer.

    >>> b = Boundaries.from_position_ids(torch.tensor([[0, 1, 2, 0, 0, 1, 2, 3]]))
    >>> b.host, b.max_length, b.position_ids().tolist(), b.seq_idx.tolist()
    ([0, 3, 4, 8], 4, [0, 1, 2, 0, 0, 1, 2, 3], [0, 0, 0, 1, 2, 2, 2, 2])
    """

    cu_seqlens: torch.Tensor
    max_length: int
    total: int | None = None
    _views: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):  # one host sync where `total` is not given; the constructors know it
        object.__setattr__(self, "total", int(self.cu_seqlens[-1]) if self.total is None else self.total)

    @classmethod
    def from_lengths(cls, lengths, *, device: torch.device | None = None) -> "Boundaries":
        """From the length of each sequence (a list or `(N,)` integer array / tensor)."""
        cu = lengths_to_cu_seqlens(np.asarray(lengths, dtype=NP_IDS_DTYPE))
        return cls(torch.from_numpy(cu).to(device), max_length(cu), int(cu[-1])).with_host(cu.tolist())

    @classmethod
    def from_starts(cls, starts: torch.Tensor) -> "Boundaries":
        """From `(T,)` bool sequence starts (True at token 0 and wherever one begins): one `nonzero`, one copy."""
        total = torch.tensor([starts.numel()], device=starts.device)
        cu_seqlens = torch.cat([torch.nonzero(starts).reshape(-1), total]).to(CU_SEQLENS_DTYPE)
        host = cls.copy_to_host(cu_seqlens)  # the one copy, which gives the longest sequence too
        return cls(cu_seqlens, max_length(np.asarray(host)), starts.numel()).with_host(host)

    @classmethod
    def from_position_ids(cls, position_ids: torch.Tensor) -> "Boundaries":
        """From restarting positions `(B, T)` or `(T,)`, rows read back to back (every row starts a sequence)."""
        return cls.from_starts(position_starts(position_ids))

    @classmethod
    def from_seq_idx(cls, seq_idx: torch.Tensor) -> "Boundaries":
        """From the sequence index of every token, `(B, T)` or `(T,)`."""
        return cls.from_starts(position_starts(seq_idx, step=0))

    @classmethod
    def for_rows(cls, rows: int, length: int, device: torch.device | None = None) -> "Boundaries":
        """Ordinary rows, one sequence each: `rows` 2, `length` 4 -> `cu_seqlens` `[0, 4, 8]` (no host sync)."""
        cu_seqlens = torch.arange(0, rows * length + 1, max(length, 1), dtype=CU_SEQLENS_DTYPE, device=device)
        return cls(cu_seqlens, length, rows * length)

    @classmethod
    def from_kwargs(cls, kwargs: dict, *, rows: int, length: int, device: torch.device | None = None) -> "Boundaries":
        """The boundaries of a forward's keyword arguments over `rows` x `length` tokens: the forward's own `Boundaries`
        (`BOUNDARIES_KEY`, which the guard passes beside the `cu_seq_lens_q/k` it was read from), else explicit
        `cu_seq_lens_q/k` and `max_length_q/k`, else restarting `position_ids`, else `seq_idx`, else ordinary rows of
        one sequence each. Explicit `cu_seq_lens` other than the forward's own always win. `ValueError` for arguments
        that disagree."""
        cu_q, cu_k, position_ids = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k"), kwargs.get("position_ids")
        total = rows * length
        own = kwargs.get(BOUNDARIES_KEY)
        if own is not None and own.total == total and (cu_q is None or cu_q is own.cu_seqlens):
            return own
        if cu_q is None:
            cu_q = cu_k
        if cu_q is not None:
            if cu_k is not None and cu_k is not cu_q and cu_k.shape != cu_q.shape:
                raise ValueError(
                    f"`cu_seq_lens_q` {tuple(cu_q.shape)} and `cu_seq_lens_k` {tuple(cu_k.shape)} differ; flattened "
                    "self-attention runs over one row, so pass the same boundaries for both."
                )
            longest = kwargs.get("max_length_q") or kwargs.get("max_length_k")
            longest = int(cu_q.diff().max()) if longest is None else int(longest)
            return cls(cu_q.to(device=device, dtype=CU_SEQLENS_DTYPE), longest, total)
        if position_ids is not None:
            if position_ids.dim() == 2 and position_ids.shape == (1, length):  # `(1, T)` shared by ordinary rows
                position_ids = position_ids.expand(rows, length)
            if position_ids.numel() != total:
                raise ValueError(
                    f"`position_ids` has {position_ids.numel()} entries but the attention inputs hold {total} tokens; "
                    "pass position ids of shape (batch, sequence_length), one per token (text models only)."
                )
            return cls.from_position_ids(position_ids.to(device))
        if kwargs.get("seq_idx") is not None:
            return cls.from_seq_idx(kwargs["seq_idx"].to(device))
        return cls.for_rows(rows, length, device)

    def view(self, name: str, build: Callable[["Boundaries"], Any]) -> Any:
        """A view of these boundaries computed once, `build(self)`, kept under `name` (e.g. a kernel's plan)."""
        if name not in self._views:
            self._views[name] = build(self)
        return self._views[name]

    @property
    def host(self) -> list[int]:
        """`cu_seqlens` as Python ints, copied to the host once (paths that slice per sequence need them)."""
        return self.view("host", lambda b: Boundaries.copy_to_host(b.cu_seqlens))

    @staticmethod
    def copy_to_host(cu_seqlens: torch.Tensor) -> list[int]:
        """`cu_seqlens` as Python ints: the one place boundaries are copied from the device to the host."""
        return cu_seqlens.tolist()

    def with_host(self, host: list[int]) -> "Boundaries":
        """These boundaries with their `host` view given (values already on the host: no copy from the device)."""
        self._views["host"] = host
        return self

    @property
    def lengths(self) -> torch.Tensor:
        return self.cu_seqlens.long().diff()  # (N,) int64

    @property
    def starts(self) -> torch.Tensor:
        """`(T,)` bool: True at the first token of every non-empty sequence."""

        return self.view("starts", lambda b: position_starts(b.seq_idx[None], step=0) if b.total else b.seq_idx.bool())

    @property
    def seq_idx(self) -> torch.Tensor:
        """`(T,)` int32: the index of the sequence each token belongs to."""
        index = torch.arange(len(self.lengths), device=self.cu_seqlens.device, dtype=CU_SEQLENS_DTYPE)
        return self.view("seq_idx", lambda b: torch.repeat_interleave(index, b.lengths, output_size=b.total))

    def position_ids(self, start: int = 0) -> torch.Tensor:
        """`(T,)` int64: each token's index in its own sequence, plus `start`."""
        index = torch.arange(self.total, device=self.cu_seqlens.device, dtype=IDS_DTYPE)
        return index - self.cu_seqlens[:-1].long()[self.seq_idx.long()] + start

    def kwargs(self) -> dict:
        """`cu_seq_lens_q/k` and `max_length_q/k`, the keyword arguments flash-attn-style attention functions read."""
        values = (self.cu_seqlens, self.cu_seqlens, self.max_length, self.max_length)
        return dict(zip(FLASH_KWARG_KEYS, values, strict=True))

    def padded(self) -> tuple[torch.Tensor, torch.Tensor]:
        """`(index, valid)`, both `(N, L)` with `L = max_length`: token `j` of sequence `s` is token `index[s, j]` of
        the row where `valid[s, j]` (clamped to the row elsewhere): the row laid out as a right-padded batch.

        >>> index, valid = Boundaries.from_lengths([3, 1]).padded()
        >>> index.tolist(), valid.tolist()
        ([[0, 1, 2], [3, 3, 3]], [[True, True, True], [True, False, False]])
        """
        offsets = torch.arange(self.max_length, device=self.cu_seqlens.device)
        valid = offsets[None] < self.lengths[:, None]
        return (self.cu_seqlens[:-1, None].long() + offsets[None]).clamp(max=self.total - 1), valid

    def chunked(self, chunk: int) -> "Boundaries":
        """Each sequence cut every `chunk` tokens: a chunked-attention layer (Llama 4) is causal attention with every
        chunk, counted from its sequence's start, as a sequence of its own.

        >>> Boundaries.from_lengths([5, 3]).chunked(2).cu_seqlens.tolist()
        [0, 2, 4, 5, 7, 8]
        """

        def build(b: Boundaries) -> Boundaries:
            cu, lengths = b.cu_seqlens.long(), b.lengths
            counts = (lengths + chunk - 1) // chunk
            first_piece = torch.cumsum(counts, 0) - counts
            sequence = torch.repeat_interleave(torch.arange(len(lengths), device=cu.device), counts)
            rank = torch.arange(len(sequence), device=cu.device) - first_piece[sequence]
            starts = cu[:-1][sequence] + rank * chunk
            return Boundaries(torch.cat([starts, cu[-1:]]).to(CU_SEQLENS_DTYPE), min(b.max_length, chunk), b.total)

        return self.view(f"chunked {chunk}", build)
