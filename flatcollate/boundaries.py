"""Pure functions from sequence lengths to the boundary tensors of a flattened row.

A flattened row holds N sequences back to back. Everything that tells a model where sequences start derives from
their lengths::

    lengths        [3, 1, 4]
    cu_seqlens     [0, 3, 4, 8]                 (N + 1,) int32
    position_ids   [0 1 2 | 0 | 0 1 2 3]        (T,) int64, restarting at every boundary
    seq_idx        [0 0 0 | 1 | 2 2 2 2]        (T,) int32

No function here loops over tokens: boundaries come from `cumsum`, `repeat` and `diff`.
"""

import numpy as np

from ._conventions import IGNORE_INDEX, NP_CU_SEQLENS_DTYPE, NP_IDS_DTYPE


def lengths_to_cu_seqlens(lengths: np.ndarray) -> np.ndarray:
    """Cumulative sequence lengths with a leading zero.

    Args:
        lengths (`np.ndarray` of shape `(N,)`, integer): length of each sequence.

    Returns:
        `np.ndarray` of shape `(N + 1,)`, int32: `[0, l0, l0 + l1, ...]`.

    >>> lengths_to_cu_seqlens(np.array([3, 1, 4])).tolist()
    [0, 3, 4, 8]
    """
    cu = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=cu[1:])
    if cu[-1] > np.iinfo(NP_CU_SEQLENS_DTYPE).max:
        raise ValueError(f"A flattened row of {cu[-1]} tokens does not fit int32 `cu_seq_lens`; use smaller batches.")
    return cu.astype(NP_CU_SEQLENS_DTYPE)


def cu_seqlens_to_position_ids(cu_seqlens: np.ndarray, start: int = 0) -> np.ndarray:
    """Positions that restart at `start` at every sequence boundary.

    Args:
        cu_seqlens (`np.ndarray` of shape `(N + 1,)`, integer): boundaries from `lengths_to_cu_seqlens`.
        start (`int`): position of the first token of every sequence.

    Returns:
        `np.ndarray` of shape `(T,)`, int64.

    >>> cu_seqlens_to_position_ids(np.array([0, 3, 4, 8])).tolist()
    [0, 1, 2, 0, 0, 1, 2, 3]
    """
    cu = np.asarray(cu_seqlens, dtype=NP_IDS_DTYPE)
    total = int(cu[-1])
    # Each token's position is its flat index minus the start offset of its own sequence.
    starts = np.repeat(cu[:-1], np.diff(cu))
    return np.arange(total, dtype=NP_IDS_DTYPE) - starts + start


def cu_seqlens_to_seq_idx(cu_seqlens: np.ndarray) -> np.ndarray:
    """Index of the sequence each token belongs to.

    Args:
        cu_seqlens (`np.ndarray` of shape `(N + 1,)`, integer).

    Returns:
        `np.ndarray` of shape `(T,)`, int32.

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
    """Recover boundaries from restarting positions: a sequence starts wherever the position does not grow by one.

    This is the rule transformers' mask builders use (`diff(position_ids) != 1`); it is the inverse of
    `cu_seqlens_to_position_ids` for any start value.

    Args:
        position_ids (`np.ndarray` of shape `(T,)`, integer).

    Returns:
        `np.ndarray` of shape `(N + 1,)`, int32.

    >>> position_ids_to_cu_seqlens(np.array([0, 1, 2, 0, 0, 1, 2, 3])).tolist()
    [0, 3, 4, 8]
    """
    pos = np.asarray(position_ids, dtype=NP_IDS_DTYPE).reshape(-1)
    if pos.size == 0:
        return np.zeros(1, dtype=NP_CU_SEQLENS_DTYPE)
    breaks = np.flatnonzero(np.diff(pos) != 1) + 1
    return np.concatenate([[0], breaks, [pos.size]]).astype(NP_CU_SEQLENS_DTYPE)


def max_length(cu_seqlens: np.ndarray) -> int:
    """Longest sequence, as a Python int (what flash-attn's `max_seqlen` takes).

    >>> max_length(np.array([0, 3, 4, 8]))
    4
    """
    cu = np.asarray(cu_seqlens)
    return int(np.diff(cu).max()) if len(cu) > 1 else 0


def next_token_labels(labels, cu_seqlens):
    """The label each token predicts: the next token's inside its sequence, -100 on every sequence's last token, so no
    sequence predicts the next one's first token, whatever label that token has.

    Args:
        labels (`np.ndarray` or `torch.Tensor` of shape `(..., T)`, int64): -100 where a token carries no loss.
        cu_seqlens (`np.ndarray` or `torch.Tensor` of shape `(N + 1,)`, integer): the row's boundaries.

    Returns:
        The same type and shape as `labels`.

    >>> next_token_labels(np.array([-100, 5, 6, -100, 8]), np.array([0, 3, 5])).tolist()
    [5, 6, -100, 8, -100]
    """
    shifted = labels.copy() if isinstance(labels, np.ndarray) else labels.clone()
    shifted[..., :-1] = labels[..., 1:]
    last = cu_seqlens[1:] - 1
    shifted[..., last if isinstance(labels, np.ndarray) else last.to(labels.device)] = IGNORE_INDEX
    shifted[..., -1:] = IGNORE_INDEX
    return shifted
