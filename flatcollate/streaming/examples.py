"""Turning one source row into token sequences that fit a pack: encode, validate, handle over-long sequences."""

from collections.abc import Callable, Mapping
from typing import Any, Literal

import numpy as np
import torch

from .._conventions import IGNORE_INDEX, IMAGE_FIELDS, NP_IDS_DTYPE
from ..boundaries import position_ids_to_cu_seqlens
from ..collate.features import MASK_KEYS, unknown_per_token_keys
from ..data.row_errors import SkippedRow

Overlong = Literal["error", "split", "truncate"]
OVERLONG_CHOICES = ("error", "split", "truncate")

EncodeFn = Callable[[Mapping[str, Any]], Mapping[str, Any] | SkippedRow]

_KNOWN_KEYS = frozenset({"input_ids", "labels", "attention_mask", "position_ids", "seq_lengths", *MASK_KEYS})


def encode_row(row: Any, *, encode_fn: EncodeFn | None, origin: str) -> tuple[np.ndarray, np.ndarray] | SkippedRow:
    """Encode and validate one row; fold its masks into the labels.

    A packed row keeps only `input_ids` and `labels`, so `completion_mask` / `assistant_masks` are folded into the
    labels here (label -100 where the mask is 0), as `flatcollate.DataCollatorWithFlattening` folds them for unpacked
    rows.
    Any other per-token field would be lost in the pack and is refused; so are padded rows (`attention_mask` with
    zeros) and rows that already hold several sequences (restarting `position_ids`, several `seq_lengths`)::

        input_ids        [p0 p1 c0 c1]
        completion_mask  [ 0  1  1  1]
        labels        -> [-100 p1 c0 c1]

    Args:
        row: a mapping; with `encode_fn=None` it must already hold `input_ids` (and optionally `labels`,
            `completion_mask`, `assistant_masks`).
        encode_fn: per-row callable returning `{"input_ids", "labels"}` (token ids, 1-D ints), optionally with masks,
            or a `flatcollate.data.SkippedRow` for a row it refuses (as `build_encoder(..., on_error="skip")` does).
        origin (`str`): where the row came from, for error messages (`"row 12"`).

    Returns:
        `(input_ids, labels)`, both `np.ndarray` of shape `(L,)`, int64; labels default to a copy of the ids. Or the
        `SkippedRow` that `encode_fn` returned, as is: only `encode_fn` skips a row, every check here raises.

    >>> ids, labels = encode_row({"input_ids": [5, 6, 7]}, encode_fn=None, origin="row 0")
    >>> ids.tolist(), labels.tolist()
    ([5, 6, 7], [5, 6, 7])
    >>> encode_row({"input_ids": [5, 6, 7], "completion_mask": [0, 1, 1]}, encode_fn=None, origin="row 0")[1].tolist()
    [-100, 6, 7]
    """
    if not isinstance(row, Mapping):
        raise TypeError(f"{origin}: expected a mapping (dict) row, got {type(row).__name__}: {_short(row)}.")
    encoded = encode_fn(row) if encode_fn is not None else row
    if encode_fn is not None and isinstance(encoded, SkippedRow):
        return encoded
    if not isinstance(encoded, Mapping):
        raise TypeError(
            f"{origin}: `encode_fn` must return a mapping with `input_ids` (or a `SkippedRow` to skip the row), got "
            f"{type(encoded).__name__}."
        )
    if "input_ids" not in encoded:
        fix = "make `encode_fn` return it" if encode_fn is not None else "tokenize first or pass `encode_fn=`"
        raise ValueError(f"{origin}: field `input_ids` is missing (fields: {sorted(encoded)}); {fix}.")
    input_ids = _token_array(encoded["input_ids"], field="input_ids", origin=origin)
    length = input_ids.size
    if length == 0:
        raise ValueError(f"{origin}: field `input_ids` is empty; filter out empty rows before packing.")
    if input_ids.min() < 0:
        raise ValueError(f"{origin}: field `input_ids` holds a negative id ({int(input_ids.min())}); ids must be >= 0.")
    _refuse_lost_fields(encoded, length, origin=origin, from_encode_fn=encode_fn is not None)
    if encoded.get("labels") is None:
        labels = input_ids.copy()
    else:
        labels = _token_array(encoded["labels"], field="labels", origin=origin)
        _check_length(labels, length, field="labels", origin=origin)
    for key in MASK_KEYS:
        if encoded.get(key) is not None:
            mask = _token_array(encoded[key], field=key, origin=origin, allow_bool=True)
            _check_length(mask, length, field=key, origin=origin)
            if mask.min() < 0 or mask.max() > 1:
                bad = int(mask[(mask < 0) | (mask > 1)][0])
                raise ValueError(f"{origin}: field `{key}` must hold only 0 and 1, found {bad}.")
            labels = np.where(mask == 0, IGNORE_INDEX, labels)
    return input_ids, labels


