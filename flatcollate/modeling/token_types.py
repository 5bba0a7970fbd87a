"""The per-token types an image-text family reads beside `input_ids`, and the refusal of images without them.

Two kinds of families tell image tokens from text by a per-token field the processor returns, not by `input_ids`:

- multimodal-RoPE families (Qwen2/2.5/3-VL, GLM-4V, PaddleOCR-VL, ...): `get_rope_index` reads `mm_token_type_ids`
  (1 on image tokens, 2 on video tokens) to give an image's tokens their grid coordinates;
- image-block families (`Family.block_token_type`: Gemma 3, ShieldGemma 2, PaliGemma): `token_type_ids` mark the
  runs that attend both ways.

A dataset that never kept the column loses them. transformers raises for some families and, for others (Qwen2.5-VL,
Gemma 3, PaliGemma), runs with image tokens on text positions or attending causally, silently wrong; flattened, every
one of them would run so. `check_token_types` refuses instead, from the guard of a prepared model and from the vision
collator::

    input_ids           t  t  <img> i  i  i  i  </img> t      pixel_values (16, D)
    mm_token_type_ids   0  0  0     1  1  1  1  0      0      <- required when the row carries images
"""

import inspect
from collections.abc import Mapping, Sequence

import torch

from .._conventions import IMAGE_FIELDS, TOKEN_TYPE_FIELDS
from ..families import family_of
from .multimodal_positions import rope_index_of

MM_TOKEN_TYPES = "mm_token_type_ids"
BLOCK_TOKEN_TYPES = "token_type_ids"


def token_types_read(model: torch.nn.Module) -> str | None:
    """The per-token type field `model` reads to place or mask its images, or None where it reads none.

    Args:
        model (`torch.nn.Module`): an image-text model (a PEFT wrapper is read through `get_base_model`).

    Returns:
        `"mm_token_type_ids"` when the model's `get_rope_index` takes them, `"token_type_ids"` for the image-block
        families (`Family.block_token_type`), else None.

    >>> from flatcollate.testing.tiny_vision import tiny_vision_lm
    >>> token_types_read(tiny_vision_lm("qwen2_vl")), token_types_read(tiny_vision_lm("llava"))
    ('mm_token_type_ids', None)
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    rope_index = rope_index_of(base)
    if rope_index is not None and MM_TOKEN_TYPES in inspect.signature(rope_index).parameters:
        return MM_TOKEN_TYPES
    config = getattr(base, "config", None)
    if family_of(getattr(config, "model_type", "")).block_token_type is not None:
        return BLOCK_TOKEN_TYPES
    return None


def image_fields_in(values: Mapping) -> list[str]:
    """The vision fields (`IMAGE_FIELDS`) a batch or an example carries (present and not None)."""
    return [name for name in IMAGE_FIELDS if values.get(name) is not None]


def check_token_types(field: str | None, values: Mapping, *, who: str) -> None:
    """Raise when `values` carry images but not the per-token types `field` the family reads.

    Args:
        field (`str`, *optional*): what `token_types_read` returns for the family; None checks nothing.
        values (`Mapping`): a forward's arguments or one example: `input_ids`, vision fields, per-token types.
        who (`str`): what is checked, for the message (`"Qwen2VLForConditionalGeneration"`, `"Example 2"`).

    Raises:
        `ValueError` naming the missing column, the vision fields that came without it, and how to keep it.

    >>> check_token_types("mm_token_type_ids", {"input_ids": [1, 2], "mm_token_type_ids": [0, 0]}, who="Example 0")
    >>> check_token_types("mm_token_type_ids", {"input_ids": [1, 2]}, who="Example 0")  # text only: all text
    """
    if field is None or values.get(field) is not None:
        return
    images = image_fields_in(values)
    if not images:
        return
    keep = (
        "the family's processor returns it by default (`processor(..., return_mm_token_type_ids=True)`)"
        if field == MM_TOKEN_TYPES
        else "Gemma 3's and PaliGemma's processors return it by default"
    )
    raise ValueError(
        f"{who} carries images ({', '.join(f'`{name}`' for name in images)}) but no `{field}`: this family reads it "
        "to tell image tokens from text, and without it the images would run on text positions (or attend causally), "
        f"silently wrong. Keep the `{field}` column: {keep}; do not drop it when mapping the dataset "
        "(`remove_columns`) or in the trainer (`remove_unused_columns`, a custom collator)."
    )


def require_token_types(model: torch.nn.Module, arguments: Mapping) -> None:
    """The guard's check of a flattened batch: images come with the per-token types `model` reads.

    Args:
        model (`torch.nn.Module`): the prepared top-level model.
        arguments (`Mapping`): the forward's arguments; a batch without vision fields costs two dict lookups per field.
    """
    if image_fields_in(arguments):
        check_token_types(token_types_read(model), arguments, who=f"The flattened batch of {type(model).__name__}")


def check_example_token_types(features: Sequence[Mapping], field: str | None) -> None:
    """The collator's check: every example with images carries `field` (what the family reads, None where the
    collator does not know the family) and every per-token type field another example of the batch carries, which
    the collator would otherwise fill with 0 (text) for it.

    Args:
        features (`Sequence[Mapping]`): the examples, as the vision collator takes them.
        field (`str`, *optional*): `token_types_read` of the collator's model.
    """
    carried = {name for name in TOKEN_TYPE_FIELDS if any(feature.get(name) is not None for feature in features)}
    for name in sorted({field, *carried} - {None}):
        for index, feature in enumerate(features):
            check_token_types(name, feature, who=f"Example {index}")
