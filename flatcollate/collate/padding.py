"""Padding around a flattened batch: the row padded to a multiple with a sequence of its own (`pad_as_own_segment`),
or the batch scattered back into one padded row per example (`pad_flat`).
"""

from collections.abc import Mapping
from typing import Literal

import numpy as np

from .._conventions import IGNORE_INDEX, NP_CU_SEQLENS_DTYPE, NP_IDS_DTYPE
from ..boundaries import cu_seqlens_to_position_ids, cu_seqlens_to_seq_idx


def pad_as_own_segment(
    input_ids: np.ndarray, labels: np.ndarray, cu_seqlens: np.ndarray, *, multiple: int, pad_token_id: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pad a flattened row to a multiple of `multiple` tokens with a padding sequence of its own.

    The padding gets labels -100 and its own `cu_seqlens` entry, so no real token attends to it::

        before   [a0 a1 a2 | b0]          cu_seqlens [0 3 4]
        after    [a0 a1 a2 | b0 | p p p p] cu_seqlens [0 3 4 8]   (multiple=8)

    >>> ids, labels, cu = pad_as_own_segment(np.arange(1, 5), np.arange(1, 5), np.array([0, 3, 4]), multiple=8,
    ...                                      pad_token_id=0)
    >>> ids.tolist(), labels.tolist(), cu.tolist()
    ([1, 2, 3, 4, 0, 0, 0, 0], [1, 2, 3, 4, -100, -100, -100, -100], [0, 3, 4, 8])
    """
    total = int(cu_seqlens[-1])
    pad = -total % multiple
    if pad == 0:
        return input_ids, labels, cu_seqlens
    input_ids = np.concatenate([input_ids, np.full(pad, pad_token_id, dtype=NP_IDS_DTYPE)])
    labels = np.concatenate([labels, np.full(pad, IGNORE_INDEX, dtype=NP_IDS_DTYPE)])
    cu_seqlens = np.append(cu_seqlens, total + pad).astype(NP_CU_SEQLENS_DTYPE)
    return input_ids, labels, cu_seqlens


def pad_flat(
    flat: Mapping[str, np.ndarray],
    *,
    pad_token_id: int,
    pad_to_multiple_of: int | None = None,
    padding_side: Literal["left", "right"] = "right",
) -> dict[str, np.ndarray]:
    """Scatter a flattened batch (from `flatten_features`) back into padded rows, one per example::

        flat      [a0 a1 a2 | b0]         example_offsets [0 3 4]
        right     [a0 a1 a2]              attention_mask [[1 1 1]
                  [b0 p  p ]                              [1 0 0]]
        left      [a0 a1 a2]              attention_mask [[1 1 1]
                  [p  p  b0]                              [0 0 1]]

    Args:
        flat: `input_ids` and `labels` `(T,)` int64, `cu_seqlens` `(N + 1,)` int32, `example_offsets` `(B + 1,)` int64.
        pad_token_id: id of padding tokens (label -100, attention mask 0).
        pad_to_multiple_of: round the row width up to a multiple of this.
        padding_side: `"right"` (padding after each example) or `"left"` (before it, e.g. for generation).

    Returns:
        `input_ids`, `labels`, `attention_mask`, each `(B, W)` int64.

    >>> from flatcollate.collate.flatten import flatten_features
    >>> flat = flatten_features([{"input_ids": [5, 6, 7]}, {"input_ids": [8]}])
    >>> padded = pad_flat(flat, pad_token_id=0)
    >>> padded["input_ids"].tolist(), padded["attention_mask"].tolist()
    ([[5, 6, 7], [8, 0, 0]], [[1, 1, 1], [1, 0, 0]])
    >>> pad_flat(flat, pad_token_id=0, padding_side="left")["input_ids"].tolist()
    [[5, 6, 7], [0, 0, 8]]
    """
    if padding_side not in ("left", "right"):
        raise ValueError(
            f"padding_side must be 'left' or 'right', got {padding_side!r}; set `tokenizer.padding_side`."
        )
    offsets, starts = flat["example_offsets"], flat["cu_seqlens"][:-1]
    sequences = np.diff(np.searchsorted(starts, offsets))  # sequences starting inside each example
    if sequences.max() > 1:
        index = int(np.argmax(sequences > 1))
        raise ValueError(
            f"example {index} holds {int(sequences[index])} sequences (`seq_lengths` or restarting `position_ids`); "
            "padding_free=False gives each example one attention row, so they would attend to each other. "
            "Use padding_free=True for packed examples."
        )
    lengths = np.diff(offsets)
    width = int(lengths.max())
    if pad_to_multiple_of:
        width = -(-width // pad_to_multiple_of) * pad_to_multiple_of
    rows, columns = cu_seqlens_to_seq_idx(offsets), cu_seqlens_to_position_ids(offsets)  # each token's example, place
    if padding_side == "left":
        columns += np.repeat(width - lengths, lengths)
    input_ids = np.full((len(lengths), width), pad_token_id, dtype=NP_IDS_DTYPE)
    labels = np.full((len(lengths), width), IGNORE_INDEX, dtype=NP_IDS_DTYPE)
    attention_mask = np.zeros((len(lengths), width), dtype=NP_IDS_DTYPE)
    input_ids[rows, columns] = flat["input_ids"]
    labels[rows, columns] = flat["labels"]
    attention_mask[rows, columns] = 1
    return {"input_ids": input_ids, "labels": labels, "attention_mask": attention_mask}
