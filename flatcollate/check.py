"""`flatcollate check`: is a model exact on flattened batches, per attention backend?

A tiny random copy of the model runs one flattened row and the same sequences one at a time; logits, loss and
gradients must agree (fp32 CPU, tolerance 1e-5). The per-sequence reference runs with `eager` attention. The row's
lengths come from the config (`check_lengths`); the command line is in `check_cli`; image-text-to-text families are
checked with images (`flatcollate.vision.check`).
"""

import copy
import itertools
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
from transformers import PretrainedConfig, PreTrainedModel

from ._conventions import IGNORE_INDEX
from .attention import ATTN_IMPLEMENTATION
from .boundaries import cu_seqlens_to_position_ids, lengths_to_cu_seqlens
from .check_lengths import plan_check
from .modeling import SEGMENTED_MIXERS, prepare_model_for_flattening, unsupported_reason
from .modeling.family_positions import position_start
from .models import tiny_causal_lm, tiny_config

DEFAULT_BACKENDS = ("sdpa", "eager", ATTN_IMPLEMENTATION)


@dataclass(frozen=True)
class BackendResult:
    """One backend's verdict: `exact`, `contaminated` or `unsupported` (with `reason`), and the measured gaps."""

    backend: str
    status: str
    logits_diff: float | None = None
    loss_diff: float | None = None
    grad_diff: float | None = None
    reason: str | None = None


@dataclass(frozen=True)
class CheckReport:
    """Results of `check_model` for one model; `passed` when every requested backend is exact."""

    model_type: str
    lengths: tuple[int, ...]
    tolerance: float
    results: list[BackendResult] = field(default_factory=list)
    exercised: dict = field(default_factory=dict)
    overrides: dict = field(default_factory=dict)
    tolerances: dict = field(default_factory=dict)
    device: str = "cpu"
    dtype: str = "float32"

    @property
    def passed(self) -> bool:
        return all(result.status == "exact" for result in self.results)

    def to_dict(self) -> dict:
        return {**asdict(self), "passed": self.passed}

    def to_markdown(self) -> str:
        """A table, one row per backend."""
        if len(set(self.tolerances.values())) > 1:
            tolerance = ", ".join(f"{k.removesuffix('_diff')} {v:.1e}" for k, v in self.tolerances.items())
            low = (self.device, self.dtype) != ("cpu", "float32")
            source = f"the {self.dtype} per-sequence run's own error" if low else "float32 resolution at each size"
            tolerance += f" (from {source})"
        else:
            tolerance = f"{self.tolerance:g}"
        where = f"{self.dtype} on {self.device}"
        rows = [f"{self.model_type} (lengths {list(self.lengths)}, {where}, tolerance {tolerance})", ""]
        rows += [
            "| backend | status | max logit diff | loss diff | max grad diff | reason |",
            "|---|---|---|---|---|---|",
        ]
        for r in self.results:
            cells = [_fmt(r.logits_diff), _fmt(r.loss_diff), _fmt(r.grad_diff)]
            rows.append(f"| {r.backend} | {r.status} | " + " | ".join(cells) + f" | {r.reason or ''} |")
        if self.exercised:
            rows += ["", "What the check exercised:"]
            rows += [f"- {mechanism}: {what}" for mechanism, what in self.exercised.items()]
        return "\n".join(rows)


def _fmt(value: float | None) -> str:
    return "" if value is None else f"{value:.2e}"


def _tiny_model(model: str | PretrainedConfig | PreTrainedModel, seed: int, overrides: dict) -> PreTrainedModel:
    if isinstance(model, PreTrainedModel):
        return copy.deepcopy(model).float().eval()
    return tiny_causal_lm(model, attn_implementation="eager", seed=seed, **overrides)


def _flattened_inputs(lengths: tuple[int, ...], vocab_size: int, seed: int, *, pad_id: int | None = None) -> dict:
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


