"""Images without the per-token types their family reads are refused, by a prepared model's guard and by the vision
collator, for every family that reads them; text-only rows need none."""

import functools
import inspect

import pytest
import torch
from transformers import AutoModelForImageTextToText

from flatcollate import prepare_model_for_flattening
from flatcollate.modeling.token_types import check_token_types, token_types_read
from flatcollate.testing.tiny_vision import FAMILIES, tiny_vision_config, tiny_vision_examples, tiny_vision_lm
from flatcollate.vision import VisionDataCollatorWithFlattening

pytestmark = pytest.mark.slow

MM_FAMILIES = [
    "cosmos3_edge",
    "cosmos3_omni",
    "glm46v",
    "glm4v",
    "glm4v_moe",
    "glm_ocr",
    "glmga",
    "paddleocr_vl",
    "qwen2_5_vl",
    "qwen2_vl",
    "qwen3_5",
    "qwen3_5_moe",
    "qwen3_vl",
    "qwen3_vl_moe",
]
"""Multimodal-RoPE families: `get_rope_index` reads `mm_token_type_ids`."""
BLOCK_FAMILIES = ["gemma3", "paligemma", "shieldgemma2"]
"""Image-block families: `token_type_ids` mark the runs that attend both ways."""
READERS = {**dict.fromkeys(MM_FAMILIES, "mm_token_type_ids"), **dict.fromkeys(BLOCK_FAMILIES, "token_type_ids")}


def _on_meta(model_type):
    """The family's tiny model without weights: enough to read its methods' signatures."""
    with torch.device("meta"):
        return AutoModelForImageTextToText.from_config(tiny_vision_config(model_type))


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_the_families_that_read_token_types(model_type):
    """Derived from the model's code (its `get_rope_index`, its image blocks); pinned so that a change shows."""
    model = _on_meta(model_type)
    field = token_types_read(model)
    assert field == READERS.get(model_type)
    # The forward takes exactly the field the family reads (the tiny examples carry what the forward takes).
    parameters = inspect.signature(model.forward).parameters
    takes = [name for name in ("mm_token_type_ids", "token_type_ids") if name in parameters]
    assert takes == ([field] if field else [])


@functools.cache
def _case(model_type):
    model = tiny_vision_lm(model_type)
    return model, tiny_vision_examples(model, count=3, seed=1)


@pytest.mark.parametrize("model_type", sorted(READERS))
def test_a_prepared_model_refuses_images_without_their_token_types(model_type):
    """Qwen2.5-VL, Gemma 3 and PaliGemma run such a batch silently wrong in transformers; flattened, every family
    here would (the image tokens on text positions, or attending causally)."""
    model, examples = _case(model_type)
    field = READERS[model_type]
    batch = VisionDataCollatorWithFlattening.from_model(model)(examples)
    del batch[field], batch["labels"]
    prepared = prepare_model_for_flattening(tiny_vision_lm(model_type))
    with torch.no_grad(), pytest.raises(ValueError, match=rf"carries images \(`pixel_values`.*but no `{field}`"):
        prepared(**batch, use_cache=False)


@pytest.mark.parametrize("model_type", sorted(READERS))
def test_the_collator_refuses_an_example_with_images_without_token_types(model_type):
    model, examples = _case(model_type)
    field = READERS[model_type]
    without = [{key: value for key, value in example.items() if key != field} for example in examples]
    collator = VisionDataCollatorWithFlattening.from_model(model)
    with pytest.raises(ValueError, match=rf"Example 0 carries images .* but no `{field}`.*Keep the `{field}` column"):
        collator(without)


def test_an_example_with_images_among_examples_with_token_types_is_refused_without_a_model():
    """Without the family, the collator would fill the missing example's types with 0 (text), placing its image on
    text positions while the batch as a whole carries the field."""
    _, examples = _case("qwen2_vl")
    mixed = [examples[0], {key: value for key, value in examples[1].items() if key != "mm_token_type_ids"}]
    with pytest.raises(ValueError, match=r"Example 1 carries images \(`pixel_values`, `image_grid_thw`\) but no"):
        VisionDataCollatorWithFlattening()(mixed)


@pytest.mark.parametrize("model_type", ["qwen2_vl", "gemma3"])
def test_text_only_rows_need_no_token_types(model_type):
    model, _ = _case(model_type)
    field = READERS[model_type]
    examples = tiny_vision_examples(model, count=2, seed=2, images=(0,))
    text_only = [{key: value for key, value in example.items() if key != field} for example in examples]
    batch = VisionDataCollatorWithFlattening.from_model(model)(text_only)
    assert field not in batch
    prepared = prepare_model_for_flattening(tiny_vision_lm(model_type))
    with torch.no_grad():
        logits = prepared(**{k: v for k, v in batch.items() if k != "labels"}, use_cache=False).logits
    assert torch.isfinite(logits).all()


def test_the_message_names_the_column_and_how_to_keep_it():
    values = {"input_ids": [1, 2], "pixel_values": torch.zeros(4, 6), "image_grid_thw": torch.tensor([[1, 2, 2]])}
    with pytest.raises(ValueError) as error:
        check_token_types("mm_token_type_ids", values, who="Example 3")
    message = str(error.value)
    assert message.startswith("Example 3 carries images (`pixel_values`, `image_grid_thw`) but no `mm_token_type_ids`")
    assert "return_mm_token_type_ids=True" in message and "remove_unused_columns" in message
    check_token_types(None, values, who="Example 3")  # a family that reads no types
