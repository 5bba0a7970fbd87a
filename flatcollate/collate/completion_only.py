"""`DataCollatorForCompletionOnlyLM`: train only on completions, found by their templates; flattened by default."""

import warnings
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
import torch

from .._conventions import IGNORE_INDEX
from ._features import as_1d_ints
from .flattening import DataCollatorWithFlattening
from .response_templates import completion_mask_after_last, completion_mask_turns, find_any, template_variants


class DataCollatorForCompletionOnlyLM:
    """Masks everything but the completions (label -100), then flattens the batch like `DataCollatorWithFlattening`.

    Compatible with the signature of TRL 0.x's class of the same name, which TRL no longer ships. Templates are found
    by searching their token ids in each example (vectorized, no loop over tokens)::

        single turn     [prompt ... ### Response: | completion ...]
        labels          [-100 ......................| trained .....]    (after the last response template)

        multi-turn      [### Human: q1 ### Assistant: | a1 ### Human: q2 ### Assistant: | a2]
        labels          [-100 ..........................| a1 | -100 ..........................| a2]

    A template string can tokenize differently inside a text than alone (a preceding newline or space merges into its
    first token). The collator also tries the template after a few common contexts; where none matches, pass the ids
    exactly as they appear in a tokenized example, e.g.
    `response_template=tokenizer.encode("\\n### Response:", add_special_tokens=False)[1:]`.

    Args:
        response_template (`str` or `list[int]`): marks the start of a completion.
        instruction_template (`str` or `list[int]`, *optional*): marks the start of a user turn (multi-turn).
        tokenizer (*optional*): needed for string templates, and for `padding_free=False` (its `pad_token_id`).
        mlm (`bool`, defaults to `False`): accepted for compatibility; must be `False`.
        ignore_index (`int`, defaults to -100): label of masked tokens.
        padding_free (`bool`, defaults to `True`): flatten the batch; `False` pads to the longest example and returns
            an `attention_mask` (the TRL 0.x default).
        on_missing_template (`"error"` or `"mask"`, defaults to `"error"`): what to do with an example whose response
            template is absent: raise, or mask the whole example with a warning.
        **flatten_kwargs: passed to `DataCollatorWithFlattening` (e.g. `pad_to_multiple_of`, `return_seq_idx`).

    >>> collator = DataCollatorForCompletionOnlyLM(response_template=[9, 9])
    >>> batch = collator([{"input_ids": [1, 2, 9, 9, 5, 6]}, {"input_ids": [9, 9, 7]}])
    >>> batch["labels"].tolist()
    [[-100, -100, -100, -100, 5, 6, -100, -100, 7]]
    """

    def __init__(
        self,
        response_template: str | list[int],
        instruction_template: str | list[int] | None = None,
        *,
        tokenizer=None,
        mlm: bool = False,
        ignore_index: int = IGNORE_INDEX,
        padding_free: bool = True,
        on_missing_template: Literal["error", "mask"] = "error",
        return_tensors: str = "pt",
        **flatten_kwargs,
    ):
        if mlm:
            raise ValueError("DataCollatorForCompletionOnlyLM trains causal LMs only; set mlm=False.")
        if on_missing_template not in ("error", "mask"):
            raise ValueError(f"on_missing_template must be 'error' or 'mask', got {on_missing_template!r}.")
        if not padding_free and (tokenizer is None or tokenizer.pad_token_id is None):
            raise ValueError("padding_free=False pads examples, so it needs a `tokenizer` with a `pad_token_id`.")
        self.response_template = response_template
        self.instruction_template = instruction_template
        self.tokenizer = tokenizer
        self.ignore_index = ignore_index
        self.padding_free = padding_free
        self.on_missing_template = on_missing_template
        self.return_tensors = return_tensors
        self.response_variants = template_variants(response_template, tokenizer)
        self.instruction_variants = (
            template_variants(instruction_template, tokenizer) if instruction_template is not None else None
        )
        self.flattener = DataCollatorWithFlattening(
            separator_id=ignore_index, return_tensors=return_tensors, **flatten_kwargs
        )

    def __call__(self, features: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        if len(features) == 0:
            raise ValueError("empty batch: the collator got no examples; check the sampler and `drop_last`.")
        masked, missing = [], []
        for index, feature in enumerate(features):  # one template search per example
            labels = self.completion_labels(feature, index=index)
            if labels is None:
                missing.append(index)
                labels = np.full(len(feature["input_ids"]), self.ignore_index, dtype=np.int64)
            masked.append({**feature, "labels": labels})
        if missing:
            warnings.warn(
                f"response template {self.response_template!r} not found in example(s) {missing}; their labels are "
                "all masked (on_missing_template='mask').",
                stacklevel=2,
            )
        if self.padding_free:
            return self.flattener(masked)
        return self._pad(masked)

    def completion_labels(self, feature: Mapping[str, Any], *, index: int) -> np.ndarray | None:
        """Labels of one example with everything but completions set to `ignore_index`; None if no template."""
        if not isinstance(feature, Mapping) or "input_ids" not in feature:
            raise ValueError(f"example {index} must be a dict with 'input_ids'.")
        ids = as_1d_ints(feature["input_ids"], index=index, field="input_ids")
        labels = ids
        if feature.get("labels") is not None:
            labels = as_1d_ints(feature["labels"], index=index, field="labels")
        _, response_ends = find_any(ids, self.response_variants)
        if response_ends.size == 0:
            if self.on_missing_template == "error":
                raise ValueError(
                    f"example {index}: response template {self.response_template!r} not found in 'input_ids'. "
                    "It may tokenize differently in context: pass it as token ids taken from a tokenized example, "
                    "or set on_missing_template='mask' to skip such examples' loss."
                )
            return None
        if self.instruction_variants is None:
            keep = completion_mask_after_last(len(ids), response_ends)
        else:
            instruction_starts, _ = find_any(ids, self.instruction_variants)
            keep = completion_mask_turns(len(ids), response_ends, instruction_starts)
        return np.where(keep, labels, self.ignore_index)

    def _pad(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        """Right-pad to the longest example with an attention mask (the non-flattened layout)."""
        ids = [as_1d_ints(f["input_ids"], index=i, field="input_ids") for i, f in enumerate(features)]
        longest = max(len(x) for x in ids)
        input_ids = np.full((len(ids), longest), self.tokenizer.pad_token_id, dtype=np.int64)
        labels = np.full((len(ids), longest), self.ignore_index, dtype=np.int64)
        attention_mask = np.zeros((len(ids), longest), dtype=np.int64)
        for row, (x, feature) in enumerate(zip(ids, features, strict=True)):  # one copy per example
            input_ids[row, : len(x)] = x
            labels[row, : len(x)] = feature["labels"]
            attention_mask[row, : len(x)] = 1
        batch = {"input_ids": input_ids, "labels": labels, "attention_mask": attention_mask}
        if self.return_tensors == "pt":
            return {k: torch.from_numpy(v) for k, v in batch.items()}
        return batch
