"""Turning one source row into token sequences that fit a pack: encode, validate, handle over-long sequences."""

from collections.abc import Callable, Mapping
from typing import Any, Literal

import numpy as np
import torch

from .._conventions import NP_IDS_DTYPE

Overlong = Literal["error", "split", "truncate"]
OVERLONG_CHOICES = ("error", "split", "truncate")

EncodeFn = Callable[[Mapping[str, Any]], Mapping[str, Any]]


def encode_row(row: Any, *, encode_fn: EncodeFn | None, origin: str) -> tuple[np.ndarray, np.ndarray]:
    """Encode and validate one row.

    Args:
        row: a mapping; with `encode_fn=None` it must already hold `input_ids` (and optionally `labels`).
        encode_fn: per-row callable returning `{"input_ids", "labels"}` (token ids, 1-D ints).
        origin (`str`): where the row came from, for error messages (`"row 12"`).

    Returns:
        `(input_ids, labels)`, both `np.ndarray` of shape `(L,)`, int64; labels default to a copy of the ids.

    >>> ids, labels = encode_row({"input_ids": [5, 6, 7]}, encode_fn=None, origin="row 0")
    >>> ids.tolist(), labels.tolist()
    ([5, 6, 7], [5, 6, 7])
    """
    if not isinstance(row, Mapping):
        raise TypeError(f"{origin}: expected a mapping (dict) row, got {type(row).__name__}: {_short(row)}.")
    encoded = encode_fn(row) if encode_fn is not None else row
    if not isinstance(encoded, Mapping):
        raise TypeError(f"{origin}: `encode_fn` must return a mapping with `input_ids`, got {type(encoded).__name__}.")
    if "input_ids" not in encoded:
        fix = "make `encode_fn` return it" if encode_fn is not None else "tokenize first or pass `encode_fn=`"
        raise ValueError(f"{origin}: field `input_ids` is missing (fields: {sorted(encoded)}); {fix}.")
    input_ids = _token_array(encoded["input_ids"], field="input_ids", origin=origin)
    if input_ids.size == 0:
        raise ValueError(f"{origin}: field `input_ids` is empty; filter out empty rows before packing.")
    if input_ids.min() < 0:
        raise ValueError(f"{origin}: field `input_ids` holds a negative id ({int(input_ids.min())}); ids must be >= 0.")
    if encoded.get("labels") is None:
        return input_ids, input_ids.copy()
    labels = _token_array(encoded["labels"], field="labels", origin=origin)
    if labels.shape != input_ids.shape:
        raise ValueError(
            f"{origin}: field `labels` has {labels.size} entries but `input_ids` has {input_ids.size}; "
            "they must be the same length (use -100 for tokens that carry no loss)."
        )
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


def _token_array(value: Any, *, field: str, origin: str) -> np.ndarray:
    """1-D int64 copy of a list, numpy array or tensor of token ids; raises naming the row and field."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    try:
        array = np.asarray(value)
    except ValueError as error:  # ragged nested lists
        raise TypeError(f"{origin}: field `{field}` is not a flat list of ints: {_short(value)}.") from error
    if array.ndim != 1:
        raise TypeError(f"{origin}: field `{field}` must be 1-D, got shape {tuple(array.shape)}: {_short(value)}.")
    if array.size and array.dtype.kind not in "iu":
        raise TypeError(f"{origin}: field `{field}` must hold ints, got dtype {array.dtype}: {_short(value)}.")
    return array.astype(NP_IDS_DTYPE, copy=True)


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
