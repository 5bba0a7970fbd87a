"""Tiny vision-language models: each family builds, each example runs alone and holds exactly the image tokens the
model consumes, and examples are reproducible from their seed."""

import functools

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForImageTextToText
from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

from flatcollate.testing import tiny_config
from flatcollate.testing.tiny_vision import (
    FAMILIES,
    LAYOUT_BASE,
    SPECIAL_BASE,
    TEXT_IDS,
    TINY_BUILD_NOTES,
    VOCAB_SIZE,
    image_feature_count,
    special_token_names,
    tiny_vision_config,
    tiny_vision_examples,
    tiny_vision_lm,
)

pytestmark = pytest.mark.slow

PER_TOKEN = ("input_ids", "labels", "mm_token_type_ids", "token_type_ids")
COVERED = sorted(FAMILIES)


@functools.cache
def _model(model_type):
    return tiny_vision_lm(model_type)


@functools.cache
def _examples(model_type):
    """Three examples with 1, 2 and 0 images, shared by the tests of one family (the model is only read)."""
    return tiny_vision_examples(_model(model_type), count=3, seed=0, images=(1, 2, 0))


def _batch_of_one(example):
    """The example as the model takes it alone: per-token fields gain a batch dim, vision fields stay as they are."""
    return {key: value[None] if key in PER_TOKEN else value for key, value in example.items()}


def _image_positions(model, example):
    image_id = model.config.image_token_id
    return (example["input_ids"] == image_id).nonzero().flatten()


@pytest.mark.parametrize("model_type", COVERED)
def test_examples_run_alone(model_type):
    model = _model(model_type)
    examples = _examples(model_type)
    assert [len(_image_positions(model, e)) > 0 for e in examples] == [True, True, False]
    assert all(len(_image_positions(model, e)) <= 160 for e in examples)  # tens of tokens per image, not thousands
    for example in examples:
        length = example["input_ids"].numel()
        for key in PER_TOKEN:
            if key in example:
                assert example[key].shape == (length,) and example[key].dtype == torch.int64, key
        with torch.no_grad():
            logits = model(**_batch_of_one(example)).logits
        assert logits.shape == (1, length, VOCAB_SIZE)
        assert torch.isfinite(logits).all()


@pytest.mark.parametrize("model_type", COVERED)
def test_one_placeholder_fewer_is_refused_by_the_model(model_type):
    model = _model(model_type)
    example = _examples(model_type)[0]
    drop = _image_positions(model, example)[-1]
    keep = torch.arange(example["input_ids"].numel()) != drop
    short = {key: value[keep] if key in PER_TOKEN else value for key, value in example.items()}
    with torch.no_grad(), pytest.raises(ValueError):
        model(**_batch_of_one(short))


@pytest.mark.parametrize("model_type", COVERED)
def test_examples_are_reproducible_from_their_seed(model_type):
    model = _model(model_type)
    first, again = _examples(model_type)[:2], tiny_vision_examples(model, count=2, seed=0)
    assert [sorted(e) for e in first] == [sorted(e) for e in again]
    for a, b in zip(first, again, strict=True):
        for key in a:
            torch.testing.assert_close(a[key], b[key], rtol=0, atol=0)
    other = tiny_vision_examples(model, count=1, seed=1, images=(0,))[0]
    assert not torch.equal(other["input_ids"], _examples(model_type)[2]["input_ids"])


@pytest.mark.parametrize("model_type", ["llava", "qwen2_vl"])
def test_weights_are_reproducible_from_their_seed(model_type):
    model, rebuilt, other = tiny_vision_lm(model_type), tiny_vision_lm(model_type), tiny_vision_lm(model_type, seed=1)
    for (name, p), q in zip(model.named_parameters(), rebuilt.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=0, msg=name)
    assert not torch.equal(model.lm_head.weight, other.lm_head.weight)


@pytest.mark.parametrize("model_type", COVERED)
def test_token_ids_keep_to_their_ranges(model_type):
    model = _model(model_type)
    specials = [getattr(model.config, name) for name in special_token_names(model.config)]
    assert specials and all(SPECIAL_BASE <= i < LAYOUT_BASE for i in specials)
    for example in _examples(model_type):
        text = example["labels"][example["labels"] != -100]
        assert ((text >= TEXT_IDS[0]) & (text < TEXT_IDS[1])).all()
        assert (example["input_ids"] < VOCAB_SIZE).all()


def test_features_of_another_width_than_the_text_are_refused():
    """The models compare element counts only: 16 features of width 32 would pass as 8 tokens of width 64."""
    config = tiny_vision_config("paligemma")
    config.vision_config.projection_dim = 32
    model = AutoModelForImageTextToText.from_config(config)
    with pytest.raises(ValueError, match=r"width \[32\], not the text width 64"):
        image_feature_count(model, {"pixel_values": torch.randn(1, 3, 32, 32)})


def test_bad_image_counts_and_foreign_models_are_refused():
    with pytest.raises(ValueError, match=r"images=\(1, -1\): give a non-empty tuple"):
        tiny_vision_examples(_model("llava"), images=(1, -1))
    with pytest.raises(ValueError, match=r"images=\(\): give"):
        tiny_vision_examples(_model("llava"), images=())
    text_only = AutoModelForCausalLM.from_config(tiny_config("llama"))
    with pytest.raises(ValueError, match="'llama' has no tiny vision recipe"):
        tiny_vision_examples(text_only)


def test_unknown_family_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match=r"no tiny vision recipe; known: .*llava"):
        tiny_vision_lm("not_a_family")


def test_every_image_text_to_text_family_has_a_recipe_or_a_note():
    assert not set(TINY_BUILD_NOTES) & set(FAMILIES)
    assert set(TINY_BUILD_NOTES) | set(FAMILIES) == set(MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES)
    assert all(isinstance(reason, str) and reason for reason in TINY_BUILD_NOTES.values())
