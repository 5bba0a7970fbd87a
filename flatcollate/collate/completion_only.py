"""`DataCollatorForCompletionOnlyLM`: train only on completions, found by their templates; flattened by default."""

import warnings
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
import torch

from .._conventions import IGNORE_INDEX, NP_IDS_DTYPE
from ..boundaries import lengths_to_cu_seqlens
from .features import as_1d_ints, as_example, check_same_length, segment_lengths
from .flatten import flatten_features
from .flattening import DataCollatorWithFlattening
from .padding import pad_flat
from .response_templates import (
    completion_mask_after_last,
    completion_mask_turns,
    decoded_with_offsets,
    find_template,
    sequences_without,
    template_variants,
)


class DataCollatorForCompletionOnlyLM:
    """Masks everything but the completions (label -100), then flattens the batch like `DataCollatorWithFlattening`.

    A drop-in for TRL 0.x's class of the same name, which TRL no longer ships: same positional arguments
    (`response_template, instruction_template, tokenizer`), examples as dicts or as bare sequences of token ids,
    `torch_call` / `numpy_call`, padded rows on the tokenizer's `padding_side` with `padding_free=False`. Deliberate
    differences (flattened by default, tokens equal to the pad id keep their labels, a missing template raises unless
    `on_missing_template="mask"`, bad input raises) are listed in docs/peers.md. Templates are found by searching their
    token ids in each example (vectorized, no loop over tokens)::

        single turn     [prompt ... ### Response: | completion ...]
        labels          [-100 ......................| trained .....]    (after the last response template)

        multi-turn      [### Human: q1 ### Assistant: | a1 ### Human: q2 ### Assistant: | a2]
        labels          [-100 ..........................| a1 | -100 ..........................| a2]

    A template string can tokenize differently inside a text than alone (Qwen2.5 merges `:` with the newline after
    `### Response:`). With a fast tokenizer, a string template is found in the decoded text by character offsets, so
    its neighbours' merges do not matter; a token it shares with its neighbour belongs to the template. Ids given as
    ids (and ids a tokenizer does not give back from their own text) are searched by id, also after a few common
    contexts for a string.

    Args:
        response_template (`str` or `list[int]`): marks the start of a completion.
        instruction_template (`str` or `list[int]`, *optional*): marks the start of a user turn (multi-turn).
        tokenizer (*optional*): needed for string templates, and for `padding_free=False` (its `pad_token_id` and
            `padding_side`, read at every call). A tokenizer without a pad token needs one set first, e.g.
            `tokenizer.pad_token = tokenizer.eos_token`: tokens equal to the pad id keep their labels.
        mlm (`bool`, defaults to `False`): accepted for compatibility; must be `False`.
        ignore_index (`int`, defaults to -100): label of masked tokens in the output (`labels` given in the examples
            mark masked tokens with -100).
        padding_free (`bool`, defaults to `True`): flatten the batch; `False` pads to the longest example (rounded up
            to `pad_to_multiple_of`) on the tokenizer's `padding_side` and returns an `attention_mask` (the TRL 0.x
            default). Both modes validate examples like `DataCollatorWithFlattening` and fold `completion_mask` /
            `assistant_masks` into `labels`.
        on_missing_template (`"error"` or `"mask"`, defaults to `"error"`): what to do with an example that lacks the
            response template, or the instruction template when one is given: raise naming the example and the
            template, or mask the whole example with a warning (TRL 0.x's behaviour). A packed example is judged per
            sequence.
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
        tokenizer=None,
        *,
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
        # String templates are found in the decoded text by character offsets (ids by id).
        self._by_text = isinstance(response_template, str) or isinstance(instruction_template, str)
        self.flattener = DataCollatorWithFlattening(
            separator_id=IGNORE_INDEX, return_tensors=return_tensors, **flatten_kwargs
        )
        if not padding_free:
            self._check_pad_token()

    def __call__(
        self, features: Sequence[Mapping[str, Any] | Sequence[int]], return_tensors: str | None = None
    ) -> dict[str, Any]:
        """Mask and collate a batch.

        Args:
            features: examples, each a dict with `input_ids` (and optional `labels`, `completion_mask`,
                `assistant_masks`, `seq_lengths`, `position_ids`) or a bare sequence of token ids.
            return_tensors (`"pt"` or `"np"`, *optional*): overrides the constructor's choice.

        Returns:
            flattened: the keys of `DataCollatorWithFlattening`; padded: `input_ids`, `labels`, `attention_mask`, each
            `(B, W)` int64.
        """
        return_tensors = return_tensors or self.return_tensors
        if return_tensors not in ("pt", "np"):
            raise ValueError(f"return_tensors must be 'pt' or 'np', got {return_tensors!r}.")
        if isinstance(features, Mapping) or not isinstance(features, Sequence):
            raise TypeError(f"features must be a list of examples, got {type(features).__name__}.")
        if len(features) == 0:
            raise ValueError("empty batch: the collator got no examples; check the sampler and `drop_last`.")
        features = [as_example(feature, index=index) for index, feature in enumerate(features)]
        masked = []
        missing: dict[str, list[int]] = {"response": [], "instruction": []}
        for index, feature in enumerate(features):  # one template search per example
            labels, absent = self.completion_labels(feature, index=index)
            for kind in absent:
                missing[kind].append(index)
            masked.append({**feature, "labels": labels})
        for kind, indices in missing.items():
            if indices:
                warnings.warn(
                    f"{kind} template {self._template(kind)!r} not found in example(s) {indices}; those examples (or "
                    "their packed sequences lacking it) get no loss (on_missing_template='mask').",
                    stacklevel=2,
                )
        if self.padding_free:
            batch = self.flattener(masked, return_tensors=return_tensors)
        else:
            batch = self._pad(masked, return_tensors=return_tensors)
        if self.ignore_index != IGNORE_INDEX:  # masks are folded with the library's -100 (the only value checks allow)
            batch["labels"][batch["labels"] == IGNORE_INDEX] = self.ignore_index
        return batch

    def torch_call(self, examples: Sequence[Mapping[str, Any] | Sequence[int]]) -> dict[str, Any]:
        """The batch as torch tensors (the method TRL 0.x's collator, a transformers `DataCollatorMixin`, had)."""
        return self(examples, return_tensors="pt")

    def numpy_call(self, examples: Sequence[Mapping[str, Any] | Sequence[int]]) -> dict[str, Any]:
        """The batch as numpy arrays."""
        return self(examples, return_tensors="np")

    def completion_labels(self, feature: Mapping[str, Any], *, index: int) -> tuple[np.ndarray, list[str]]:
        """Labels of one example with everything but completions masked, and the templates it lacks.

        Each sequence of a packed example (`seq_lengths`, or restarting `position_ids`) is masked on its own::

            packed          [### Human: q ### Assistant: a | p ### Human: q ### Assistant: a]
            trained         [0 ........................... 1 | 0 ........................... 1]

        Args:
            feature: one example with `input_ids` and optional `labels` (one entry per token, -100 where masked).
            index: position of the example in the batch, for error messages.

        Returns:
            `labels` of shape `(L,)`, int64, -100 outside completions; and `["response"]`, `["instruction"]`, both
            or none. A sequence lacking a template raises (`on_missing_template="error"`) or is masked whole
            (`"mask"`), as TRL 0.x did for an example.
        """
        feature = as_example(feature, index=index)
        ids = as_1d_ints(feature["input_ids"], index=index, field="input_ids")
        labels = ids
        if feature.get("labels") is not None:
            labels = as_1d_ints(feature["labels"], index=index, field="labels")
            check_same_length(labels, len(ids), index=index, field="labels")
        bounds = np.zeros(1, dtype=NP_IDS_DTYPE)
        if ids.size and ("seq_lengths" in feature or "position_ids" in feature):
            bounds = lengths_to_cu_seqlens(segment_lengths(feature, len(ids), index=index))[:-1].astype(NP_IDS_DTYPE)
        decoded = decoded_with_offsets(ids, self.tokenizer) if self._by_text else None
        response_ends = find_template(ids, self.response_template, self.response_variants, bounds, decoded)[1]
        missing = {"response": sequences_without(response_ends - 1, bounds)}
        if self.instruction_variants is None:
            keep = completion_mask_after_last(len(ids), response_ends, bounds)
        else:
            template, variants = self.instruction_template, self.instruction_variants
            instruction_starts = find_template(ids, template, variants, bounds, decoded)[0]
            missing["instruction"] = sequences_without(instruction_starts, bounds)
            # every sequence start closes a completion, like an instruction template
            keep = completion_mask_turns(len(ids), response_ends, np.union1d(instruction_starts, bounds))
        absent = [kind for kind, sequences in missing.items() if sequences.size]
        if absent and self.on_missing_template == "error":
            kind = absent[0]
            where = f" (packed sequence(s) {missing[kind].tolist()})" if bounds.size > 1 else ""
            raise ValueError(
                f"example {index}: {kind} template {self._template(kind)!r} not found in 'input_ids'{where}. "
                "It may tokenize differently in context: pass it as token ids taken from a tokenized example, "
                "or set on_missing_template='mask' to skip such examples' loss."
            )
        if absent:  # mask the sequences lacking a template
            lacking = np.concatenate(list(missing.values()))
            keep &= ~np.isin(np.searchsorted(bounds, np.arange(len(ids)), side="right") - 1, lacking)
        return np.where(keep, labels, IGNORE_INDEX), absent

    def _template(self, kind: str) -> str | list[int]:
        return self.response_template if kind == "response" else self.instruction_template

    def _check_pad_token(self) -> None:
        if self.tokenizer is None:
            raise ValueError(
                "padding_free=False pads examples, so it needs a `tokenizer` (for its `pad_token_id` and "
                "`padding_side`); pass one, or keep padding_free=True, which needs no padding."
            )
        if self.tokenizer.pad_token_id is None:
            raise ValueError(
                "padding_free=False pads examples, but the tokenizer has no pad token. Set one first, e.g. "
                "`tokenizer.pad_token = tokenizer.eos_token` (tokens equal to the pad id keep their labels here, so "
                "the EOS is still trained), or keep padding_free=True, which needs no padding."
            )

    def _pad(self, features: list[dict[str, Any]], *, return_tensors: str) -> dict[str, Any]:
        """Pad to the longest example on the tokenizer's `padding_side`, with an attention mask (unflattened layout).

        Examples are validated and concatenated by `flatten_features`, exactly as when flattening, then scattered into
        rows.
        """
        self._check_pad_token()
        flattener = self.flattener
        flat = flatten_features(features, vocab_size=flattener.vocab_size, max_seq_len=flattener.max_seq_len)
        batch = pad_flat(
            flat,
            pad_token_id=self.tokenizer.pad_token_id,
            pad_to_multiple_of=flattener.pad_to_multiple_of,
            padding_side=getattr(self.tokenizer, "padding_side", "right"),
        )
        if return_tensors == "pt":
            return {k: torch.from_numpy(v) for k, v in batch.items()}
        return batch
