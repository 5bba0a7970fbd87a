"""`DataCollatorWithFlattening`: a vectorized, stricter superset of the transformers collator of the same name."""

import array
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import transformers

from .._conventions import IGNORE_INDEX, IMAGE_FIELDS, NP_CU_SEQLENS_DTYPE, NP_IDS_DTYPE
from ..boundaries import (
    cu_seqlens_to_position_ids,
    cu_seqlens_to_seq_idx,
    lengths_to_cu_seqlens,
    max_length,
    sequence_starts,
)
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


class DataCollatorWithFlattening(transformers.DataCollatorWithFlattening):
    """Concatenates a mini-batch into one row with restarting positions and the boundaries attention kernels need.

    Three examples of lengths 3, 1 and 2 (the first label of every sequence becomes `separator_id`, so the last token
    of one sequence never learns to predict the first token of the next)::

        input_ids      [a0 a1 a2 | b0 | c0 c1]
        labels         [-100 a1 a2 | -100 | -100 c1]
        position_ids   [0 1 2 | 0 | 0 1]                 (1, T) int64
        seq_idx        [0 0 0 | 1 | 2 2]                 (1, T) int32
        cu_seq_lens_q  [0 3 4 6]                         (N + 1,) int32, same for cu_seq_lens_k
        max_length_q   3                                 Python int, same for max_length_k

    No `attention_mask` is emitted: with one, transformers' SDPA/eager paths attend across sequences. Prepare the
    model with `flatcollate.prepare_model_for_flattening` so such setups fail loudly.

    Differences from `transformers.DataCollatorWithFlattening` (same constructor arguments, keys, shapes, dtypes):
    no Python loop over tokens; arrays and tensors are read without a `.tolist()` round trip; flash-attention kwargs and
    `seq_idx` are on by default; `completion_mask` / `assistant_masks` set labels to -100 where they are 0; packed
    examples (`seq_lengths`, or restarting `position_ids`) keep their inner boundaries; bad input raises instead of
    being mixed or dropped.

    Args:
        return_position_ids (`bool`, defaults to `True`): emit `position_ids`.
        separator_id (`int` or `None`, defaults to -100): label given to the first token of every sequence. Causal
            LMs shift labels inside the model, so -100 keeps the last token of one sequence from learning the first
            of the next. `None` keeps every label, for heads that label each token in place
            (`*ForTokenClassification`).
        return_flash_attn_kwargs (`bool`, defaults to `True`): emit `cu_seq_lens_q/k` and `max_length_q/k`.
        return_seq_idx (`bool`, defaults to `True`): emit `seq_idx` (for state-space and linear-attention layers).
        position_ids_start (`int`, defaults to 0): position of the first token of every sequence.
        pad_to_multiple_of (`int`, *optional*): pad the row to a multiple of this many tokens. The padding is a
            sequence of its own (`pad_token_id` tokens, labels -100, positions restarting at `position_ids_start`,
            its own `cu_seq_lens` entry and `seq_idx`), so it never joins a real sequence's attention.
        pad_token_id (`int`, defaults to 0): token used for that padding; it is never attended to by real tokens.
        vocab_size (`int`, *optional*): when given, ids outside `[0, vocab_size)` raise.
        max_seq_len (`int`, *optional*): when given, a sequence longer than this raises (nothing is truncated).
        return_tensors (`str`, defaults to `"pt"`): `"pt"` or `"np"`.

    Example:

    >>> collator = DataCollatorWithFlattening()
    >>> batch = collator([{"input_ids": [5, 6, 7]}, {"input_ids": [8, 9]}])
    >>> sorted(batch)
    ['cu_seq_lens_k', 'cu_seq_lens_q', 'input_ids', 'labels', 'max_length_k', 'max_length_q', 'position_ids', 'seq_idx']
    >>> batch["labels"].tolist(), batch["position_ids"].tolist(), batch["cu_seq_lens_q"].tolist()
    ([[-100, 6, 7, -100, 9]], [[0, 1, 2, 0, 1]], [0, 3, 5])
    """

    def __init__(
        self,
        *args,
        return_position_ids: bool = True,
        separator_id: int | None = IGNORE_INDEX,
        return_flash_attn_kwargs: bool = True,
        return_seq_idx: bool = True,
        position_ids_start: int = 0,
        pad_to_multiple_of: int | None = None,
        pad_token_id: int = 0,
        vocab_size: int | None = None,
        max_seq_len: int | None = None,
        **kwargs,
    ):
        super().__init__(
            *args,
            return_position_ids=return_position_ids,
            separator_id=separator_id,
            return_flash_attn_kwargs=return_flash_attn_kwargs,
            return_seq_idx=return_seq_idx,
            position_ids_start=position_ids_start,
            **kwargs,
        )
        if not (return_position_ids or return_flash_attn_kwargs or return_seq_idx):
            raise ValueError(
                "A flattening collator with `return_position_ids`, `return_flash_attn_kwargs` and `return_seq_idx` all "
                "False emits no boundary: the model would run each batch as one sequence, every example attending to "
                "the others. Keep at least one of them (`return_position_ids=True` is what transformers' own "
                "padding-free path reads)."
            )
        if pad_to_multiple_of is not None and pad_to_multiple_of < 1:
            raise ValueError(f"pad_to_multiple_of must be a positive int or None, got {pad_to_multiple_of}.")
        self.pad_to_multiple_of = pad_to_multiple_of
        self.pad_token_id = pad_token_id
        self.vocab_size = vocab_size
        self.max_seq_len = max_seq_len

    def __call__(
        self, features: Sequence[Mapping[str, Any]], return_tensors: str | None = None, separator_id: int | None = None
    ) -> dict[str, Any]:
        return_tensors = return_tensors or self.return_tensors
        if return_tensors not in ("pt", "np"):
            raise ValueError(f"return_tensors must be 'pt' or 'np', got {return_tensors!r}.")
        separator_id = self.separator_id if separator_id is None else separator_id
        flat = flatten_features(features, vocab_size=self.vocab_size, max_seq_len=self.max_seq_len)
        input_ids, labels, cu_seqlens = flat["input_ids"], flat["labels"], flat["cu_seqlens"]
        if separator_id is not None:  # None: labels in place (token classification), nothing to separate
            labels[sequence_starts(cu_seqlens)] = separator_id
        if self.pad_to_multiple_of:
            input_ids, labels, cu_seqlens = pad_as_own_segment(
                input_ids, labels, cu_seqlens, multiple=self.pad_to_multiple_of, pad_token_id=self.pad_token_id
            )
        batch: dict[str, Any] = {"input_ids": input_ids[None], "labels": labels[None]}
        if self.return_position_ids:
            batch["position_ids"] = cu_seqlens_to_position_ids(cu_seqlens, self.position_ids_start)[None]
        if self.return_seq_idx:
            batch["seq_idx"] = cu_seqlens_to_seq_idx(cu_seqlens)[None]
        if self.return_flash_attn_kwargs:
            batch["cu_seq_lens_q"] = cu_seqlens
            batch["cu_seq_lens_k"] = cu_seqlens.copy()
            batch["max_length_q"] = batch["max_length_k"] = max_length(cu_seqlens)
        if return_tensors == "pt":
            batch = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in batch.items()}
        return batch


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
    example_offsets = np.zeros(len(example_lengths) + 1, dtype=NP_IDS_DTYPE)
    np.cumsum(example_lengths, out=example_offsets[1:])
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
                "`flatcollate.VisionDataCollatorWithFlattening.from_model(model)`."
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
