"""Which fields of an image-text example the vision collator carries, and the refusal of every other field the model
could take: a field left out of the batch would make the model run without it (VideoLLaMA 3 without
`image_merge_sizes` fails far from the cause; a field with a default would train on the default, silently).

    carried      text fields (`input_ids`, `labels`, masks, ...), per-token types, vision fields (`IMAGE_FIELDS`,
                 concatenated in example order on their image dimension)
    refused      a parameter of the model's `forward` the collator cannot place (`tile_fine_mask`,
                 `vision_feature_layer`, `mm_encoder_outputs`, ...), a deprecated name of a vision field, and, when the
                 model's `forward` is not known, any array the collator does not know
    left out     fields the model's `forward` does not take (ids, raw text, metadata): the model could not use them
"""

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from .._conventions import IMAGE_FIELDS, TOKEN_TYPE_FIELDS
from ..collate.features import MASK_KEYS

TEXT_FIELDS = ("input_ids", "labels", "seq_lengths", "position_ids", "attention_mask", *MASK_KEYS)
"""Fields the flattening of the text handles (`DataCollatorWithFlattening`)."""

CARRIED = frozenset({*TEXT_FIELDS, *TOKEN_TYPE_FIELDS, *IMAGE_FIELDS})

RENAMED = {"pixel_values_images": "pixel_values", "image_patches": "pixel_values"}
"""Deprecated names of vision fields (Video-LLaVA's images, Fuyu's patches) and the name the collator carries."""


def model_inputs(model: torch.nn.Module) -> frozenset[str] | None:
    """The parameters of `model.forward` (a PEFT wrapper is read through), or None where it takes only `**kwargs`.

    >>> from flatcollate.testing.tiny_vision import tiny_vision_lm
    >>> sorted(model_inputs(tiny_vision_lm("video_llama_3")) & {"image_merge_sizes", "pixel_values", "labels"})
    ['image_merge_sizes', 'labels', 'pixel_values']
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    named = [
        name
        for name, parameter in inspect.signature(base.forward).parameters.items()
        if parameter.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ]
    return frozenset(named) or None


def check_fields(features: Sequence[Any], inputs: frozenset[str] | None) -> None:
    """Raise for a field of an example that the collator would leave out while the model could take it.

    Args:
        features: the examples (dicts; anything else is left to the text collator to name).
        inputs: `model_inputs` of the collator's model; None where the model is not known, and then any array-valued
            field the collator does not carry is refused.

    Raises:
        `ValueError` naming the example, the field and the fix.
    """
    for index, feature in enumerate(features):
        if not isinstance(feature, Mapping):
            continue
        for key in feature.keys() - CARRIED:
            value = feature[key]
            if value is None:
                continue
            if key in RENAMED:
                raise ValueError(
                    f"Example {index}: `{key}` is a deprecated name of `{RENAMED[key]}`; the collator would leave it "
                    f"out and the model would run without its images. Rename the column to `{RENAMED[key]}`."
                )
            if inputs is not None and key in inputs:
                raise ValueError(
                    f"Example {index}: `{key}` is an argument of the model's forward that the collator does not know "
                    "how to flatten (on which dimension its images, or its examples, lie); left out, the model would "
                    f"run without it or with its default. Remove the `{key}` column to run without it, or set it in "
                    "the model's config where it is an option."
                )
            if inputs is None and _is_array(value):
                raise ValueError(
                    f"Example {index}: `{key}` is not a field the collator knows, and it would be left out. Build the "
                    "collator with `VisionDataCollatorWithFlattening.from_model(model)` (the model's forward then says "
                    f"which fields it takes), or remove the `{key}` column."
                )


def _is_array(value: Any) -> bool:
    """A tensor, array or nested list of numbers (what processors return), not an id, a string or a dict."""
    if isinstance(value, torch.Tensor | np.ndarray):
        return value.ndim > 0
    if not isinstance(value, list | tuple):
        return False
    try:
        return np.asarray(value).dtype.kind in "biuf"
    except ValueError:  # ragged nested lists of numbers
        return True
