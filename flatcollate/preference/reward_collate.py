"""`DataCollatorForRewardPairs`: a batch of preference pairs as one flattened row, for reward-model training.

TRL's `RewardTrainer` pads the chosen sequences, then the rejected ones, into 2B rows and splits the scores in two
halves. This collator keeps that order with no padding: every chosen sequence, then every rejected one, back to back::

    pairs          (c0, r0) (c1, r1)        c0 = [1 2 3]  r0 = [4 5]  c1 = [6 7]  r1 = [8]
    input_ids      [1 2 3 | 6 7 | 4 5 | 8]             (1, T) int64
    position_ids   [0 1 2 | 0 1 | 0 1 | 0]             (1, T) int64
    cu_seq_lens_q  [0 3 5 7 8]                         (2B + 1,) int32
    margin         [m0 m1]                             (B,) float32, when the pairs have one

`flatcollate.preference.sequence_scores` then gives `(2B, 1)` scores: chosen first, rejected second.
"""

from collections.abc import Mapping, Sequence
from numbers import Real
from typing import Any

import numpy as np
import torch

from ..boundaries import lengths_to_cu_seqlens
from ..collate import DataCollatorWithFlattening
from ..collate.features import as_1d_ints, check_token_range

PAIR_FIELDS = ("chosen_ids", "rejected_ids")
"""Token-id fields of a tokenized pair (what `trl.RewardTrainer` prepares from `chosen` / `rejected` text)."""


def pair_sequences(
    features: Sequence[Mapping[str, Any]], *, vocab_size: int | None = None, max_seq_len: int | None = None
) -> tuple[list[np.ndarray], np.ndarray | None]:
    """Validate a batch of pairs: their sequences in row order (every chosen one, then every rejected one) and margins.

    Args:
        features: pairs with `chosen_ids`, `rejected_ids` (lists, arrays or tensors of ints) and optionally `margin`
            (a number, in every pair or in none).
        vocab_size: when given, ids outside `[0, vocab_size)` raise.
        max_seq_len: when given, a sequence longer than this raises (nothing is truncated).

    Returns:
        `2B` int64 arrays (chosen sequences, then rejected ones) and the margins `(B,)` float32, or None.

    >>> sequences, margins = pair_sequences([{"chosen_ids": [1, 2], "rejected_ids": [3]}])
    >>> [s.tolist() for s in sequences], margins
    ([[1, 2], [3]], None)
    """
    if isinstance(features, Mapping) or not isinstance(features, Sequence):
        raise TypeError(f"features must be a list of pairs (dicts), got {type(features).__name__}.")
    if len(features) == 0:
        raise ValueError("empty batch: the collator got no pairs; check the sampler and `drop_last`.")
    with_margin = isinstance(features[0], Mapping) and "margin" in features[0]
    fields: dict[str, list[np.ndarray]] = {field: [] for field in PAIR_FIELDS}
    margins = []
    for index, feature in enumerate(features):  # one pass per pair: each field checked where it can be named
        if not isinstance(feature, Mapping):
            raise TypeError(f"example {index} must be a dict with {list(PAIR_FIELDS)}, got {type(feature).__name__}.")
        for field, arrays in fields.items():
            if field not in feature:
                raise ValueError(
                    f"example {index} has no '{field}' (fields: {sorted(feature)}); reward training takes tokenized "
                    "pairs, e.g. as `trl.RewardTrainer` prepares them from `chosen` / `rejected` text."
                )
            ids = as_1d_ints(feature[field], index=index, field=field)
            if ids.size == 0 or (max_seq_len is not None and ids.size > max_seq_len):
                problem = "is empty" if ids.size == 0 else f"has {ids.size} tokens > max_seq_len={max_seq_len}"
                raise ValueError(f"example {index}: field '{field}' {problem}; drop or shorten the pair beforehand.")
            arrays.append(ids)
        if ("margin" in feature) != with_margin:
            raise ValueError(
                f"example {index} {'lacks' if with_margin else 'has'} a 'margin' while example 0 "
                f"{'has' if with_margin else 'lacks'} one; give every pair a margin or none."
            )
        if with_margin:
            if not isinstance(feature["margin"], Real):
                raise TypeError(f"example {index}: 'margin' must be a number, got {type(feature['margin']).__name__}.")
            margins.append(feature["margin"])
    for field, arrays in fields.items():  # one vectorized range check per field, naming the first bad pair
        offsets = lengths_to_cu_seqlens(np.array([len(ids) for ids in arrays]))
        check_token_range(np.concatenate(arrays), offsets, field=field, vocab_size=vocab_size)
    margin = np.asarray(margins, dtype=np.float32) if with_margin else None
    return [*fields["chosen_ids"], *fields["rejected_ids"]], margin


class DataCollatorForRewardPairs:
    """Collates preference pairs into one flattened row: every chosen sequence, then every rejected one.

    The row carries what `DataCollatorWithFlattening` emits (`input_ids`, `position_ids`, `seq_idx`, `cu_seq_lens_q/k`,
    `max_length_q/k`), no `labels`, and `margin` when the pairs have one. See the module docstring for a drawing.

    Args:
        vocab_size (`int`, *optional*): when given, ids outside `[0, vocab_size)` raise.
        max_seq_len (`int`, *optional*): when given, a sequence longer than this raises.
        return_tensors (`str`, defaults to `"pt"`): `"pt"` or `"np"`.

    >>> batch = DataCollatorForRewardPairs()([{"chosen_ids": [1, 2, 3], "rejected_ids": [4, 5], "margin": 0.5},
    ...                                       {"chosen_ids": [6, 7], "rejected_ids": [8], "margin": 0.0}])
    >>> batch["input_ids"].tolist(), batch["cu_seq_lens_q"].tolist(), batch["margin"].tolist()
    ([[1, 2, 3, 6, 7, 4, 5, 8]], [0, 3, 5, 7, 8], [0.5, 0.0])
    """

    def __init__(self, *, vocab_size: int | None = None, max_seq_len: int | None = None, return_tensors: str = "pt"):
        self.vocab_size = vocab_size
        self.max_seq_len = max_seq_len
        self.return_tensors = return_tensors
        self._flatten = DataCollatorWithFlattening()

    def __call__(self, features: Sequence[Mapping[str, Any]], return_tensors: str | None = None) -> dict[str, Any]:
        return_tensors = return_tensors or self.return_tensors
        sequences, margin = pair_sequences(features, vocab_size=self.vocab_size, max_seq_len=self.max_seq_len)
        batch = self._flatten([{"input_ids": ids} for ids in sequences], return_tensors=return_tensors)
        del batch["labels"]  # a reward model is trained on scores, not on tokens
        if margin is not None:
            batch["margin"] = torch.from_numpy(margin) if return_tensors == "pt" else margin
        return batch
