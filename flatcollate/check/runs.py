"""The runs every check makes, text and image-text alike: one flattened forward and backward per backend, compared
with the per-sequence reference (`compare_backends`, the one per-backend loop)."""

import copy
from collections.abc import Callable

import torch
from transformers import PreTrainedModel

from .._conventions import IGNORE_INDEX, TOKEN_TYPE_FIELDS
from ..attention import ATTN_IMPLEMENTATION
from ..modeling import prepare_model_for_flattening, unsupported_reason
from .report import BackendResult, compared

Outputs = tuple[torch.Tensor, torch.Tensor, dict]
"""`(logits, loss, grads)` of one run: fp32 logits `(1, T, V)`, the scalar loss, fp32 CPU gradients by name."""


PER_TOKEN_FIELDS = ("input_ids", "labels", *TOKEN_TYPE_FIELDS)
"""Fields of an example with one entry per token; an example's other fields (images) are the model's as they are."""


def example_alone(example: dict) -> dict:
    """The model inputs of one example as a batch of one: per-token fields `(L,)` -> `(1, L)`, vision fields as
    processed for that example alone, `labels` left out.

    >>> sorted(example_alone({"input_ids": torch.tensor([5, 6]), "labels": torch.tensor([5, 6])}).items())
    [('input_ids', tensor([[5, 6]]))]
    """
    return {k: v[None] if k in PER_TOKEN_FIELDS else v for k, v in example.items() if k != "labels"}


def token_losses(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Summed next-token cross-entropy of one row, `(1, T, V)` logits and `(1, T)` labels."""
    return torch.nn.functional.cross_entropy(
        logits[0, :-1].float(), labels[0, 1:], ignore_index=IGNORE_INDEX, reduction="sum"
    )


def gradients(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Gradients as fp32 on the CPU, whatever the model's dtype and device."""
    return {n: p.grad.detach().float().cpu() for n, p in model.named_parameters() if p.grad is not None}


def run_flat(model: torch.nn.Module, batch: dict) -> Outputs:
    """One forward and backward of a flattened batch (one row), loss averaged over its labelled tokens."""
    model.zero_grad(set_to_none=True)
    out = model(**{k: v for k, v in batch.items() if k != "labels"}, use_cache=False)
    count = (batch["labels"][0, 1:] != IGNORE_INDEX).sum()
    loss = token_losses(out.logits, batch["labels"]) / count
    loss.backward()
    return out.logits.detach().float(), loss.detach().float(), gradients(model)


def set_vanilla(model: PreTrainedModel, backend: str) -> str | None:
    """Select one of transformers' own backends; the reason it cannot be selected, or None."""
    try:
        model.set_attn_implementation(backend)
    except ValueError as error:  # transformers refuses backends a family does not implement
        return str(error).split(".")[0]
    model.config.use_cache = False
    return None


def first_line(error: Exception) -> str:
    """The first line of an exception's message.

    >>> first_line(ValueError("refused\\nwhy"))
    'refused'
    """
    return str(error).splitlines()[0]


def compare_backends(
    base: PreTrainedModel,
    batch: dict,
    backends: tuple[str, ...],
    reference: Outputs,
    tolerances: dict[str, float],
    *,
    candidate: Callable[[PreTrainedModel], PreTrainedModel] = copy.deepcopy,
    refusals: tuple[type[Exception], ...] = (ValueError,),
    describe: Callable[[Exception], str] = first_line,
    run: Callable[[PreTrainedModel, dict], Outputs] = run_flat,
    prepare: Callable[[PreTrainedModel], object] = prepare_model_for_flattening,
    unsupported: Callable[[PreTrainedModel], str | None] = unsupported_reason,
) -> tuple[list[BackendResult], dict[str, tuple[PreTrainedModel, torch.Tensor]]]:
    """Run `batch` through a copy of `base` per backend and compare it with `reference`.

    `"flatcollate"` runs `prepare` (or is `unsupported` with the family's reason, `unsupported(model)`); any other
    backend is one of transformers' own, run unprepared. `run(model, batch)` gives the compared outputs (by default a
    causal LM's logits, loss and gradients). A model that refuses the batch by raising one of `refusals` is
    `unsupported` with `describe(error)` as the reason; anything else propagates.

    Returns:
        The verdicts in `backends` order, and `{backend: (model, logits)}` for each backend that ran.
    """
    results, ran = [], {}
    for backend in backends:
        model = candidate(base)
        if backend == ATTN_IMPLEMENTATION:
            reason = unsupported(model)
            if reason is None:
                prepare(model)
        else:
            reason = set_vanilla(model, backend)
        if reason is None:
            try:
                outputs = run(model, batch)
            except refusals as error:  # a model or kernel that refuses flattened rows says so
                reason = describe(error)
        if reason is not None:
            results.append(BackendResult(backend=backend, status="unsupported", reason=reason))
            continue
        ran[backend] = (model, outputs[0])
        results.append(compared(backend, outputs, reference, tolerances))
    return results, ran
