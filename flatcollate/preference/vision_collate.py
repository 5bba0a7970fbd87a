"""`VisionDataCollatorForPreference`: image-text preference pairs as one flattened row of `2N` sequences.

TRL's `DataCollatorForVisionPreference` processes each batch on the fly: the prompts with their images (the processor
expands the image placeholders), repeated for chosen and rejected, then the completions as text, then pads. This
collator processes each example's prompt with its own images and each completion alone, with the same processor calls
(`add_special_tokens=False`), and flattens the `2N` sequences with `flatcollate.vision.VisionDataCollatorWithFlattening`
in TRL's row order, every chosen one then every rejected one. Each pair's images appear twice, once per sequence, as
TRL's collator repeats them::

    examples      (p0 + img0, c0, r0), (p1 + img1, c1, r1)
    row           [p0 c0 | p1 c1 | p0 r0 | p1 r1]          sequence k of the row = row k of TRL's padded batch
    completion     0  1  | 0  1  | 0  1  | 0  1
    images        img0   | img1  | img0  | img1            `pixel_values`, `image_grid_thw`, ... in sequence order
    token types   prompt's own, 0 on the completion        (`mm_token_type_ids` / `token_type_ids`)

Multimodal positions (Qwen2/2.5-VL's mRoPE) are not in the batch: a model prepared with
`flatcollate.prepare_model_for_flattening` computes them per sequence.
"""

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from .._conventions import TOKEN_TYPE_FIELDS
from ..vision import VisionDataCollatorWithFlattening
from .completions import check_batch, check_truncation

TEXT_FIELDS = ("prompt", "chosen", "rejected")
PROCESSOR_TEXT = ("input_ids", "attention_mask", *TOKEN_TYPE_FIELDS)
"""Per-token fields of a processor's output; every other field is a vision field (`pixel_values`, ...)."""


class VisionDataCollatorForPreference:
    """Flattens image-text preference pairs: `N` examples -> one row of `2N` sequences, chosen first (see the module
    docstring).

    Each example holds `prompt`, `chosen` and `rejected` (text, the prompt with the processor's image placeholders,
    e.g. `<|vision_start|><|image_pad|><|vision_end|>`) and `images` (a list, possibly empty) or `image`: TRL's
    standard vision preference rows. Conversational rows are refused (TRL renders them inside its collator).

    Args:
        processor (`ProcessorMixin`): the family's processor (`flatcollate.vision.load_processor`).
        flattening (`VisionDataCollatorWithFlattening`, *optional*): flattens the sequences; `from_model` builds it
            from the model, so each sequence's placeholders are checked against its own images by the family's rule.
        max_length (`int`, *optional*): longest `prompt + completion`; a longer sequence keeps its first `max_length`
            tokens, as TRL cuts each padded row (`keep_end` would cut images out of the prompt; TRL refuses it too).

    Returns (from `__call__`): the keys of `VisionDataCollatorWithFlattening` (`input_ids`, `labels`, `position_ids`
    `(1, T)` int64, `cu_seq_lens_q/k` `(2N + 1,)` int32, `max_length_q/k`, token types `(1, T)` int64, vision fields
    concatenated in sequence order) and `completion_mask` `(1, T)` int64.
    """

    def __init__(
        self,
        processor,
        *,
        flattening: VisionDataCollatorWithFlattening | None = None,
        max_length: int | None = None,
    ):
        check_truncation(max_length, "keep_start")
        self.processor = processor
        self.flattening = (
            flattening if flattening is not None else VisionDataCollatorWithFlattening(return_seq_idx=False)
        )
        self.max_length = max_length

    @classmethod
    def from_model(cls, model, processor, **kwargs) -> "VisionDataCollatorForPreference":
        """A collator whose flattening has `model`'s family layout, token types and forward parameters."""
        return cls(
            processor, flattening=VisionDataCollatorWithFlattening.from_model(model, return_seq_idx=False), **kwargs
        )

    def __call__(self, examples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        check_batch(examples, kind="preference")
        prompts = [self._prompt(example, index) for index, example in enumerate(examples)]
        sequences = []
        for field in ("chosen", "rejected"):  # TRL's row order: every chosen sequence, then every rejected one
            for prompt, example in zip(prompts, examples, strict=True):
                sequences.append(self._sequence(prompt, self._text(example[field])))
        batch = self.flattening(sequences)
        batch["completion_mask"] = torch.from_numpy(np.concatenate([s["completion_mask"] for s in sequences]))[None]
        return batch

    def _prompt(self, example: Mapping, index: int) -> dict:
        """The processor's output for the example's prompt and its images, per-token fields as 1-D int64 arrays."""
        if not isinstance(example, Mapping) or any(field not in example for field in TEXT_FIELDS):
            missing = [f for f in TEXT_FIELDS if not isinstance(example, Mapping) or f not in example]
            raise ValueError(
                f"example {index} has no {missing}: vision preference examples hold `prompt`, `chosen`, `rejected` "
                "(text) and `images` (or `image`), TRL's vision preference rows."
            )
        for field in TEXT_FIELDS:
            if not isinstance(example[field], str):
                raise TypeError(
                    f"example {index}: `{field}` is {type(example[field]).__name__}, not text. Conversational rows are "
                    "rendered by TRL's collator; render them first (`trl.apply_chat_template` after "
                    "`trl.data_utils.prepare_multimodal_messages`) or use trl.DPOTrainer."
                )
        images = [example["image"]] if "image" in example else list(example.get("images") or [])
        processed = self.processor(
            images=[images] if images else None, text=[example["prompt"]], add_special_tokens=False, return_tensors="pt"
        )
        return {
            key: _row(value) if key in PROCESSOR_TEXT else value
            for key, value in processed.items()
            if key != "attention_mask"
        }

    def _text(self, text: str) -> dict:
        processed = self.processor(text=[text], add_special_tokens=False, return_tensors="pt")
        return {key: _row(processed[key]) for key in ("input_ids", *TOKEN_TYPE_FIELDS) if key in processed}

    def _sequence(self, prompt: dict, completion: dict) -> dict:
        """`prompt + completion` as one example of the flattening collator, cut to `max_length`."""
        cut = slice(None, self.max_length)
        ids = np.concatenate([prompt["input_ids"], completion["input_ids"]])
        mask = np.repeat(np.array([0, 1], dtype=np.int64), [len(prompt["input_ids"]), len(completion["input_ids"])])
        sequence = {key: value for key, value in prompt.items() if key not in PROCESSOR_TEXT}
        sequence.update(input_ids=ids[cut], completion_mask=mask[cut])
        for field in TOKEN_TYPE_FIELDS:
            if field in prompt:  # TRL: the prompt's types, then the completion's (0 where the processor gives none)
                after = completion.get(field, np.zeros_like(completion["input_ids"]))
                sequence[field] = np.concatenate([prompt[field], after])[cut]
        return sequence


def _row(value: Any) -> np.ndarray:
    """A processor's per-token field of a batch of one, as a 1-D int64 array."""
    array = value.numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
    return array.reshape(-1).astype(np.int64)
