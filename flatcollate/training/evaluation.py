"""Per-example predictions from flattened evaluation: `Trainer.predict` returns one row per eval batch, not per example.

With a flattening collator each eval batch is one row, so `EvalPrediction.predictions` and `.label_ids` hold one row
per batch, concatenated over batches and right-padded with -100 to the widest row (transformers' `nested_concat`).
Each row holds the examples of its batch back to back; the examples' lengths, in evaluation order, split it::

    lengths        [3, 1, 2 | 4]                      eval batches of 3 and 1 examples
    label_ids      [[-100 a1 a2 -100 -100 c1]         (R, W): the first label of every example is -100
                    [-100 d1 d2 d3 -100 -100]]        the last two entries of row 1 pad it to W
    predictions    [[pa0 pa1 pa2 pb0 pc0 pc1]         (R, W, ...): logits, or ids from `preprocess_logits_for_metrics`
                    [pd0 pd1 pd2 pd3 -100 -100]]      padding is -100 in every entry
    per example    a (3 tokens), b (1), c (2), d (4)

A row's width is read off the padding of `predictions` (no real logit vector or argmax id equals -100 throughout), so
eval batches of any size split alike, token-budget batches included. The split is checked three ways: the lengths add
up to the real tokens, no example straddles two rows, and every example's first label is the separator the collator
wrote.
"""

from collections.abc import Sequence

import numpy as np

from .._conventions import IGNORE_INDEX, NP_IDS_DTYPE
from ..boundaries import lengths_to_cu_seqlens

_PAD_INDEX = IGNORE_INDEX
"""What transformers pads eval rows with when it concatenates batches of different widths (`padding_index=-100`)."""

_LENGTHS_FIX = (
    "pass one length per evaluated example, in evaluation order (`[len(ids) for ids in eval_dataset['input_ids']]`, "
    "with Trainer's sequential eval sampler)"
)


