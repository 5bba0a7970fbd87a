"""Multimodal RoPE positions of a flattened row: per sequence, from the model's own `get_rope_index`; the guard
refuses positions it cannot check, and keeps the text row's boundaries out of the vision tower."""

import copy

import pytest
import torch

from flatcollate import prepare_model_for_flattening
from flatcollate.boundaries import Boundaries
from flatcollate.modeling.composite import TEXT_ROW_KEYS, vision_towers
from flatcollate.modeling.multimodal_positions import multimodal_position_ids, rope_index_of
from flatcollate.testing.tiny_vision import tiny_vision_examples, tiny_vision_lm
from flatcollate.vision import VisionDataCollatorWithFlattening

from .test_flattened_exact import alone


@pytest.fixture(scope="module", params=["qwen2_vl", "qwen3_vl", "glm4v"])
def case(request):
    model = tiny_vision_lm(request.param)
    examples = tiny_vision_examples(model, count=4, seed=3)
    return model, examples


def _forward_inputs(batch):
    return {k: v for k, v in batch.items() if k != "labels"}


def test_positions_equal_each_example_numbered_alone(case):
    """Slow reference: `get_rope_index` on each example alone, concatenated."""
    model, examples = case
    rope_index = rope_index_of(model)
    reference = []
    for example in examples:
        one = alone(example)
        inputs = {k: one.get(k) for k in ("mm_token_type_ids", "image_grid_thw") if one.get(k) is not None}
        if "mm_token_type_ids" not in inputs:
            inputs["mm_token_type_ids"] = torch.zeros_like(one["input_ids"])
        positions, _ = rope_index(one["input_ids"], **inputs)
        reference.append(positions)
    batch = VisionDataCollatorWithFlattening.from_model(model)(examples)
    got = multimodal_position_ids(
        rope_index,
        batch["input_ids"],
        Boundaries.from_lengths(batch["cu_seq_lens_q"].diff().tolist()),
        mm_token_type_ids=batch.get("mm_token_type_ids"),
        image_grid_thw=batch.get("image_grid_thw"),
    )
    assert got.shape == (4, 1, batch["input_ids"].shape[1])
    torch.testing.assert_close(got[1:], torch.cat(reference, dim=-1))
    torch.testing.assert_close(got[0], batch["position_ids"])


def test_given_positions_are_checked(case):
    model, examples = case
    prepared = prepare_model_for_flattening(copy.deepcopy(model))
    batch = VisionDataCollatorWithFlattening.from_model(prepared)(examples)
    inputs = _forward_inputs(batch)
    with torch.no_grad():
        reference = prepared(**inputs).logits
        rope = rope_index_of(prepared)
        good = multimodal_position_ids(
            rope,
            batch["input_ids"],
            Boundaries.from_lengths(batch["cu_seq_lens_q"].diff().tolist()),
            mm_token_type_ids=batch.get("mm_token_type_ids"),
            image_grid_thw=batch.get("image_grid_thw"),
        )
        torch.testing.assert_close(prepared(**{**inputs, "position_ids": good}).logits, reference)
        with pytest.raises(ValueError, match="without the text row"):
            prepared(**{**inputs, "position_ids": good[1:]})
        # The whole row numbered as one example, as transformers does without flatcollate.
        whole, _ = rope(
            batch["input_ids"], mm_token_type_ids=batch["mm_token_type_ids"], image_grid_thw=batch["image_grid_thw"]
        )
        with pytest.raises(ValueError, match="differ from the model's own `get_rope_index` run on each sequence"):
            prepared(**{**inputs, "position_ids": torch.cat([good[:1], whole])})


def test_text_only_rows_on_a_vision_model_are_exact():
    model = tiny_vision_lm("qwen2_5_vl")
    examples = [
        {k: v for k, v in e.items() if k in ("input_ids", "labels")} for e in tiny_vision_examples(model, count=3)
    ]
    for example in examples:  # text only: no placeholders left
        keep = example["input_ids"] < model.config.image_token_id - 20
        example["input_ids"], example["labels"] = example["input_ids"][keep], example["labels"][keep]
    prepared = prepare_model_for_flattening(copy.deepcopy(model))
    batch = VisionDataCollatorWithFlattening.from_model(prepared)(examples)
    with torch.no_grad():
        flat = prepared(**_forward_inputs(batch)).logits[0]
        reference = torch.cat([model(**alone(e)).logits[0] for e in examples])
    assert (flat - reference).abs().max().item() <= 1e-5


@pytest.mark.parametrize("family", ["qwen2_vl", "gemma3"])
def test_vision_towers_never_see_the_text_rows_boundaries(family):
    model = prepare_model_for_flattening(tiny_vision_lm(family))
    seen = []
    towers = vision_towers(model)
    assert towers, "no vision tower found"
    for tower in towers:
        tower.register_forward_pre_hook(lambda m, a, kw: seen.append(set(kw)), with_kwargs=True)
    batch = VisionDataCollatorWithFlattening.from_model(model)(tiny_vision_examples(model, count=2))
    with torch.no_grad():
        model(**_forward_inputs(batch))
    assert seen, "the vision tower did not run"
    assert not any(keys & set(TEXT_ROW_KEYS) for keys in seen)
    assert model.config.get_text_config()._attn_implementation == "flatcollate"
    assert all(t.config._attn_implementation != "flatcollate" for t in towers)


def test_the_guard_covers_vision_models():
    """The refusals of text models hold for a flattened image-text batch: a mask or a cache would mix the examples."""
    model = prepare_model_for_flattening(tiny_vision_lm("qwen2_5_vl"))
    batch = VisionDataCollatorWithFlattening.from_model(model)(tiny_vision_examples(model, count=2))
    inputs = _forward_inputs(batch)
    with torch.no_grad():
        with pytest.raises(ValueError, match="attention_mask"):
            model(**inputs, attention_mask=torch.ones_like(batch["input_ids"]))
        with pytest.raises(ValueError, match="use_cache=True"):
            model(**inputs, use_cache=True)
        with pytest.raises(ValueError, match="per-example fields are for the collator"):
            model(**inputs, completion_mask=torch.ones_like(batch["input_ids"]))
