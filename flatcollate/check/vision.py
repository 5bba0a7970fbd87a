"""`flatcollate check` for image-text-to-text families: a flattened image-text batch against each example alone.

A tiny random copy of the family (`tiny_vision_lm`) takes examples laid out as its processor lays them out
(`tiny_vision_examples`: 1, 2 and 0 images), flattened by `VisionDataCollatorWithFlattening`::

    example 0   [t t <i i i i> t t t]
    example 1   [t <i i> <i i i> t t t t]
    example 2   [t t t t t]
    row         [t t <i i i i> t t t | t <i i> <i i i> t t t t | t t t t t]   images in example order

The row runs once per backend; the reference runs every example on its own, images included, with SDPA (not eager
as for text families): the packed backend runs SDPA per sequence, and Gemma 3's projector gradients (~300) differ by
8e-5 between eager and SDPA from fp32 rounding alone, above the 1e-5 tolerance. Logits, loss and gradients must agree
within the tolerance (fp32 CPU), as for text families (`flatcollate.check.text`), through the same per-backend loop
(`flatcollate.check.runs.compare_backends`).

With `task="dpo"` the same examples, scored on the second half of each (`flatcollate.check.vision_tasks`), compare
the completion log-probabilities per token, their sum and its gradients (`flatcollate.check.tasks.run_logprobs`).

Two controls show that the check can see the images it checks (`flatcollate.vision.controls`): reversing the batch's
images across examples must move the logits (for `dpo`, the log-probabilities) by more than 1e-2, and every
vision-tower and projector parameter must get a gradient in the reference run. Where either fails, an `exact` backend
is reported `unverified` instead: its agreement would hold whether or not each image reached its own sequence.
"""

import dataclasses
import json

import torch
from transformers import PretrainedConfig, PreTrainedModel
from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

from .._conventions import IGNORE_INDEX, TOKEN_TYPE_FIELDS
from .._paths import expand_path
from ..attention import ATTN_IMPLEMENTATION
from ..testing.tiny_vision import FAMILIES, TINY_BUILD_NOTES, tiny_vision_examples, tiny_vision_lm
from ..vision.collate import VisionDataCollatorWithFlattening
from ..vision.controls import IMAGE_SHIFT, dead_image_parameters, image_parameters, image_shift, unused_by_design
from .report import BackendResult, CheckReport
from .runs import compare_backends, example_alone, gradients, run_flat, token_losses
from .tasks import logprobs_alone, run_logprobs
from .vision_tasks import completion_only, image_text_task_refusal, logprob_shift

IMAGES_PER_EXAMPLE = (1, 2, 0)
"""Images of the checked examples: one, several (their features must stay in order), none (a text-only sequence)."""

REFUSALS = (ValueError, RuntimeError, TypeError, IndexError, NotImplementedError)
"""What a model raises when it cannot take a flattened image-text batch (a refused argument, a shape mismatch); the
check reports it as the backend's reason. Anything else is a bug and propagates."""

SHIFT_CONTROL = "images reversed across examples (control)"
GRADIENT_CONTROL = "image-path gradients (control)"
"""Keys of `CheckReport.exercised` that report the two controls."""


def image_text_model_type(model: str | PretrainedConfig) -> str | None:
    """The `model_type` of `model` when it is an image-text-to-text architecture, else None.

    Args:
        model: a `model_type`, a folder with a `config.json`, or a config.

    >>> image_text_model_type("qwen2_vl"), image_text_model_type("llama")
    ('qwen2_vl', None)
    """
    if isinstance(model, PretrainedConfig):
        model_type = model.model_type
    elif (expand_path(model) / "config.json").is_file():
        model_type = json.loads((expand_path(model) / "config.json").read_text()).get("model_type")
    else:
        model_type = model
    return model_type if model_type in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES else None


def not_built_reason(model_type: str) -> str | None:
    """Why a family has no tiny model to check (`TINY_BUILD_NOTES`, or no recipe in `FAMILIES`), or None.

    >>> not_built_reason("qwen2_vl") is None, not_built_reason("vision-encoder-decoder").startswith("not built as")
    (True, True)
    """
    if model_type in FAMILIES:
        return None
    return f"not built as a tiny model: {TINY_BUILD_NOTES.get(model_type, 'no tiny recipe')}"


