"""Coercion and validation of per-example fields into 1-D numpy arrays, with errors that name example and field."""

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from .._conventions import IGNORE_INDEX, NP_IDS_DTYPE
from ..boundaries import position_ids_to_cu_seqlens

MASK_KEYS = ("completion_mask", "assistant_masks")
"""Per-token 0/1 masks folded into `labels` (label -100 where the mask is 0)."""


def check_example(feature: Any, *, index: int) -> None:
    """Raise unless an example is a dict of fields holding `input_ids`."""
    if not isinstance(feature, Mapping):
        raise TypeError(f"example {index} must be a dict of fields, got {type(feature).__name__}.")
    if "input_ids" not in feature:
        raise ValueError(
            f"example {index} has no 'input_ids' (fields: {sorted(feature)}); tokenize the data first, e.g. with "
            "`flatcollate.data.make_supervised_dataset`."
        )


def as_example(feature: Any, *, index: int) -> Mapping[str, Any]:
    """An example as a dict of fields: a bare sequence of token ids becomes `{"input_ids": ids}` (TRL 0.x took both).

    Args:
        feature: a dict of fields, or the token ids themselves as a list, tuple, numpy array or torch tensor.
        index: position of the example in the batch, for error messages.

    >>> as_example((5, 6), index=0)
    {'input_ids': (5, 6)}
    >>> as_example("5 6", index=3)
    Traceback (most recent call last):
    ...
    TypeError: example 3 must be a dict with 'input_ids' or a sequence of token ids, got str.
    """
    if isinstance(feature, Mapping):
        check_example(feature, index=index)
        return feature
    if isinstance(feature, list | tuple | np.ndarray | torch.Tensor):
        return {"input_ids": feature}
    raise TypeError(
        f"example {index} must be a dict with 'input_ids' or a sequence of token ids, got {type(feature).__name__}."
    )


def as_1d_ints(value: Any, *, index: int, field: str) -> np.ndarray:
    """One example's field as a 1-D int64 array, without a `.tolist()` round trip for arrays and tensors.

    Args:
        value: a list/tuple of ints, a 1-D numpy array or a 1-D torch tensor of an integer (or bool) dtype.
        index: position of the example in the batch, for error messages.
        field: name of the field, for error messages.

    Returns:
        `np.ndarray` of shape `(L,)`, int64 (a view where the input already is int64 on CPU).

    >>> as_1d_ints([3, 1, 4], index=0, field="input_ids").dtype
    dtype('int64')
    >>> as_1d_ints([1.5, 2.0], index=2, field="input_ids")
    Traceback (most recent call last):
    ...
    TypeError: example 2: field 'input_ids' must hold integers, got float64 values; convert it to int token ids.
    """
    kind = type(value)
    # Exact-type checks first: abstract `Sequence` checks cost more than small conversions.
    is_sequence = kind is list or kind is tuple
    if kind is np.ndarray or (not is_sequence and isinstance(value, np.ndarray)):
        array = value
    elif not is_sequence and isinstance(value, torch.Tensor):
        cpu_leaf = value.device.type == "cpu" and not value.requires_grad
        array = value.numpy() if cpu_leaf else value.detach().cpu().numpy()
    elif is_sequence or (isinstance(value, Sequence) and not isinstance(value, str | bytes)):
        try:
            array = np.asarray(value)
        except ValueError as err:  # ragged nested lists
            raise ValueError(
                f"example {index}: field '{field}' is a nested list of uneven lengths; pass one flat list of token ids "
                "per example."
            ) from err
    else:
        raise TypeError(
            f"example {index}: field '{field}' must be a list, numpy array or torch tensor of ints, "
            f"got {type(value).__name__}."
        )
    if array.ndim != 1:
        raise ValueError(
            f"example {index}: field '{field}' must be 1-D (one sequence per example), got shape {tuple(array.shape)}; "
            "pass each sequence as its own example (e.g. `list(batch_tensor)`)."
        )
    if array.dtype == NP_IDS_DTYPE:
        return array
    if array.dtype.kind == "b":
        array = array.astype(NP_IDS_DTYPE)
    elif array.dtype.kind not in "iu":
        if array.size == 0:  # an empty list infers float64; the emptiness check names the real problem
            return np.zeros(0, dtype=NP_IDS_DTYPE)
        raise TypeError(
            f"example {index}: field '{field}' must hold integers, got {array.dtype} values; "
            "convert it to int token ids."
        )
    return array.astype(NP_IDS_DTYPE, copy=False)


