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

from .completions import check_batch, check_truncation, completion_row, example_values

PAIR_FIELDS = ("prompt_ids", "chosen_ids", "rejected_ids")
REFERENCE_FIELDS = ("ref_chosen_logps", "ref_rejected_logps")
HINT = (
    f"preference examples hold {', '.join(PAIR_FIELDS)} (token ids), as TRL's DPOTrainer tokenizes `prompt` / "
    "`chosen` / `rejected` rows."
)


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
        check_truncation(self.max_length, self.truncation_mode)

    def __call__(self, examples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        check_batch(examples, kind="preference")
        batch = completion_row(
            examples,
            ("chosen_ids", "rejected_ids"),
            max_length=self.max_length,
            truncation_mode=self.truncation_mode,
            hint=HINT,
        )
        return {**batch, **example_values(examples, REFERENCE_FIELDS)}
