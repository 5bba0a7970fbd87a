"""Placeholder counts per example, for every family: each image fills what the model's own feature computation makes
of it (`tiny_vision_examples` reads that count from the model), so images handed to the wrong example are refused by
the collator, as each such example alone is refused by the model."""

import copy
import functools

import pytest
import torch

from flatcollate import prepare_model_for_flattening
from flatcollate._conventions import TOKEN_TYPE_FIELDS
from flatcollate.testing.tiny_vision import FAMILIES, tiny_vision_examples, tiny_vision_lm
from flatcollate.testing.vision_blocks import image_id
from flatcollate.vision import VisionDataCollatorWithFlattening
from flatcollate.vision.layouts import VisionLayout, expected_placeholders

pytestmark = pytest.mark.slow

PER_TOKEN = ("input_ids", "labels", *TOKEN_TYPE_FIELDS)
COVERED = sorted(FAMILIES)
TOL = 1e-5


@functools.cache
def _model(model_type):
    return tiny_vision_lm(model_type).eval()


def placeholders(model, example) -> int:
    return int((example["input_ids"] == image_id(model.config)).sum())


def alone(example: dict) -> dict:
    """An example as a batch of one: per-token fields get a batch dimension, vision fields stay as processed."""
    return {key: value[None] if key in PER_TOKEN else value for key, value in example.items()}


@functools.cache
def _pair(model_type):
    """Two examples whose images fill different numbers of placeholders: one image each of two sizes where the family
    has sizes, else one image against two (families whose every image fills the same count)."""
    model = _model(model_type)
    for images in ((1, 1), (1, 2)):
        for seed in range(8):
            first, second = tiny_vision_examples(model, count=2, seed=seed, images=images)
            if placeholders(model, first) != placeholders(model, second):
                return first, second
    raise AssertionError(f"{model_type}: no two examples with different placeholder counts")


def swap_images(first: dict, second: dict) -> tuple[dict, dict]:
    """Each example with the other's vision fields (and its own text)."""
    text = [{k: v for k, v in e.items() if k in PER_TOKEN} for e in (first, second)]
    vision = [{k: v for k, v in e.items() if k not in PER_TOKEN} for e in (first, second)]
    return {**text[0], **vision[1]}, {**text[1], **vision[0]}


@pytest.mark.parametrize("model_type", COVERED)
def test_images_swapped_between_two_examples_are_refused(model_type):
    """Each swapped example alone is refused by the model (its count is off); flattened, the surplus of one and the
    shortfall of the other cancel in the model's total check, and each image would run in the other sequence. The
    collator counts each example from its own vision fields and names the first."""
    model = _model(model_type)
    first, second = _pair(model_type)
    swapped = swap_images(first, second)
    for example in swapped:
        with torch.no_grad(), pytest.raises(ValueError):
            model(**alone(example), use_cache=False)
    found, fill = placeholders(model, first), placeholders(model, second)
    collator = VisionDataCollatorWithFlattening.from_model(model)
    with pytest.raises(
        ValueError, match=rf"Example 0: `input_ids` hold {found} placeholder tokens .* fill {fill}\b.*Process each"
    ):
        collator(list(swapped))


@pytest.mark.parametrize("model_type", COVERED)
def test_the_same_examples_with_their_own_images_collate_and_equal_each_alone(model_type):
    """Negative control of the swap: the unswapped pair collates, and the prepared model's flattened logits equal
    each example run alone."""
    model = _model(model_type)
    pair = list(_pair(model_type))
    prepared = prepare_model_for_flattening(copy.deepcopy(model))
    batch = VisionDataCollatorWithFlattening.from_model(prepared)(pair)
    with torch.no_grad():
        reference = torch.cat([model(**alone(e), use_cache=False).logits[0] for e in pair])
        flat = prepared(**{k: v for k, v in batch.items() if k != "labels"}, use_cache=False).logits[0]
    assert (flat - reference).abs().max().item() <= TOL


@pytest.mark.parametrize("model_type", COVERED)
def test_each_example_count_is_derived_from_its_own_images(model_type):
    """The count the collator expects of every example, from its vision fields and the family's config, is the count
    the model's own feature computation gave (read by `tiny_vision_examples`), on several seeds and image sizes."""
    model = _model(model_type)
    layout = VisionLayout.from_config(model.config)
    for seed in range(3):
        for example in tiny_vision_examples(model, count=3, seed=seed, images=(1, 2, 0)):
            assert expected_placeholders(example, layout) == placeholders(model, example), f"seed {seed}"


@pytest.mark.parametrize("model_type", COVERED)
def test_valid_batches_of_any_image_sizes_are_accepted(model_type):
    """Examples the model takes alone collate, whatever sizes the seed draws (LLaVA-NeXT-Video's images are
    any-resolution; Granite Docling's and Fuyu's examples hold different numbers of tiles and patches)."""
    model = _model(model_type)
    collator = VisionDataCollatorWithFlattening.from_model(model)
    for seed in range(6):
        examples = tiny_vision_examples(model, count=3, seed=seed, images=(1, 2, 0))
        batch = collator(examples)
        assert batch["input_ids"].shape[1] == sum(len(e["input_ids"]) for e in examples), f"seed {seed}"


@pytest.mark.parametrize("model_type", ["llava_next_video", "granite_docling", "fuyu"])
def test_batches_refused_before_run_exactly(model_type):
    """Seed 1 draws images of several sizes (tile and patch counts): the flattened batch through the prepared model
    equals each example alone."""
    model = _model(model_type)
    examples = tiny_vision_examples(model, count=3, seed=1, images=(1, 2, 0))
    prepared = prepare_model_for_flattening(copy.deepcopy(model))
    batch = VisionDataCollatorWithFlattening.from_model(prepared)(examples)
    with torch.no_grad():
        reference = torch.cat([model(**alone(e), use_cache=False).logits[0] for e in examples])
        flat = prepared(**{k: v for k, v in batch.items() if k != "labels"}, use_cache=False).logits[0]
    assert (flat - reference).abs().max().item() <= TOL


def test_images_without_the_field_their_family_counts_from_are_refused():
    model = _model("llava_next")
    (example,) = tiny_vision_examples(model, count=1, seed=0, images=(1,))
    collator = VisionDataCollatorWithFlattening.from_model(model)
    collator([example])  # negative control: with its `image_sizes`
    without = {key: value for key, value in example.items() if key != "image_sizes"}
    with pytest.raises(ValueError, match=r"Example 0: it carries images but no `image_sizes`.*Keep"):
        collator([without])


def test_onevision_counts_follow_batch_num_images():
    """The OneVision processor's `batch_num_images`: an image of an example with several images is not tiled (its base
    crop and one newline); alone in its example it is. The rule gives what the model's own features give, both ways."""
    from flatcollate.testing.tiny_vision import image_feature_count

    model = _model("llava_onevision")
    side = model.config.vision_config.image_size
    fields = {
        "pixel_values": torch.randn(2, 3, 3, side, side, generator=torch.Generator().manual_seed(0)),
        "image_sizes": torch.tensor([[32, 64], [64, 32]]),
    }
    layout = VisionLayout.from_config(model.config)
    for batch_num_images in (None, [2], [1, 1]):
        example = fields if batch_num_images is None else {**fields, "batch_num_images": torch.tensor(batch_num_images)}
        assert expected_placeholders(example, layout) == image_feature_count(model, example), batch_num_images
    several = {**fields, "batch_num_images": torch.tensor([2])}
    assert expected_placeholders(several, layout) < expected_placeholders(fields, layout)