def check_same_length(array: np.ndarray, length: int, *, index: int, field: str) -> None:
    """Raise if a per-token field does not have one entry per token of `input_ids`."""
    if array.shape[0] != length:
        raise ValueError(
            f"example {index}: field '{field}' has {array.shape[0]} entries but 'input_ids' has {length}; "
            f"'{field}' needs one entry per token."
        )


def check_mask_values(mask: np.ndarray, *, index: int, field: str) -> None:
    """Raise unless a mask holds only 0 and 1."""
    if mask.size and (mask.min() < 0 or mask.max() > 1):
        bad = mask[(mask < 0) | (mask > 1)][0]
        raise ValueError(f"example {index}: field '{field}' must hold only 0 and 1, found {bad}.")


def segment_lengths(feature: Mapping, length: int, *, index: int) -> np.ndarray:
    """Lengths of the sequences inside one example: `seq_lengths` when packed, else the whole example.

    An example may also say where its sequences start through restarting `position_ids`; both fields must agree.
    """
    seq_lengths = None
    if "seq_lengths" in feature:
        seq_lengths = as_1d_ints(feature["seq_lengths"], index=index, field="seq_lengths")
        if seq_lengths.size == 0 or seq_lengths.min() <= 0 or int(seq_lengths.sum()) != length:
            raise ValueError(
                f"example {index}: field 'seq_lengths' {seq_lengths.tolist()[:8]} must be positive and sum to the "
                f"{length} tokens of 'input_ids'."
            )
    if "position_ids" in feature:
        positions = as_1d_ints(feature["position_ids"], index=index, field="position_ids")
        check_same_length(positions, length, index=index, field="position_ids")
        from_positions = np.diff(position_ids_to_cu_seqlens(positions)).astype(NP_IDS_DTYPE)
        if seq_lengths is not None and not np.array_equal(from_positions, seq_lengths):
            raise ValueError(
                f"example {index}: 'position_ids' restart at other places than 'seq_lengths' says; drop one of them."
            )
        seq_lengths = from_positions
    if seq_lengths is None:
        return np.array([length], dtype=NP_IDS_DTYPE)
    return seq_lengths


def check_attention_mask(feature: Mapping, length: int, *, index: int) -> None:
    """An incoming `attention_mask` must be all ones: flattening takes unpadded examples."""
    mask = as_1d_ints(feature["attention_mask"], index=index, field="attention_mask")
    check_same_length(mask, length, index=index, field="attention_mask")
    if mask.size and mask.min() == 0:
        raise ValueError(
            f"example {index}: 'attention_mask' has zeros, so the example is padded; flattening collators take "
            "unpadded examples. Remove the padding (tokenize with padding=False)."
        )


def check_token_range(ids: np.ndarray, example_offsets: np.ndarray, *, field: str, vocab_size: int | None) -> None:
    """Vectorized range check over the whole flattened row; names the first bad example only on failure.

    `labels` may also hold `IGNORE_INDEX`.
    """
    low_ok = (ids >= 0) | (ids == IGNORE_INDEX) if field == "labels" else ids >= 0
    ok = low_ok & (ids < vocab_size) if vocab_size is not None else low_ok
    if ok.all():
        return
    flat = int(np.flatnonzero(~ok)[0])
    example = int(np.searchsorted(example_offsets, flat, side="right") - 1)
    allowed = f"[0, {vocab_size})" if vocab_size is not None else ">= 0"
    extra = f" or {IGNORE_INDEX}" if field == "labels" else ""
    position = flat - int(example_offsets[example])
    raise ValueError(
        f"example {example}: field '{field}' holds {int(ids[flat])} at position {position}; "
        f"token ids must be {allowed}{extra}. Check the tokenizer matches the model (`vocab_size`)."
    )


def unknown_per_token_keys(feature: Mapping, known: frozenset[str], length: int) -> list[str]:
    """Keys this collator does not handle whose values look per-token (same length as `input_ids`).

    Such fields would change training if dropped (token types, loss weights), so they are refused; other extra keys
    (ids, raw text, metadata) carry nothing the model consumes per token and are left out of the batch.
    """
    unknown = []
    for key, value in feature.items():
        is_array = isinstance(value, np.ndarray | torch.Tensor) or (
            isinstance(value, Sequence) and not isinstance(value, str | bytes)
        )
        if key not in known and is_array and len(value) == length:
            unknown.append(key)
    return unknown