def _token_losses(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Summed next-token cross-entropy of one row, `(1, T, V)` logits and `(1, T)` labels."""
    return torch.nn.functional.cross_entropy(
        logits[0, :-1].float(), labels[0, 1:], ignore_index=IGNORE_INDEX, reduction="sum"
    )


def _to(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def _run_flat(model, batch):
    model.zero_grad(set_to_none=True)
    out = model(**{k: v for k, v in batch.items() if k != "labels"}, use_cache=False)
    count = (batch["labels"][0, 1:] != IGNORE_INDEX).sum()
    loss = _token_losses(out.logits, batch["labels"]) / count
    loss.backward()
    return out.logits.detach().float(), loss.detach().float(), _grads(model)


def _run_alone(model, batch):
    """Reference: every sequence through the model on its own; one forward per sequence, never across."""
    model.zero_grad(set_to_none=True)
    bounds = batch["cu_seq_lens_q"].tolist()
    count = (batch["labels"][0, 1:] != IGNORE_INDEX).sum()
    logits, total = [], 0.0
    for start, end in itertools.pairwise(bounds):
        ids, labels = batch["input_ids"][:, start:end], batch["labels"][:, start:end]
        out = model(input_ids=ids, use_cache=False)  # as users run it: the model numbers its own positions
        total = total + _token_losses(out.logits, labels)
        logits.append(out.logits.detach())
    loss = total / count
    loss.backward()
    return torch.cat(logits, dim=1).float(), loss.detach().float(), _grads(model)


def _grads(model) -> dict[str, torch.Tensor]:
    """Gradients as fp32 on the CPU, whatever the model's dtype and device."""
    return {n: p.grad.detach().float().cpu() for n, p in model.named_parameters() if p.grad is not None}


def _max_grad_diff(a: dict, b: dict) -> float:
    names = a.keys() | b.keys()
    zero = torch.zeros(())
    return max((a.get(n, zero) - b.get(n, zero)).abs().max().item() for n in names) if names else 0.0


def compared(backend: str, run: tuple, reference: tuple, tolerances: dict[str, float]) -> BackendResult:
    """A backend's `(logits, loss, grads)` against the reference's: exact when every gap is within its tolerance."""
    (logits, loss, grads), (ref_logits, ref_loss, ref_grads) = run, reference
    diffs = {
        "logits_diff": (logits - ref_logits).abs().max().item(),
        "loss_diff": (loss - ref_loss).abs().item(),
        "grad_diff": _max_grad_diff(grads, ref_grads),
    }
    exact = all(value <= tolerances[name] for name, value in diffs.items())
    return BackendResult(backend=backend, status="exact" if exact else "contaminated", **diffs)


def check_model(
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
    """Compare a flattened batch with the same sequences run one at a time, per attention backend.

    Args:
        model: a `model_type` (`"llama"`), a folder with a `config.json`, a config (each shrunk by
            `flatcollate.models.tiny_config`), or a model (copied, used at its size in fp32). An image-text-to-text
            architecture (qwen2_vl, llava, ...) is checked with images by `flatcollate.vision.check`: its family's
            tiny recipe, examples with 1, 2 and 0 images, fp32 CPU (`lengths`, `overrides`, `device`, `dtype` unset).
        backends (`tuple[str, ...]`): `"sdpa"` and `"eager"` run transformers' own backends with `use_cache=False`
            and no `attention_mask`; `"flatcollate"` runs `prepare_model_for_flattening`.
        lengths (`tuple[int, ...]`, *optional*): sequence lengths of the flattened row; at least two, so the row has
            a boundary. By default they come from the config (`flatcollate.check_lengths.plan_check`): one sequence
            longer than every sliding window or attention chunk it declares (a window too long for a CPU check is
            shrunk in the tiny copy, and the report says so), a length-1 sequence and an odd length.
        seed (`int`): seed of the weights and tokens.
        tolerance (`float`, *optional*): largest absolute difference of logits, loss and gradients that counts as
            exact. Defaults to 1e-5 in fp32 on the CPU; otherwise, per quantity, to twice the error of the per-sequence
            run in the same dtype and device against the fp32 CPU reference (the rule of flash-attn's own tests), and
            at least the dtype's resolution at the quantity's size: as inexact as the precision, never more.
        device (`str` or `torch.device`): where the candidate runs (`"cuda"` reaches the flash-attn / varlen
            kernels); the fp32 reference always runs on the CPU.
        dtype (`torch.dtype`): dtype of the candidate (`torch.bfloat16`, `torch.float16`, `torch.float32`).
        overrides (`dict`, *optional*): config attributes for the tiny model, e.g. `{"sliding_window": 4}`.

    Returns:
        `CheckReport`, one `BackendResult` per backend.

    >>> report = check_model("llama", backends=("flatcollate",), lengths=(3, 1, 4))
    >>> report.passed, report.results[0].status
    (True, 'exact')
    """
    from .vision.check import check_vision_model, image_text_model_type  # imports this module's report types

    if image_text_model_type(model.config if isinstance(model, PreTrainedModel) else model) is not None:
        options = {"lengths": lengths, "overrides": overrides, "device": device, "dtype": dtype}
        return check_vision_model(model, backends=backends, seed=seed, tolerance=tolerance, **options)
    if lengths is not None and len(lengths) < 2:
        raise ValueError(
            f"`lengths` {list(lengths)} gives a row without a sequence boundary, so nothing could leak and the check "
            "would prove nothing; pass at least two sequences (e.g. 7 1 12 4), or none to derive them from the config."
        )
    if lengths is not None and min(lengths) < 1:
        raise ValueError(f"`lengths` must be positive sequence lengths, got {list(lengths)}.")
    config = model.config if isinstance(model, PreTrainedModel) else tiny_config(model, **(overrides or {}))
    stateful = getattr(config, "model_type", "") in SEGMENTED_MIXERS
    plan = plan_check(config, lengths=lengths, stateful=stateful, shrink=not isinstance(model, PreTrainedModel))
    lengths = plan.lengths
    base = _tiny_model(model, seed, {**(overrides or {}), **plan.overrides})
    numbering = position_start(base)
    batch = _flattened_inputs(tuple(lengths), base.config.vocab_size, seed, pad_id=numbering and numbering[1])
    ref_logits, ref_loss, ref_grads = _run_alone(base, batch)
    device = torch.device(device)
    tolerances = _tolerances(base, batch, tolerance, device, dtype, (ref_logits, ref_loss, ref_grads))
    batch = _to(batch, device)
    results = []
    for backend in backends:
        candidate = copy.deepcopy(base).to(device=device, dtype=dtype)
        if backend == ATTN_IMPLEMENTATION:
            reason = unsupported_reason(candidate)
            if reason is None:
                prepare_model_for_flattening(candidate)
        else:
            reason = _set_vanilla(candidate, backend)
        if reason is None:
            try:
                logits, loss, grads = _run_flat(candidate, batch)
            except ValueError as error:  # a model or kernel that refuses flattened rows says so with a ValueError
                reason = str(error).splitlines()[0]
        if reason is not None:
            results.append(BackendResult(backend=backend, status="unsupported", reason=reason))
            continue
        results.append(compared(backend, (logits, loss, grads), (ref_logits, ref_loss, ref_grads), tolerances))
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
        "logits_diff": max(2 * (logits.cpu() - ref_logits).abs().max().item(), eps * ref_logits.abs().max().item()),
        "loss_diff": max(2 * (loss.cpu() - ref_loss).abs().item(), eps * ref_loss.abs().item()),
        "grad_diff": max(2 * _max_grad_diff(grads, ref_grads), eps * largest_grad),
    }


def _set_vanilla(model: PreTrainedModel, backend: str) -> str | None:
    """Select one of transformers' own backends; the reason it cannot be selected, or None."""
    try:
        model.set_attn_implementation(backend)
    except ValueError as error:  # transformers refuses backends a family does not implement
        return str(error).split(".")[0]
    model.config.use_cache = False
    return None