def fit_to_pack(
    input_ids: np.ndarray, labels: np.ndarray, *, pack_len: int, overlong: Overlong, origin: str
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Pieces of one sequence, each at most `pack_len` tokens long.

    `split` cuts a long sequence into consecutive chunks; each becomes its own sequence with restarting positions (the
    collator's separator label then drops the loss on each chunk's first token). `truncate` keeps the first `pack_len`
    tokens. `error` refuses.

    >>> pieces = fit_to_pack(np.arange(5), np.arange(5), pack_len=2, overlong="split", origin="row 0")
    >>> [ids.tolist() for ids, _ in pieces]
    [[0, 1], [2, 3], [4]]
    """
    length = input_ids.size
    if length <= pack_len:
        return [(input_ids, labels)]
    if overlong == "truncate":
        return [(input_ids[:pack_len], labels[:pack_len])]
    if overlong == "split":
        cuts = np.arange(pack_len, length, pack_len)
        return list(zip(np.split(input_ids, cuts), np.split(labels, cuts), strict=True))
    raise ValueError(
        f"{origin}: sequence of {length} tokens is longer than pack_len={pack_len}. Set overlong='split' or "
        "overlong='truncate', or raise `pack_len`."
    )


def _refuse_lost_fields(encoded: Mapping[str, Any], length: int, *, origin: str, from_encode_fn: bool) -> None:
    """Raise if a field of the row carries per-token information that a pack of `input_ids` and `labels` would lose."""
    if encoded.get("attention_mask") is not None:
        attention = _token_array(encoded["attention_mask"], field="attention_mask", origin=origin)
        _check_length(attention, length, field="attention_mask", origin=origin)
        if attention.min() == 0:
            raise ValueError(
                f"{origin}: field `attention_mask` has zeros, so the row is padded; the packer takes unpadded rows. "
                "Tokenize with padding=False."
            )
    if encoded.get("position_ids") is not None:
        positions = _token_array(encoded["position_ids"], field="position_ids", origin=origin)
        _check_length(positions, length, field="position_ids", origin=origin)
        if position_ids_to_cu_seqlens(positions).size > 2:
            raise _already_packed(origin, "position_ids", "restarts")
    if encoded.get("seq_lengths") is not None:
        seq_lengths = _token_array(encoded["seq_lengths"], field="seq_lengths", origin=origin)
        if seq_lengths.tolist() != [length]:
            raise _already_packed(origin, "seq_lengths", f"is {seq_lengths.tolist()[:8]}")
    images = [key for key in IMAGE_FIELDS if encoded.get(key) is not None]
    if images:
        raise ValueError(
            f"{origin}: `{images[0]}` is an image field; the packer keeps only `input_ids` and `labels`, so the image "
            "placeholders would be trained without their images. Train image-text rows unpacked, collated by "
            "`flatcollate.vision.VisionDataCollatorWithFlattening.from_model(model)`."
        )
    unknown = unknown_per_token_keys(encoded, _KNOWN_KEYS, length)
    if unknown:
        where = "make `encode_fn` stop returning them" if from_encode_fn else "remove them from the rows"
        raise ValueError(
            f"{origin}: per-token field(s) {unknown} would be dropped by the packer, which keeps only `input_ids` and "
            f"`labels` (with `completion_mask` / `assistant_masks` folded in); {where} "
            "(e.g. `dataset.remove_columns(...)`) or fold them into `labels`."
        )


def _already_packed(origin: str, field: str, what: str) -> ValueError:
    return ValueError(
        f"{origin}: field `{field}` {what}, so the row holds several sequences already; the packer would merge them "
        "into one. Pass the unpacked rows, one sequence each."
    )


def _check_length(array: np.ndarray, length: int, *, field: str, origin: str) -> None:
    if array.size != length:
        raise ValueError(
            f"{origin}: field `{field}` has {array.size} entries but `input_ids` has {length}; "
            "they must be the same length (use -100 for labels that carry no loss)."
        )


def _token_array(value: Any, *, field: str, origin: str, allow_bool: bool = False) -> np.ndarray:
    """1-D int64 copy of a list, numpy array or tensor of ints (bools too for a mask); raises naming row and field."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    try:
        array = np.asarray(value)
    except ValueError as error:  # ragged nested lists
        raise TypeError(f"{origin}: field `{field}` is not a flat list of ints: {_short(value)}.") from error
    if array.ndim != 1:
        raise TypeError(f"{origin}: field `{field}` must be 1-D, got shape {tuple(array.shape)}: {_short(value)}.")
    if array.size and array.dtype.kind not in ("iub" if allow_bool else "iu"):
        raise TypeError(f"{origin}: field `{field}` must hold ints, got dtype {array.dtype}: {_short(value)}.")
    return array.astype(NP_IDS_DTYPE, copy=True)


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
