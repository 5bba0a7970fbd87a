"""The check of a text family: a flattened row of random tokens against the same sequences run one at a time.

A tiny random copy of the model runs one flattened row and the same sequences one at a time; logits, loss and
gradients must agree (fp32 CPU, tolerance 1e-5). The per-sequence reference runs with `eager` attention. The row's
lengths come from the config (`flatcollate.check.lengths`).
"""

import copy
import itertools

import numpy as np
import torch
from transformers import PretrainedConfig, PreTrainedModel

from .._conventions import IGNORE_INDEX
from ..attention import ATTN_IMPLEMENTATION
from ..boundaries import cu_seqlens_to_position_ids, lengths_to_cu_seqlens
from ..families import family_of
from ..modeling.family_positions import position_start
from ..testing import tiny_causal_lm, tiny_config
from .lengths import plan_check
from .report import CheckReport, max_diff, max_grad_diff
from .runs import compare_backends, gradients, token_losses

DEFAULT_BACKENDS = ("sdpa", "eager", ATTN_IMPLEMENTATION)


def _tiny_model(model: str | PretrainedConfig | PreTrainedModel, seed: int, overrides: dict) -> PreTrainedModel:
    if isinstance(model, PreTrainedModel):
        return copy.deepcopy(model).float().eval()
    return tiny_causal_lm(model, attn_implementation="eager", seed=seed, **overrides)


def flattened_inputs(lengths: tuple[int, ...], vocab_size: int, seed: int, *, pad_id: int | None = None) -> dict:
    """A flattened row as the collator emits it: restarting positions, boundaries, first label of each sequence -100.
    `pad_id`, where the family numbers positions around padding, is drawn as the next id (a row holds no padding)."""
    cu = lengths_to_cu_seqlens(np.asarray(lengths))
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, vocab_size, (1, int(cu[-1])), generator=generator)
    if pad_id is not None:
        input_ids[input_ids == pad_id] = (pad_id + 1) % vocab_size
    labels = input_ids.clone()
    labels[0, torch.from_numpy(cu[:-1]).long()] = IGNORE_INDEX
    cu_t = torch.from_numpy(cu)
    return {
        "input_ids": input_ids,
        "labels": labels,
        "position_ids": torch.from_numpy(cu_seqlens_to_position_ids(cu))[None],
        "cu_seq_lens_q": cu_t,
        "cu_seq_lens_k": cu_t,
        "max_length_q": max(lengths),
        "max_length_k": max(lengths),
    }


def _to(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def _run_alone(model, batch):
    """Reference: every sequence through the model on its own; one forward per sequence, never across."""
    model.zero_grad(set_to_none=True)
    bounds = batch["cu_seq_lens_q"].tolist()
    count = (batch["labels"][0, 1:] != IGNORE_INDEX).sum()
    logits, total = [], 0.0
    for start, end in itertools.pairwise(bounds):
        ids, labels = batch["input_ids"][:, start:end], batch["labels"][:, start:end]
        out = model(input_ids=ids, use_cache=False)  # as users run it: the model numbers its own positions
        total = total + token_losses(out.logits, labels)
        logits.append(out.logits.detach())
    loss = total / count
    loss.backward()
    return torch.cat(logits, dim=1).float(), loss.detach().float(), gradients(model)


def check_text_model(
    model: str | PretrainedConfig | PreTrainedModel,
    *,
    backends: tuple[str, ...] = DEFAULT_BACKENDS,
    lengths: tuple[int, ...] | None = None,
    seed: int = 0,
    tolerance: float | None = None,
    overrides: dict | None = None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> CheckReport:
    """`check_model` for a text family (see its options): random tokens in one flattened row against each sequence
    run alone with `eager` attention.

    >>> check_text_model("llama", backends=("flatcollate",), lengths=(3, 1, 4)).results[0].status
    'exact'
    """
    if lengths is not None and len(lengths) < 2:
        raise ValueError(
            f"`lengths` {list(lengths)} gives a row without a sequence boundary, so nothing could leak and the check "
            "would prove nothing; pass at least two sequences (e.g. 7 1 12 4), or none to derive them from the config."
        )
    if lengths is not None and min(lengths) < 1:
        raise ValueError(f"`lengths` must be positive sequence lengths, got {list(lengths)}.")
    config = model.config if isinstance(model, PreTrainedModel) else tiny_config(model, **(overrides or {}))
    stateful = bool(family_of(getattr(config, "model_type", "")).mixers)
    plan = plan_check(config, lengths=lengths, stateful=stateful, shrink=not isinstance(model, PreTrainedModel))
    lengths = plan.lengths
    base = _tiny_model(model, seed, {**(overrides or {}), **plan.overrides})
    numbering = position_start(base)
    batch = flattened_inputs(tuple(lengths), base.config.vocab_size, seed, pad_id=numbering and numbering[1])
    reference = _run_alone(base, batch)
    device = torch.device(device)
    tolerances = _tolerances(base, batch, tolerance, device, dtype, reference)
    batch = _to(batch, device)

    def candidate(model: PreTrainedModel) -> PreTrainedModel:
        return copy.deepcopy(model).to(device=device, dtype=dtype)

    results, _ = compare_backends(base, batch, backends, reference, tolerances, candidate=candidate)
    return CheckReport(
        model_type=base.config.model_type,
        lengths=tuple(lengths),
        tolerance=max(tolerances.values()),
        results=results,
        exercised=plan.exercised,
        overrides=plan.overrides,
        tolerances=tolerances,
        device=str(device),
        dtype=str(dtype).removeprefix("torch."),
    )


def _tolerances(base, batch, tolerance, device, dtype, reference) -> dict[str, float]:
    """Per-quantity tolerance: the given one, 1e-5 in fp32 on the CPU, else twice the per-sequence run's own error."""
    if tolerance is not None or (dtype == torch.float32 and device.type == "cpu"):
        value = 1e-5 if tolerance is None else tolerance
        return {"logits_diff": value, "loss_diff": value, "grad_diff": value}
    low = copy.deepcopy(base).to(device=device, dtype=dtype)
    logits, loss, grads = _run_alone(low, _to(batch, device))
    ref_logits, ref_loss, ref_grads = reference
    # A quantity cannot be trusted below the dtype's resolution at its own size (a scalar loss can land near the
    # reference by chance, so its measured error alone would be too tight).
    eps = torch.finfo(dtype).eps
    largest_grad = max((g.abs().max().item() for g in ref_grads.values()), default=0.0)
    return {
        "logits_diff": max(2 * max_diff(logits, ref_logits), eps * ref_logits.abs().max().item()),
        "loss_diff": max(2 * max_diff(loss, ref_loss), eps * ref_loss.abs().item()),
        "grad_diff": max(2 * max_grad_diff(grads, ref_grads), eps * largest_grad),
    }