def split_flattened_predictions(
    predictions: np.ndarray,
    label_ids: np.ndarray,
    *,
    lengths: Sequence[int] | np.ndarray,
    separator_id: int | None = IGNORE_INDEX,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Split the rows of a flattened evaluation back into one array per example, as padded evaluation gives them.

    Args:
        predictions (`np.ndarray` of shape `(R, W, ...)`): `EvalPrediction.predictions`, one row per eval batch,
            rows right-padded with -100: logits `(R, W, V)` float, or argmax ids `(R, W)` from
            `preprocess_logits_for_metrics`. When the model returns several outputs, pass the one you score
            (`predictions[0]` for the logits).
        label_ids (`np.ndarray` of shape `(R, W)`, integer): `EvalPrediction.label_ids`.
        lengths (`Sequence[int]` or `np.ndarray` of shape `(N,)`): tokens of each evaluated example, in evaluation
            order (`len(input_ids)` of every row of the eval dataset).
        separator_id (`int` or `None`, defaults to -100): the flattening collator's `separator_id`, which every
            example's first label must equal; `None` skips that check (a collator built with `separator_id=None`).

    Returns:
        `(predictions, labels)`: two lists of `N` arrays, example `i`'s of shape `(lengths[i], ...)` and
        `(lengths[i],)`, equal to row `i` of padded evaluation cut to `lengths[i]`, except that the first label is
        the separator (causal LMs never score it: logits at `t` predict `labels[t + 1]`).

    Raises:
        `TypeError` for a tuple or list of predictions; `ValueError` when the shapes disagree, a length is not
        positive, the lengths do not add up to the rows' tokens, an example straddles two rows, or an example's first
        label is not `separator_id`.

    >>> labels = np.array([[-100, 11, 12, -100, -100, 31], [-100, 41, 42, 43, -100, -100]])
    >>> ids = np.array([[11, 12, 0, 5, 31, 9], [41, 42, 43, 7, -100, -100]])
    >>> preds, labs = split_flattened_predictions(ids, labels, lengths=[3, 1, 2, 4])
    >>> [p.tolist() for p in preds]
    [[11, 12, 0], [5], [31, 9], [41, 42, 43, 7]]
    >>> [lab.tolist() for lab in labs]
    [[-100, 11, 12], [-100], [-100, 31], [-100, 41, 42, 43]]
    """
    predictions, label_ids = _check_arrays(predictions, label_ids)
    lengths = _check_lengths(lengths)
    widths = _row_widths(predictions)
    real = np.arange(label_ids.shape[1]) < widths[:, None]  # (R, W) bool: the tokens each row holds
    stray = np.flatnonzero(((label_ids != _PAD_INDEX) & ~real).any(axis=1))
    if stray.size:
        row = int(stray[0])
        raise ValueError(
            f"row {row} of `label_ids` has labels after token {int(widths[row])}, where `predictions` is padding "
            "(-100): both must hold one entry per token of the same rows (a `preprocess_logits_for_metrics` that "
            "drops or shifts positions breaks this)."
        )
    cu = lengths_to_cu_seqlens(lengths)
    _check_rows(cu, np.cumsum(widths))
    flat_labels = label_ids[real]
    if separator_id is not None:
        first = flat_labels[cu[:-1]]
        wrong = np.flatnonzero(first != separator_id)
        if wrong.size:
            i = int(wrong[0])
            raise ValueError(
                f"example {i}: its first label (token {int(cu[i])} of the rows, by `lengths`) is {int(first[i])}, not "
                f"the separator {separator_id} the flattening collator writes at every example's start, so `lengths` "
                f"are not the evaluated examples': {_LENGTHS_FIX}. For a collator built with `separator_id=None`, "
                "pass `separator_id=None`."
            )
    splits = cu[1:-1]
    return np.split(predictions[real], splits), np.split(flat_labels, splits)


def _check_arrays(predictions, label_ids) -> tuple[np.ndarray, np.ndarray]:
    """Both as arrays with one entry per token of the same `(R, W)` rows."""
    if isinstance(predictions, (tuple, list)):
        raise TypeError(
            f"predictions is a {type(predictions).__name__} of {len(predictions)} arrays: pass one array of shape "
            "(rows, tokens, ...), e.g. `predictions[0]` for the logits when the model returns several outputs "
            "(and keep `eval_do_concat_batches=True`)."
        )
    predictions, label_ids = np.asarray(predictions), np.asarray(label_ids)
    if label_ids.ndim != 2 or label_ids.dtype.kind not in "iu":
        raise ValueError(
            f"label_ids must be integers of shape (rows, tokens), got {label_ids.dtype} of shape {label_ids.shape}."
        )
    if predictions.shape[:2] != label_ids.shape:
        raise ValueError(
            f"predictions of shape {predictions.shape} do not start with the shape of label_ids {label_ids.shape}: "
            "both must hold one entry per token of the same rows (one row per flattened eval batch)."
        )
    return predictions, label_ids


def _check_lengths(lengths: Sequence[int] | np.ndarray) -> np.ndarray:
    """`lengths` as a `(N,)` int64 array of positive ints."""
    lengths = np.asarray(lengths)
    if lengths.ndim != 1 or lengths.size == 0 or lengths.dtype.kind not in "iu":
        raise ValueError(
            f"lengths must be a non-empty 1-D sequence of ints, got {lengths.dtype} of shape {lengths.shape}: "
            f"{_LENGTHS_FIX}."
        )
    bad = np.flatnonzero(lengths < 1)
    if bad.size:
        raise ValueError(f"example {int(bad[0])}: length {int(lengths[bad[0]])}; every example has at least one token.")
    return lengths.astype(NP_IDS_DTYPE, copy=False)


def _row_widths(predictions: np.ndarray) -> np.ndarray:
    """`(R,)` int64: real tokens of each row, those before its trailing entries that are -100 throughout."""
    rows, width = predictions.shape[:2]
    real = ~(predictions.reshape(rows, width, -1) == _PAD_INDEX).all(axis=-1)
    # argmax over the reversed row finds the last real token without a loop; an all-padding row has width 0.
    widths = np.where(real.any(axis=1), width - real[:, ::-1].argmax(axis=1), 0)
    empty = np.flatnonzero(widths == 0)
    if empty.size:
        raise ValueError(f"row {int(empty[0])} of predictions is all padding (-100): no eval batch is empty.")
    return widths.astype(NP_IDS_DTYPE)


def _check_rows(cu_seqlens: np.ndarray, row_ends: np.ndarray) -> None:
    """Raise unless the examples fill the rows exactly: same total, and every row ends where an example ends."""
    total, tokens = int(cu_seqlens[-1]), int(row_ends[-1])
    if total != tokens:
        raise ValueError(
            f"`lengths` add up to {total} tokens for {len(cu_seqlens) - 1} examples, but the predictions hold {tokens} "
            f"tokens in {len(row_ends)} rows (one per eval batch): {_LENGTHS_FIX}. An eval collator with "
            "`pad_to_multiple_of` adds a padding segment to every row; evaluate without it."
        )
    inside = np.flatnonzero(~np.isin(row_ends, cu_seqlens))
    if inside.size:
        row = int(inside[0])
        end = int(row_ends[row])
        example = int(np.searchsorted(cu_seqlens, end, side="right") - 1)
        raise ValueError(
            f"row {row} (eval batch {row}) ends at token {end}, inside example {example} (tokens "
            f"{int(cu_seqlens[example])} to {int(cu_seqlens[example + 1])}): an example cannot span two eval batches, "
            f"so `lengths` are not the evaluated examples': {_LENGTHS_FIX}."
        )
