"""`flatten_features`: validate a mini-batch and concatenate it into one row, the pure core of both collators.

A fast path concatenates plain batches (dicts of `input_ids` and `labels` only, one container type) field by field;
every other batch takes the general path, which validates each example and names the example, field and fix.
"""

import array
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from .._conventions import IGNORE_INDEX, IMAGE_FIELDS, NP_IDS_DTYPE
from ..boundaries import lengths_to_cu_seqlens
from .features import (
    MASK_KEYS,
    as_1d_ints,
    check_attention_mask,
    check_example,
    check_mask_values,
    check_same_length,
    check_token_range,
    segment_lengths,
    unknown_per_token_keys,
)

_KNOWN_KEYS = frozenset({"input_ids", "labels", "seq_lengths", "position_ids", "attention_mask", *MASK_KEYS})


def flatten_features(
    features: Sequence[Mapping[str, Any]], *, vocab_size: int | None = None, max_seq_len: int | None = None
) -> dict[str, np.ndarray]:
    """Validate a batch and concatenate it: the pure core of the flattening collators.

    Args:
        features: examples with `input_ids` and optional `labels`, `completion_mask`, `assistant_masks`,
            `seq_lengths`, `position_ids`, `attention_mask` (all ones).
        vocab_size: when given, ids outside `[0, vocab_size)` raise.
        max_seq_len: when given, a sequence longer than this raises.

    Returns:
        `dict` with `input_ids` `(T,)` int64, `labels` `(T,)` int64 (masks applied, separators not yet set),
        `cu_seqlens` `(N + 1,)` int32 over every sequence (packed examples contribute several),
        `example_offsets` `(B + 1,)` int64 (where each example starts in the row).

    >>> out = flatten_features([{"input_ids": [1, 2, 3], "completion_mask": [0, 1, 1]}, {"input_ids": [4]}])
    >>> out["labels"].tolist(), out["cu_seqlens"].tolist()
    ([-100, 2, 3, 4], [0, 3, 4])
    """
    if isinstance(features, Mapping) or not isinstance(features, Sequence):
        raise TypeError(f"features must be a list of examples (dicts), got {type(features).__name__}.")
    if len(features) == 0:
        raise ValueError("empty batch: the collator got no examples; check the sampler and `drop_last`.")
    _refuse_images(features)
    flat = _flatten_plain(features, max_seq_len=max_seq_len)
    if flat is None:
        flat = _flatten_general(features, max_seq_len=max_seq_len)
    input_ids, labels, example_lengths, seq_lengths = flat
    example_offsets = lengths_to_cu_seqlens(example_lengths).astype(NP_IDS_DTYPE)  # where each example starts
    check_token_range(input_ids, example_offsets, field="input_ids", vocab_size=vocab_size)
    if labels is None:
        labels = input_ids.copy()
    else:
        check_token_range(labels, example_offsets, field="labels", vocab_size=vocab_size)
    return {
        "input_ids": input_ids,
        "labels": labels,
        "cu_seqlens": lengths_to_cu_seqlens(seq_lengths),
        "example_offsets": example_offsets,
    }


def _refuse_images(features: Sequence[Mapping[str, Any]]) -> None:
    """Raise for an example with images: this collator has no place for them, and dropping them would train the image
    placeholders of `input_ids` without their images."""
    for index, feature in enumerate(features):
        found = [key for key in IMAGE_FIELDS if isinstance(feature, Mapping) and feature.get(key) is not None]
        if found:
            raise ValueError(
                f"example {index}: `{found[0]}` is an image field, which this text collator would drop (the model "
                "would train the image placeholders without their images). Collate image-text examples with "
                "`flatcollate.vision.VisionDataCollatorWithFlattening.from_model(model)`."
            )


_Flat = tuple[np.ndarray, np.ndarray | None, np.ndarray, np.ndarray]
"""Concatenated `input_ids`, concatenated `labels` (None when no example has any), example lengths, sequence lengths."""


def _flatten_general(features: Sequence[Mapping[str, Any]], *, max_seq_len: int | None) -> _Flat:
    """Every field and input type: one pass per example validates its arrays, then each field is concatenated once."""
    ids_parts, label_parts, length_parts = [], [], []
    for index, feature in enumerate(features):
        ids, labels, lengths = _one_example(feature, index=index, max_seq_len=max_seq_len)
        ids_parts.append(ids)
        label_parts.append(labels)
        length_parts.append(lengths)
    input_ids = np.concatenate(ids_parts)
    labels = None
    if any(lab is not None for lab in label_parts):
        labels = np.concatenate([ids if lab is None else lab for ids, lab in zip(ids_parts, label_parts, strict=True)])
    example_lengths = np.array([len(p) for p in ids_parts], dtype=NP_IDS_DTYPE)
    return input_ids, labels, example_lengths, np.hstack(length_parts)


