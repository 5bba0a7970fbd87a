"""Model-level proof for vision-language models: a flattened image-text batch gives each example's logits, and the
batch's loss and gradients, exactly as running every example alone (images included); vanilla transformers does not.

Two controls show that the proof can see the images it proves about: reversing the batch's images across examples
moves the logits by far more than the tolerance, and every vision-tower and projector parameter gets a gradient
(`flatcollate.vision.controls`)."""

import copy

import pytest
import torch

from flatcollate import prepare_model_for_flattening
from flatcollate._conventions import TOKEN_TYPE_FIELDS
from flatcollate.check.vision import exact_within
from flatcollate.testing.tiny_vision import tiny_vision_examples, tiny_vision_lm
from flatcollate.vision import VisionDataCollatorWithFlattening
from flatcollate.vision.controls import IMAGE_SHIFT, dead_image_parameters, image_parameters, image_shift

pytestmark = pytest.mark.slow

TOL = 1e-5
PER_TOKEN = ("input_ids", "labels", *TOKEN_TYPE_FIELDS)
VANILLA = {
    "qwen2_vl": "contaminated",
    "qwen2_5_vl": "contaminated",
    "qwen3_vl": "contaminated",
    "qwen3_vl_moe": "contaminated",
    "glm4v": "contaminated",
    "glm4v_moe": "contaminated",
    "gemma3": "contaminated",
    "paligemma": "contaminated",
    "llava": "exact",
    "llava_next": "exact",
    "llava_onevision": "exact",
    "vipllava": "exact",
    "idefics3": "exact",
    "smolvlm": "exact",
    "mistral3": "exact",
    "aya_vision": "exact",
    "cohere2_vision": "exact",
    "internvl": "exact",
    "shieldgemma2": "contaminated",
    "lfm3_vl": "contaminated",
    "qwen3_5": "refused",
    "qwen3_5_moe": "refused",
    "mistral_large4": "exact",
    "minimax_m3_vl": "exact",
}
"""What the unprepared model (SDPA) gives on the collator's batch, measured: multimodal-RoPE families number the row as
one sequence, Gemma 3 / PaliGemma's image-block overlay drops transformers' packed-sequence mask; LLaVA-style families
are kept apart by transformers' own packed-sequence detection from the restarting `position_ids`; LFM3-VL's short
convolutions run across the row; Qwen3.5's linear attention refuses packed rows without the `causal_conv1d` kernel."""
FAMILIES = list(VANILLA)


def alone(example: dict) -> dict:
    """An example as a batch of one: per-token fields get a batch dimension, vision fields stay as processed."""
    return {key: value[None] if key in PER_TOKEN else value for key, value in example.items()}


def grads(model) -> dict:
    return {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}


def separate_run(model, examples):
    """Each example alone: its logits, and the token-weighted loss over all examples with its gradients."""
    model.zero_grad()
    logits, total_loss, tokens = [], 0.0, 0
    for example in examples:
        out = model(**alone(example), use_cache=False)
        logits.append(out.logits[0].detach())
        labels = example["labels"][1:]
        count = int((labels != -100).sum())
        loss = torch.nn.functional.cross_entropy(out.logits[0, :-1], labels, ignore_index=-100, reduction="sum")
        total_loss = total_loss + loss
        tokens += count
    total_loss = total_loss / tokens
    total_loss.backward()
    return torch.cat(logits), total_loss.detach(), grads(model)


def flattened_run(model, batch):
    model.zero_grad()
    out = model(**{k: v for k, v in batch.items() if k != "labels"}, use_cache=False)
    shift = batch["labels"][0, 1:]
    loss = torch.nn.functional.cross_entropy(out.logits[0, :-1], shift, ignore_index=-100, reduction="sum")
    loss = loss / int((shift != -100).sum())
    loss.backward()
    return out.logits[0].detach(), loss.detach(), grads(model)


@pytest.fixture(scope="module", params=FAMILIES)
def family_case(request):
    model = tiny_vision_lm(request.param)
    examples = tiny_vision_examples(model, count=3, seed=1)
    return request.param, model, examples


@pytest.fixture(scope="module")
def reference(family_case):
    """Each example alone (`separate_run`), once per family."""
    _, model, examples = family_case
    return separate_run(model, examples)


@pytest.fixture(scope="module")
def flattened(family_case):
    """A prepared copy of the family's model, its collator's layout and the flattened batch, once per family."""
    _, model, examples = family_case
    prepared = prepare_model_for_flattening(copy.deepcopy(model))
    collator = VisionDataCollatorWithFlattening.from_model(prepared)
    return prepared, collator.layout, collator(examples)


def test_flattened_batch_equals_each_example_alone(family_case, reference, flattened):
    family = family_case[0]
    reference_logits, reference_loss, reference_grads = reference
    prepared, _, batch = flattened
    logits, loss, flat_grads = flattened_run(prepared, batch)
    assert (logits - reference_logits).abs().max().item() <= TOL
    assert abs(loss.item() - reference_loss.item()) <= TOL
    assert flat_grads.keys() == reference_grads.keys()
    # Each gradient within 1e-5, or eight fp32 rounding steps at its own size where coarser (a projector's gradient
    # sums over every image token, in another order when batched; `exact_within`).
    for name, g in reference_grads.items():
        worst = (flat_grads[name] - g).abs().max().item()
        assert worst <= exact_within(g.abs().max().item()), f"{family}: gradient of {name} differs by {worst}"


def test_reversing_the_images_moves_the_logits(family_case, reference, flattened):
    """Negative control: the flattened batch with its images in reverse order across examples (example 0 sees one of
    example 1's) must move the logits, from each example's own run, by more than `IMAGE_SHIFT`, 1000x the tolerance;
    a family whose logits ignore its pixels would pass the proof blind."""
    family = family_case[0]
    prepared, layout, batch = flattened
    shift = image_shift(prepared, batch, layout, reference[0])
    assert shift > IMAGE_SHIFT, f"{family}: reversing the images moves the logits by {shift:.1e} only"


def test_every_image_parameter_gets_a_gradient(family_case, reference):
    """No vision-tower or projector parameter is inert: each gradient of the reference run is non-zero somewhere,
    except the ones the family's `unused_by_design` names with its reason (`flatcollate.families`)."""
    family, model, _ = family_case
    assert image_parameters(model)
    assert dead_image_parameters(model, reference[2]) == [], family


def test_what_vanilla_transformers_gives_on_the_same_batch(family_case):
    """The same batch on the unprepared model (its own SDPA backend, restarting 1-D positions): `VANILLA`."""
    family, model, examples = family_case
    with torch.no_grad():
        reference = torch.cat([model(**alone(e), use_cache=False).logits[0] for e in examples])
        batch = VisionDataCollatorWithFlattening.from_model(model)(examples)
        try:
            vanilla = model(**{k: v for k, v in batch.items() if k != "labels"}, use_cache=False).logits[0]
        except ValueError:
            measured = "refused"
        else:
            measured = "exact" if (vanilla - reference).abs().max().item() <= TOL else "contaminated"
    assert measured == VANILLA[family]