def check_vision_model(
    model: str | PretrainedConfig,
    *,
    backends: tuple[str, ...],
    seed: int = 0,
    tolerance: float | None = None,
    lengths: tuple[int, ...] | None = None,
    overrides: dict | None = None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    task: str = "sft",
) -> CheckReport:
    """Compare a flattened image-text batch with each example run alone, per backend (fp32 CPU).

    Args:
        model: an image-text-to-text `model_type`, a folder with its `config.json` or its config; the family's tiny
            recipe is built (`tiny_vision_lm`), not the folder's sizes.
        backends (`tuple[str, ...]`): transformers' own backends (`"sdpa"`, `"eager"`) run the unprepared model on the
            batch the collator emits (`use_cache=False`); `"flatcollate"` runs `prepare_model_for_flattening`.
        seed (`int`): seed of the weights, tokens and pixels.
        lengths, overrides, device, dtype: `check_model`'s options for text families; refused unless left as they
            are (the examples come from `tiny_vision_examples` and run in float32 on the CPU).
        tolerance (`float`, *optional*): largest absolute difference that counts as exact; by default 1e-5, or fp32's
            resolution at a quantity's largest value where that is coarser (large projector gradients).
        task (`str`, defaults to `"sft"`): `"sft"` compares logits, loss and gradients; `"dpo"` each example's
            completion log-probabilities per token (`sequence_logprobs`, the second half of each example scored:
            `flatcollate.check.vision_tasks`), their sum and its gradients. `"reward"` is refused (text families only).

    Returns:
        `CheckReport`: `lengths` are the examples' token counts; a family without a tiny recipe gets every backend
        `unsupported` with the reason it was not built.

    >>> report = check_vision_model("llava", backends=("flatcollate",))
    >>> report.results[0].status, report.lengths
    ('exact', (23, 39, 12))
    """
    model_type = image_text_model_type(model.config if isinstance(model, PreTrainedModel) else model)
    if model_type is None:
        raise ValueError(f"{model!r} is not an image-text-to-text architecture; check it with `check_model`.")
    if isinstance(model, PreTrainedModel):
        raise TypeError(
            f"A {model_type} model is checked from its family's tiny recipe (the examples are laid out for its sizes); "
            f"pass its model_type {model_type!r} instead of the model."
        )
    if (refused := image_text_task_refusal(model_type, task)) is not None:
        raise ValueError(refused)
    given = {"lengths": lengths, "overrides": overrides or None}
    given |= {"device": None if torch.device(device).type == "cpu" else device}
    given |= {"dtype": None if dtype == torch.float32 else dtype}
    for name, value in given.items():
        if value is not None:
            raise ValueError(
                f"{model_type} is an image-text-to-text architecture: `{name}={value}` does not apply, its examples "
                "come from `flatcollate.testing.tiny_vision_examples` (1, 2 and 0 images) and run in float32 on the "
                f"CPU; leave `{name}` unset."
            )
    reason = not_built_reason(model_type)
    if reason is not None:
        results = [BackendResult(backend=b, status="unsupported", reason=reason) for b in backends]
        return CheckReport(model_type=model_type, lengths=(), tolerance=tolerance or 1e-5, results=results)
    base = tiny_vision_lm(model_type, seed=seed, attn_implementation="sdpa").eval()
    examples = tiny_vision_examples(base, count=len(IMAGES_PER_EXAMPLE), seed=seed, images=IMAGES_PER_EXAMPLE)
    if task == "dpo":
        examples = [completion_only(example) for example in examples]
    collator = VisionDataCollatorWithFlattening.from_model(base)
    batch = collator(examples)
    alone, run, shifted = (
        (_run_alone, run_flat, image_shift) if task == "sft" else (logprobs_alone, run_logprobs, logprob_shift)
    )
    ref_logits, ref_loss, ref_grads = alone(base, examples)
    tolerances = _tolerances(tolerance, ref_logits, ref_loss, ref_grads)
    reference = (ref_logits, ref_loss, ref_grads)
    results, ran = compare_backends(
        base, batch, backends, reference, tolerances, refusals=REFUSALS, describe=refusal_reason, run=run
    )
    # The negative control runs on the prepared model where it ran, else on the first backend that did.
    runner = ran.get(ATTN_IMPLEMENTATION) or next(iter(ran.values()), None)
    shift = None if runner is None else shifted(runner[0], batch, collator.layout, runner[1])
    counts = (len(image_parameters(base)), len(unused_by_design(base)))
    moved = "the logits" if task == "sft" else "the completion log-probabilities"
    controls, blind = _controls(shift, counts, dead_image_parameters(base, ref_grads), moved=moved)
    if blind is not None:
        results = [
            dataclasses.replace(r, status="unverified", reason=blind) if r.status == "exact" else r for r in results
        ]
    return CheckReport(
        model_type=model_type,
        lengths=tuple(len(e["input_ids"]) for e in examples),
        tolerance=max(tolerances.values()),
        results=results,
        exercised={**_task(task), **_exercised(base, examples, model), **controls},
        tolerances=tolerances,
    )


