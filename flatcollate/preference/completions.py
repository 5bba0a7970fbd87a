"""Prompt + completion sequences as one flattened row: the core of the preference collators.

Each example holds a tokenized prompt and one or more tokenized completions (TRL's `*_ids` columns). For each
completion field in turn, every example's `prompt + completion` joins the row, in example order::

    examples      (p0, c0, r0), (p1, c1, r1)          fields ("chosen_ids", "rejected_ids")
    row           [p0 c0 | p1 c1 | p0 r0 | p1 r1]     sequence k of the row = row k of TRL's padded batch
    completion     0  1  | 0  1  | 0  1  | 0  1

A sequence longer than `max_length` is cut as TRL's collators cut it, before flattening: its first `max_length`
tokens (`"keep_start"`) or its last (`"keep_end"`).
"""

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from ..collate import DataCollatorWithFlattening

TRUNCATION_MODES = ("keep_start", "keep_end")


def check_truncation(max_length: int | None, truncation_mode: str) -> None:
    """Raise for a `truncation_mode` TRL does not have or a `max_length` that is not a positive number of tokens."""
    if truncation_mode not in TRUNCATION_MODES:
        raise ValueError(f"truncation_mode must be one of {TRUNCATION_MODES}, got {truncation_mode!r}.")
    if max_length is not None and (isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1):
        raise ValueError(f"max_length must be a positive number of tokens or None, got {max_length!r}.")


def check_batch(examples: Any, *, kind: str) -> None:
    """Raise unless `examples` is a non-empty list of examples; `kind` names them in the message."""
    if isinstance(examples, Mapping) or not isinstance(examples, Sequence) or len(examples) == 0:
        raise ValueError(f"a {kind} batch is a non-empty list of examples (dicts), got {type(examples).__name__}.")


def token_ids(example: Any, field: str, index: int, *, hint: str) -> list[int]:
    """`example[field]` as a list of token ids; `hint` says which fields the examples hold and where they come from.

    >>> token_ids({"prompt_ids": [1, 2]}, "prompt_ids", 0, hint="")
    [1, 2]
    """
    if not isinstance(example, Mapping) or field not in example:
        raise ValueError(f"example {index} has no `{field}`: {hint}")
    value = example[field]
    if isinstance(value, torch.Tensor | np.ndarray):
        value = value.tolist()
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise TypeError(f"example {index}: `{field}` must be a list of token ids (int), got {value!r:.80}.")
    return value


def completion_row(
    examples: Sequence[Mapping[str, Any]],
    fields: Sequence[str],
    *,
    max_length: int | None = None,
    truncation_mode: str = "keep_start",
    require_completion: bool = True,
    hint: str = "",
) -> dict[str, Any]:
    """Flatten `prompt_ids + example[field]` for each field, then each example, into one row.

    Args:
        examples: dicts with `prompt_ids` and every field of `fields` (lists of token ids).
        fields: the completion fields, in row order.
        max_length: longest sequence; a longer one is cut by `truncation_mode`.
        truncation_mode: `"keep_start"` or `"keep_end"`.
        require_completion: raise for an empty completion (before truncation).
        hint: which fields the examples hold, for the error raised when one is missing.

    Returns:
        `input_ids`, `labels` (completion tokens, -100 elsewhere and on each sequence's first token),
        `position_ids`, `completion_mask` `(1, T)` int64; `cu_seq_lens_q/k` `(len(fields) * B + 1,)` int32;
        `max_length_q/k` Python ints.

    >>> examples = [{"prompt_ids": [1, 2], "completion_ids": [3]}, {"prompt_ids": [4], "completion_ids": [5]}]
    >>> row = completion_row(examples, ["completion_ids"])
    >>> row["input_ids"].tolist(), row["completion_mask"].tolist(), row["cu_seq_lens_q"].tolist()
    ([[1, 2, 3, 4, 5]], [[0, 0, 1, 0, 1]], [0, 3, 5])
    """
    sequences = []
    for field in fields:  # one list concatenation per sequence: the ids arrive as Python lists
        for index, example in enumerate(examples):
            prompt, completion = (token_ids(example, name, index, hint=hint) for name in ("prompt_ids", field))
            if not completion and (require_completion or not prompt):
                problem = "is empty" if prompt else "and `prompt_ids` are both empty"
                raise ValueError(
                    f"example {index}: `{field}` {problem}, so the sequence has nothing to score; drop the example or "
                    "give it a completion."
                )
            cut = _cut(len(prompt) + len(completion), max_length, truncation_mode)
            mask = np.repeat(np.array([0, 1], dtype=np.int64), [len(prompt), len(completion)])
            sequences.append({"input_ids": (prompt + completion)[cut], "completion_mask": mask[cut]})
    row = DataCollatorWithFlattening(return_seq_idx=False)(sequences)
    row["completion_mask"] = torch.from_numpy(np.concatenate([s["completion_mask"] for s in sequences]))[None]
    return row


def example_values(examples: Sequence[Mapping[str, Any]], fields: Sequence[str]) -> dict[str, torch.Tensor]:
    """`(B,)` float32 tensors of the per-example numbers (e.g. precomputed reference log-probabilities) among `fields`
    that the examples carry: in every example or in none.

    >>> example_values([{"ref_logps": -1.5}, {"ref_logps": -2.0}], ["ref_logps", "ref_KL_logps"])
    {'ref_logps': tensor([-1.5000, -2.0000])}
    """
    values = {}
    for field in fields:
        present = [isinstance(example, Mapping) and field in example for example in examples]
        if any(present) and not all(present):
            raise ValueError(
                f"`{field}` is in some examples of the batch and not in others: missing from example "
                f"{present.index(False)}. Give every example one (precompute them over the whole dataset) or none."
            )
        if all(present):
            values[field] = torch.tensor([float(example[field]) for example in examples])
    return values


def _cut(length: int, max_length: int | None, truncation_mode: str) -> slice:
    if max_length is None or length <= max_length:
        return slice(None)
    return slice(None, max_length) if truncation_mode == "keep_start" else slice(-max_length, None)