_PLAIN_KEYS = (frozenset({"input_ids"}), frozenset({"input_ids", "labels"}))


def _flatten_plain(features: Sequence[Mapping[str, Any]], *, max_seq_len: int | None) -> _Flat | None:
    """Fast path for the common batch: dicts holding only `input_ids` (and `labels`), every value of one container type.

    Each field is concatenated in one call (`_concat_plain`) instead of being converted example by example. Returns
    None whenever the batch is not plain or anything looks wrong (an empty example, a length mismatch, a non-integer
    value): `flatten_features` then takes the general path, which names the example, field and fix.
    """
    first = features[0]
    if type(first) is not dict or first.keys() not in _PLAIN_KEYS:
        return None
    if any(type(feature) is not dict or feature.keys() != first.keys() for feature in features):
        return None
    ids = _concat_plain([feature["input_ids"] for feature in features])
    if ids is None:
        return None
    input_ids, lengths = ids
    if lengths.min() == 0 or (max_seq_len is not None and lengths.max() > max_seq_len):
        return None
    labels = None
    if "labels" in first:
        concatenated = _concat_plain([feature["labels"] for feature in features])
        if concatenated is None or not np.array_equal(concatenated[1], lengths):
            return None
        labels = concatenated[0]
    return input_ids, labels, lengths, lengths


def _concat_plain(values: list[Any]) -> tuple[np.ndarray, np.ndarray] | None:
    """One field of every example as one fresh int64 array and the per-example lengths, or None if not plain.

    Python lists go straight into one int64 buffer (`array.array.fromlist`: about half the cost per token of
    `np.asarray`; it takes ints, bools and numpy integer scalars and raises on floats, strings, `None` and nested
    lists); 1-D numpy arrays and CPU tensors of integer or bool dtype are concatenated in one call.
    """
    kind = type(values[0])
    if any(type(value) is not kind for value in values):
        return None
    if kind is list:
        buffer = array.array("q")
        try:
            for value in values:
                buffer.fromlist(value)
        except (TypeError, OverflowError):  # not all int64 values
            return None
        flat = np.frombuffer(buffer, dtype=NP_IDS_DTYPE)
    elif kind is np.ndarray:
        if any(value.ndim != 1 for value in values):
            return None
        flat = np.concatenate(values)
    elif kind is torch.Tensor:
        if any(value.dim() != 1 or not value.is_cpu for value in values):
            return None
        flat = torch.cat(values).numpy()
    else:
        return None
    if flat.dtype.kind not in "iub":  # float, or an int mix numpy can only promote to float
        return None
    lengths = np.fromiter(map(len, values), dtype=NP_IDS_DTYPE, count=len(values))
    return flat.astype(NP_IDS_DTYPE, copy=False), lengths


def _one_example(
    feature: Mapping[str, Any], *, index: int, max_seq_len: int | None
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | int]:
    """`input_ids`, `labels` with masks folded in (or None) and the example's sequence length(s)."""
    check_example(feature, index=index)
    ids = as_1d_ints(feature["input_ids"], index=index, field="input_ids")
    length = ids.shape[0]
    if length == 0:
        raise ValueError(f"example {index}: 'input_ids' is empty; remove empty examples before collating.")
    labels = None
    if "labels" in feature and feature["labels"] is not None:
        labels = as_1d_ints(feature["labels"], index=index, field="labels")
        check_same_length(labels, length, index=index, field="labels")
    for key in MASK_KEYS:
        if key not in feature or feature[key] is None:
            continue
        mask = as_1d_ints(feature[key], index=index, field=key)
        check_same_length(mask, length, index=index, field=key)
        check_mask_values(mask, index=index, field=key)
        labels = np.where(mask == 0, IGNORE_INDEX, ids if labels is None else labels)
    if "attention_mask" in feature:
        check_attention_mask(feature, length, index=index)
    if feature.keys() - _KNOWN_KEYS:
        unknown = unknown_per_token_keys(feature, _KNOWN_KEYS, length)
        if unknown:
            raise ValueError(
                f"example {index}: per-token field(s) {unknown} are not handled by this collator and would be "
                "dropped; remove them from the dataset (e.g. `dataset.remove_columns(...)`) or fold them into 'labels'."
            )
    if "seq_lengths" in feature or "position_ids" in feature:
        lengths = segment_lengths(feature, length, index=index)
        longest = int(lengths.max())
    else:
        lengths, longest = length, length
    if max_seq_len is not None and longest > max_seq_len:
        raise ValueError(
            f"example {index}: a sequence of {longest} tokens exceeds max_seq_len={max_seq_len}; "
            "split or filter long examples, or raise max_seq_len."
        )
    return ids, labels, lengths
