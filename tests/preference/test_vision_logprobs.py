"""`sequence_logprobs` of a flattened image-text batch equals each example run alone through the unprepared model:
per-token and summed completion log-probabilities, and their gradients (vision towers included), for multimodal-RoPE
families (Qwen2-VL, Qwen2.5-VL), LLaVA, Gemma 3, PaliGemma (image blocks first) and Idefics3 (image tiles).

The batch, from `VisionDataCollatorWithFlattening`, holds examples with 1, 2, 0 and 1 images, of four lengths; each
example's completion is the second half of its tokens (image placeholders never scored)::

    example 0   [t t <i i i i> t | t t t]              completion after `|`
    example 1   [t <i i> <i i i> t | t t t t]
    example 2   [t t | t t]                            text only
    example 3   [t t t <i i i i> t | t t t]            an image of example 0's size

Controls: swapping the images of examples 0 and 3 (same size, so the batch still collates) moves their log-probs by
more than 1e-2 and leaves examples 1 and 2 as they were; a boundary one token early is off by more than 1e-2.
"""

import copy

import pytest
import torch

from flatcollate import prepare_model_for_flattening
from flatcollate._conventions import IMAGE_FIELDS, TOKEN_TYPE_FIELDS
from flatcollate.boundaries import Boundaries
from flatcollate.preference import logprobs, sequence_logprobs
from flatcollate.testing.tiny_vision import tiny_vision_examples, tiny_vision_lm
from flatcollate.vision import VisionDataCollatorWithFlattening

TOL = 1e-5
SHIFT = 1e-2
FAMILIES = ("qwen2_vl", "qwen2_5_vl", "llava", "gemma3", "paligemma", "idefics3")
IMAGES = (1, 2, 0, 1)
SEED = 9
"""With this seed, examples 0 and 3 draw images of the same size in every family of `FAMILIES` (asserted by the swap
control), and the four examples have four lengths."""
PER_TOKEN = ("input_ids", "labels", *TOKEN_TYPE_FIELDS)


def completion_only(example: dict) -> dict:
    """The example with labels on the second half of its tokens only (-100 on the first half and on image blocks)."""
    labels = example["labels"].clone()
    labels[: len(labels) // 2] = -100
    return {**example, "labels": labels}


def alone(model, examples: list[dict]) -> list[torch.Tensor]:
    """Reference: each example as a batch of one (its own images), the log-probability of each next token it labels,
    0 where the label is -100: a `(L - 1,)` tensor per example."""
    out = []
    for example in examples:  # one forward per example, never across
        inputs = {k: v[None] if k in PER_TOKEN else v for k, v in example.items() if k != "labels"}
        logps = torch.log_softmax(model(**inputs, use_cache=False).logits[0].float(), dim=-1)
        targets = example["labels"][1:]
        picked = logps[:-1].gather(-1, targets.clamp(min=0)[:, None])[:, 0]
        out.append(torch.where(targets != -100, picked, torch.zeros_like(picked)))
    return out


def grads(model) -> dict[str, torch.Tensor]:
    return {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}


def swapped(examples: list[dict], i: int, j: int) -> list[dict]:
    """Examples `i` and `j` with each other's vision fields (their text and placeholders stay)."""
    out = [dict(e) for e in examples]
    for field in IMAGE_FIELDS:
        if field in examples[i] or field in examples[j]:
            out[i][field], out[j][field] = examples[j][field], examples[i][field]
    return out


@pytest.fixture(scope="module", params=FAMILIES)
def case(request):
    """The unprepared model, the examples, the reference per-token log-probs and gradients, a prepared copy and the
    flattened batch, once per family."""
    base = tiny_vision_lm(request.param, seed=SEED).eval()
    examples = [completion_only(e) for e in tiny_vision_examples(base, count=len(IMAGES), seed=SEED, images=IMAGES)]
    prepared = prepare_model_for_flattening(copy.deepcopy(base))
    reference = alone(base, examples)
    torch.stack([r.sum() for r in reference]).sum().backward()
    collator = VisionDataCollatorWithFlattening.from_model(prepared)
    return request.param, prepared, collator, examples, reference, grads(base)


def test_image_text_logprobs_equal_each_example_alone(case):
    family, prepared, collator, examples, reference, reference_grads = case
    lengths = [len(e["input_ids"]) for e in examples]
    assert len(set(lengths)) == len(lengths) and all((e["labels"][1:] != -100).any() for e in examples)
    assert [("pixel_values" in e) for e in examples] == [True, True, False, True]
    batch = collator(examples)
    per_token = sequence_logprobs(prepared, batch, per_token=True)
    assert [len(t) for t in per_token] == [n - 1 for n in lengths]
    for got, want in zip(per_token, reference, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=TOL)
    prepared.zero_grad(set_to_none=True)
    sums = sequence_logprobs(prepared, batch)
    torch.testing.assert_close(sums, torch.stack([r.sum() for r in reference]), rtol=0, atol=TOL)
    sums.sum().backward()
    flat_grads = grads(prepared)
    assert flat_grads.keys() == reference_grads.keys()
    for name, want in reference_grads.items():
        worst = (flat_grads[name] - want).abs().max().item()
        assert worst <= TOL, f"{family}: gradient of {name} differs by {worst:.1e}"


def test_swapping_two_examples_images_moves_only_their_logprobs(case):
    """Negative control: examples 0 and 3 given each other's image (same size: the collator takes them) score their
    completions differently by more than 1e-2; examples 1 and 2, whose inputs did not change, score as alone."""
    family, prepared, collator, examples, reference, _ = case
    exchanged = swapped(examples, 0, 3)
    assert not torch.equal(exchanged[0]["pixel_values"], examples[0]["pixel_values"])
    with torch.no_grad():
        per_token = sequence_logprobs(prepared, collator(exchanged), per_token=True)
    moved = [(got - want).abs().max().item() for got, want in zip(per_token, reference, strict=True)]
    assert moved[0] > SHIFT and moved[3] > SHIFT, f"{family}: swapping the images moves the log-probs by {moved}"
    assert moved[1] <= TOL and moved[2] <= TOL, f"{family}: examples that kept their inputs moved by {moved}"


def test_a_boundary_one_token_early_is_caught(case, monkeypatch):
    """Negative control: the first boundary one token early (example 0's last token scored as example 1's first)
    moves example 0's summed log-probability by more than 1e-2."""
    family, prepared, collator, examples, reference, _ = case
    bounds = logprobs.sequence_bounds

    def early(batch):
        moved = bounds(batch).cu_seqlens.clone()
        moved[1] -= 1
        return Boundaries(moved, int(moved.diff().max()))

    monkeypatch.setattr(logprobs, "sequence_bounds", early)
    with torch.no_grad():
        sums = sequence_logprobs(prepared, collator(examples))
    gap = (sums - torch.stack([r.sum() for r in reference])).abs().max().item()
    assert gap > SHIFT, f"{family}: a boundary one token early moves the sums by {gap:.1e} only"
