"""`DataCollatorForUnpairedPreference`: a batch of unpaired preference examples (KTO) as flattened rows.

Each example holds TRL's tokenized KTO columns: `prompt_ids`, `completion_ids`, a `label` (desirable or not) and,
for the KL term, `KL_completion_ids` (another example's completion, as `KTOTrainer` rotates them within a batch).
The completions make one row, the KL completions a second one under `KL_`-prefixed keys (TRL's padded layout, each
without its padding)::

    examples       (p0, c0, c2, True), (p1, c1, c0, False), (p2, c2, c1, True)    (prompt, completion, KL, label)
    input_ids      [p0 c0 | p1 c1 | p2 c2]         completion_mask  0 1 | 0 1 | 0 1
    KL_input_ids   [p0 c2 | p1 c0 | p2 c1]         KL_completion_mask
    label          [True False True]               (B,) bool

Each row carries restarting `position_ids`, `cu_seq_lens_q/k`, `max_length_q/k`, `labels` and `completion_mask`
`(1, T)`; `ref_logps` / `ref_KL_logps` `(B,)` come along when the examples carry them (precomputed reference
log-probabilities).
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .completions import check_batch, check_truncation, completion_row, example_values

UNPAIRED_FIELDS = ("prompt_ids", "completion_ids", "label")
KL_FIELD = "KL_completion_ids"
REFERENCE_FIELDS = ("ref_logps", "ref_KL_logps")
HINT = (
    f"unpaired preference examples hold {', '.join(UNPAIRED_FIELDS)} (and `{KL_FIELD}` for the KL term), as TRL's "
    "KTOTrainer tokenizes `prompt` / `completion` / `label` rows."
)


@dataclass
class DataCollatorForUnpairedPreference:
    """Flattens unpaired preference examples: `B` examples -> one row of `B` sequences, and one of their `B` KL
    sequences when the examples have `KL_completion_ids` (see the module docstring).

    Args:
        max_length (`int`, *optional*): longest `prompt + completion`; a longer one keeps its first `max_length`
            tokens, per sequence, as `trl.KTOTrainer`'s collator cuts it.

    >>> batch = DataCollatorForUnpairedPreference()(
    ...     [{"prompt_ids": [1, 2], "completion_ids": [3], "KL_completion_ids": [4, 5], "label": True},
    ...      {"prompt_ids": [6], "completion_ids": [4, 5], "KL_completion_ids": [3], "label": False}])
    >>> batch["input_ids"].tolist(), batch["cu_seq_lens_q"].tolist(), batch["completion_mask"].tolist()
    ([[1, 2, 3, 6, 4, 5]], [0, 3, 6], [[0, 0, 1, 0, 1, 1]])
    >>> batch["KL_input_ids"].tolist(), batch["KL_position_ids"].tolist(), batch["label"].tolist()
    ([[1, 2, 4, 5, 6, 3]], [[0, 1, 2, 3, 0, 1]], [True, False])
    """

    max_length: int | None = None

    def __post_init__(self):
        check_truncation(self.max_length, "keep_start")

    def __call__(self, examples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        check_batch(examples, kind="unpaired preference")
        batch = self._row(examples, "completion_ids")
        with_kl = [isinstance(example, Mapping) and KL_FIELD in example for example in examples]
        if any(with_kl) and not all(with_kl):
            raise ValueError(
                f"example {with_kl.index(False)} has no `{KL_FIELD}` while example {with_kl.index(True)} has one; "
                "TRL's KTOTrainer gives every example a KL completion (loss_type='kto') or none."
            )
        if all(with_kl):
            batch.update({f"KL_{key}": value for key, value in self._row(examples, KL_FIELD).items()})
        batch["label"] = torch.tensor([_label(example, index) for index, example in enumerate(examples)])
        return {**batch, **example_values(examples, REFERENCE_FIELDS)}

    def _row(self, examples: Sequence[Mapping[str, Any]], field: str) -> dict[str, Any]:
        # An empty completion is kept, as TRL keeps it: its sequence scores nothing (log-probability 0).
        return completion_row(examples, (field,), max_length=self.max_length, require_completion=False, hint=HINT)


def _label(example: Mapping[str, Any], index: int) -> bool | int:
    """`example["label"]` as TRL reads it: True or 1 (desirable), False or 0 (undesirable)."""
    if "label" not in example:
        raise ValueError(f"example {index} has no `label`: {HINT}")
    label = example["label"]
    if isinstance(label, np.generic) or (isinstance(label, torch.Tensor) and label.numel() == 1):
        label = label.item()
    if not isinstance(label, int):  # bool is an int
        raise TypeError(f"example {index}: `label` must be True/False (desirable or not) or 0/1, got {label!r:.80}.")
    if label not in (0, 1):
        raise ValueError(f"example {index}: `label` must be True/False (desirable or not) or 0/1, got {label}.")
    return label
