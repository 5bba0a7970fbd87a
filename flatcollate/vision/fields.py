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
from ..modeling.composite import text_config_key

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


def has_vision_tower(model: Any) -> bool:
    """Whether `model` (a PEFT wrapper is read through) or a config has a vision tower (`check_vision_model`).

    >>> from flatcollate.testing import tiny_causal_lm
    >>> from flatcollate.testing.tiny_vision import tiny_vision_lm
    >>> has_vision_tower(tiny_vision_lm("fuyu")), has_vision_tower(tiny_causal_lm("llama")), has_vision_tower("org/m")
    (True, False, False)
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = getattr(base, "config", base)
    if not hasattr(config, "get_text_config") or text_config_key(config) is None:
        return False
    inputs = model_inputs(base) if isinstance(base, torch.nn.Module) else None
    return inputs is None or not inputs.isdisjoint(IMAGE_FIELDS)


def check_vision_model(model: Any) -> None:
    """Raise for a model (a PEFT wrapper is read through) or config without a vision tower.

    Decided from what the model is: a config whose text model is the whole config (no vision sub-config), or a model
    whose `forward` takes none of the vision fields (`IMAGE_FIELDS`). Such a model fed image-text examples whose ids
    fit its vocabulary would train with the images ignored.

    >>> from flatcollate.testing.tiny_vision import tiny_vision_lm
    >>> check_vision_model(tiny_vision_lm("fuyu"))  # a composite config without `vision_config`: a linear tower
    """
    if has_vision_tower(model):
        return
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = getattr(base, "config", base)
    composite = hasattr(config, "get_text_config") and text_config_key(config) is not None
    takes = "its config holds no vision sub-config" if not composite else "its forward takes no `pixel_values`"
    raise ValueError(
        f"{type(base).__name__} has no vision tower ({takes}): image-text examples would train with their images "
        "ignored. Load the image-text model (`AutoModelForImageTextToText.from_pretrained(...)`) and build the "
        "collator from it, or collate text rows with `flatcollate.DataCollatorWithFlattening`."
    )


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
