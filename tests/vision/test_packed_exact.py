"""Model-level proof for packed image-text rows: examples packed by `pack_dataset` (whole examples, their vision
fields one entry per example) and collated by `VisionDataCollatorWithFlattening.from_model`, one pack or several per
batch, give every example's logits, and the loss and gradients, of each example run alone on the unprepared model, for
every family of the flattening proof (`test_flattened_exact.FAMILIES`).

The control of that proof runs beside it: the batch with its images reversed across examples (example 0 of a pack
sees another example's image) moves the logits by far more than the tolerance."""

import copy

import datasets
import numpy as np
import pytest

from flatcollate import prepare_model_for_flattening
from flatcollate.check.vision import exact_within
from flatcollate.data import pack_dataset
from flatcollate.data.packing import pack_lengths
from flatcollate.testing.tiny_vision import tiny_vision_examples, tiny_vision_lm
from flatcollate.vision import VisionDataCollatorWithFlattening
from flatcollate.vision.controls import IMAGE_SHIFT, image_shift

from .test_flattened_exact import FAMILIES, TOL, flattened_run, separate_run

pytestmark = pytest.mark.slow


def as_dataset(examples: list[dict]) -> datasets.Dataset:
    """The examples as encoded rows (nested lists; a row without images has None vision fields)."""
    keys = {key for example in examples for key in example}
    rows = [{key: example[key].tolist() if key in example else None for key in keys} for example in examples]
    return datasets.Dataset.from_list(rows)


@pytest.fixture(scope="module", params=FAMILIES)
def packed_case(request):
    """The family's model, four examples (1, 2, 0 and 1 images), their packs in torch format and the examples of
    each pack in pack order."""
    model = tiny_vision_lm(request.param)
    examples = tiny_vision_examples(model, count=4, seed=1)
    lengths = np.array([len(example["input_ids"]) for example in examples])
    pack_len = int(max(lengths.max(), np.ceil(lengths.sum() / 2)))
    packs = list(pack_dataset(as_dataset(examples), pack_len).with_format("torch"))
    groups = [[examples[i] for i in group] for group in pack_lengths(lengths, pack_len)]
    assert len(packs) == len(groups) >= 2 and max(len(group) for group in groups) >= 2
    prepared = prepare_model_for_flattening(copy.deepcopy(model))
    return request.param, model, prepared, packs, groups


def assert_exact(family: str, reference, got) -> None:
    (reference_logits, reference_loss, reference_grads), (logits, loss, grads) = reference, got
    assert (logits - reference_logits).abs().max().item() <= TOL, family
    assert abs(loss.item() - reference_loss.item()) <= TOL, family
    assert grads.keys() == reference_grads.keys()
    for name, g in reference_grads.items():
        worst = (grads[name] - g).abs().max().item()
        assert worst <= exact_within(g.abs().max().item()), f"{family}: gradient of {name} differs by {worst}"


def test_packs_in_one_batch_equal_each_example_alone(packed_case):
    family, model, prepared, packs, groups = packed_case
    batch = VisionDataCollatorWithFlattening.from_model(prepared)(packs)
    reference = separate_run(model, [example for group in groups for example in group])
    assert_exact(family, reference, flattened_run(prepared, batch))


def test_one_pack_per_batch_equals_each_example_alone(packed_case):
    family, model, prepared, packs, groups = packed_case
    fullest = max(range(len(groups)), key=lambda p: len(groups[p]))
    batch = VisionDataCollatorWithFlattening.from_model(prepared)([packs[fullest]])
    assert_exact(family, separate_run(model, groups[fullest]), flattened_run(prepared, batch))


def test_images_swapped_across_the_packed_examples_move_the_logits(packed_case):
    """Negative control: the packs' images reversed across examples must fail the proof by far."""
    family, model, prepared, packs, groups = packed_case
    collator = VisionDataCollatorWithFlattening.from_model(prepared)
    reference_logits = separate_run(model, [example for group in groups for example in group])[0]
    shift = image_shift(prepared, collator(packs), collator.layout, reference_logits)
    assert shift > IMAGE_SHIFT, f"{family}: reversing the images moves the logits by {shift:.1e} only"
