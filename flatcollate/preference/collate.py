"""`DataCollatorForPreference`: a batch of preference pairs as one flattened row of `2N` sequences.

Each example holds TRL's tokenized preference columns, `prompt_ids`, `chosen_ids` and `rejected_ids`. The row holds
every `prompt + chosen` in example order, then every `prompt + rejected` (TRL's padded layout, `[chosen; rejected]`,
without the padding)::

    examples     (p0, c0, r0), (p1, c1, r1)
    row          [p0 c0 | p1 c1 | p0 r0 | p1 r1]          sequence k of the row = row k of TRL's padded batch
    completion    0  1  | 0  1  | 0  1  | 0  1

The batch carries restarting `position_ids`, `cu_seq_lens_q/k`, `max_length_q/k`, `labels` (the completion tokens,
-100 elsewhere and on the first token of every sequence) and `completion_mask` `(1, T)`, plus `ref_chosen_logps` /
`ref_rejected_logps` `(N,)` when the examples carry them (precomputed reference log-probabilities).
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..collate import DataCollatorWithFlattening

PAIR_FIELDS = ("prompt_ids", "chosen_ids", "rejected_ids")
REFERENCE_FIELDS = ("ref_chosen_logps", "ref_rejected_logps")
TRUNCATION_MODES = ("keep_start", "keep_end")


@dataclass
class DataCollatorForPreference:
    """Flattens preference pairs: `N` examples -> one row of `2N` sequences, chosen first (see the module docstring).

    Args:
        max_length (`int`, *optional*): longest `prompt + completion`; a longer one is truncated as TRL truncates it
            (`truncation_mode`), per sequence.
        truncation_mode (`str`, defaults to `"keep_start"`): `"keep_start"` or `"keep_end"`.

    >>> batch = DataCollatorForPreference()([{"prompt_ids": [1, 2], "chosen_ids": [3], "rejected_ids": [4, 5]}])
    >>> batch["input_ids"].tolist(), batch["position_ids"].tolist()
    ([[1, 2, 3, 1, 2, 4, 5]], [[0, 1, 2, 0, 1, 2, 3]])
    >>> batch["completion_mask"].tolist(), batch["labels"].tolist()
    ([[0, 0, 1, 0, 0, 1, 1]], [[-100, -100, 3, -100, -100, 4, 5]])
    """

    max_length: int | None = None
    truncation_mode: str = "keep_start"

    def __post_init__(self):
        if self.truncation_mode not in TRUNCATION_MODES:
            raise ValueError(f"truncation_mode must be one of {TRUNCATION_MODES}, got {self.truncation_mode!r}.")
        if self.max_length is not None and self.max_length < 1:
            raise ValueError(f"max_length must be a positive number of tokens, got {self.max_length}.")
        self._flatten = DataCollatorWithFlattening(return_seq_idx=False)

    def __call__(self, examples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        if isinstance(examples, Mapping) or not isinstance(examples, Sequence) or len(examples) == 0:
            raise ValueError("a preference batch is a non-empty list of examples (dicts).")
        sequences, masks = [], []
        for side in ("chosen_ids", "rejected_ids"):
            for index, example in enumerate(examples):
                prompt, completion = (_ids(example, field, index) for field in ("prompt_ids", side))
                if not completion:
                    raise ValueError(
                        f"example {index}: `{side}` is empty, so the pair has nothing to compare; drop the example or "
                        "give it a completion."
                    )
                sequence, mask = prompt + completion, [0] * len(prompt) + [1] * len(completion)
                cut = self._cut(len(sequence))
                sequences.append(sequence[cut])
                masks.append(mask[cut])
        batch = self._flatten([{"input_ids": s, "completion_mask": m} for s, m in zip(sequences, masks, strict=True)])
        batch["completion_mask"] = torch.from_numpy(np.concatenate([np.asarray(m, dtype=np.int64) for m in masks]))[
            None
        ]
        for field in REFERENCE_FIELDS:
            present = [field in example for example in examples]
            if any(present) and not all(present):
                raise ValueError(f"`{field}` is in some examples of the batch and not in others ({present}).")
            if all(present):
                batch[field] = torch.tensor([float(example[field]) for example in examples])
        return batch

    def _cut(self, length: int) -> slice:
        if self.max_length is None or length <= self.max_length:
            return slice(None)
        return slice(None, self.max_length) if self.truncation_mode == "keep_start" else slice(-self.max_length, None)


def _ids(example: Mapping, field: str, index: int) -> list[int]:
    if not isinstance(example, Mapping) or field not in example:
        raise ValueError(
            f"example {index} has no `{field}`: preference examples hold {', '.join(PAIR_FIELDS)} (token ids), as "
            "TRL's DPOTrainer tokenizes `prompt` / `chosen` / `rejected` rows."
        )
    value = example[field]
    if isinstance(value, torch.Tensor | np.ndarray):
        value = value.tolist()
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise TypeError(f"example {index}: `{field}` must be a list of token ids (int), got {value!r:.80}.")
    return value