def _controls(
    shift: float | None, counts: tuple[int, int], dead: list[str], *, moved: str = "the logits"
) -> tuple[dict[str, str], str | None]:
    """What the controls measured, for the report, and why the check is blind to its images (None when it is not).

    Args:
        shift (`float`, *optional*): `image_shift` (or `logprob_shift`) of a backend that ran the batch.
        counts (`tuple[int, int]`): parameters on the image path, and those of them unused by design.
        dead (`list[str]`): `dead_image_parameters`.
        moved (`str`): what `shift` measured, for the report.

    >>> _controls(0.5, (30, 2), [])[0]["image-path gradients (control)"]
    '28 of 30 parameters get one (2 unused by design)'
    >>> _controls(0.5, (30, 0), [])[1] is None, _controls(0.0, (30, 0), [])[1]
    (True, 'blind to its images: reversing them across examples moves the logits by 0.0e+00 (a control needs > 1e-02)')
    """
    measured = "not run (no backend ran the batch)" if shift is None else f"{moved} move by {shift:.1e}"
    controls = {
        SHIFT_CONTROL: f"{measured}; more than {IMAGE_SHIFT:g} needed",
        GRADIENT_CONTROL: f"{counts[0] - counts[1] - len(dead)} of {counts[0]} parameters get one"
        + (f" ({counts[1]} unused by design)" if counts[1] else "")
        + (f"; none for {', '.join(dead[:3])}{' ...' if len(dead) > 3 else ''}" if dead else ""),
    }
    why = []
    if shift is not None and shift <= IMAGE_SHIFT:
        why.append(f"reversing them across examples moves {moved} by {shift:.1e} (a control needs > {IMAGE_SHIFT:.0e})")
    if dead:
        why.append(f"{len(dead)} vision-tower or projector parameters get no gradient ({dead[0]}, ...)")
    return controls, ("blind to its images: " + "; ".join(why)) if why else None


def exact_within(size: float) -> float:
    """Largest fp32 difference that counts as exact for a quantity whose reference reaches `size`: 1e-5, raised to
    eight fp32 rounding steps at `size` where that is coarser. A projector's gradient sums over every image token:
    one batched backward and one backward per example add the terms in different orders, measured up to 5.4 rounding
    steps apart (MiniMax-M3-VL's projector bias, 26.7: 1.7e-5; Gemma 3's projector, ~300: 2e-5). A sequence attending
    across a boundary moves them by ~1e-2.

    >>> exact_within(1.0), exact_within(300.0) > 1e-5
    (1e-05, True)
    """
    return max(1e-5, 8 * torch.finfo(torch.float32).eps * size)


def _tolerances(tolerance: float | None, logits: torch.Tensor, loss: torch.Tensor, grads: dict) -> dict[str, float]:
    """The given tolerance for every quantity, or `exact_within` its largest reference value."""
    if tolerance is not None:
        return {"logits_diff": tolerance, "loss_diff": tolerance, "grad_diff": tolerance}
    largest_grad = max((g.abs().max().item() for g in grads.values()), default=0.0)
    sizes = {"logits_diff": logits.abs().max().item(), "loss_diff": loss.abs().item(), "grad_diff": largest_grad}
    return {name: exact_within(size) for name, size in sizes.items()}


def refusal_reason(error: Exception) -> str:
    """An exception as a one-line reason: its type and the first line of its message.

    >>> refusal_reason(RuntimeError("shape mismatch\\nmore detail"))
    'RuntimeError: shape mismatch'
    """
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


def _run_alone(model: PreTrainedModel, examples: list[dict]) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Reference: each example as a batch of one (its own positions, its own images); loss over all examples.

    Returns `(1, T, V)` fp32 logits in example order, the token-weighted loss and the fp32 gradients.
    """
    model.zero_grad(set_to_none=True)
    logits, total, count = [], 0.0, 0
    for example in examples:  # one forward per example, never across
        out = model(**example_alone(example), use_cache=False)
        labels = example["labels"][None]
        total = total + token_losses(out.logits, labels)
        count += int((labels[0, 1:] != IGNORE_INDEX).sum())
        logits.append(out.logits.detach())
    loss = total / count
    loss.backward()
    return torch.cat(logits, dim=1).float(), loss.detach().float(), gradients(model)


def _task(task: str) -> dict[str, str]:
    """The report's `task` line for a task other than `sft`."""
    return {} if task == "sft" else {"task": f"{task}: completion log-probabilities per example (its second half)"}


def _exercised(model: PreTrainedModel, examples: list[dict], given) -> dict[str, str]:
    """What the examples reach: images per example, image tokens, per-token types, the recipe built."""
    config = model.config
    image = getattr(config, "image_token_id", None)
    image = getattr(config, "image_token_index", None) if image is None else image
    tokens = [int((e["input_ids"] == image).sum()) for e in examples]
    types = [field for field in TOKEN_TYPE_FIELDS if field in examples[0]]
    exercised = {
        "images": f"{', '.join(map(str, IMAGES_PER_EXAMPLE))} per example ({', '.join(map(str, tokens))} image tokens)",
        "text-only sequence": "yes" if 0 in IMAGES_PER_EXAMPLE else "no",
        "per-token types": ", ".join(types) if types else "not taken by this family",
    }
    if not isinstance(given, str) or given != config.model_type:
        exercised["model"] = f"the {config.model_type} tiny recipe (the given config's sizes are not used)"
    return exercised
