"""`flatcollate check`: is a model exact on flattened batches, per attention backend?

A tiny random copy of the model runs one flattened row and the same sequences one at a time; logits, loss and
gradients must agree (fp32 CPU, tolerance 1e-5). The per-sequence reference runs with `eager` attention.
"""

import argparse
import copy
import difflib
import importlib.util
import itertools
import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from transformers import AttentionInterface, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.utils import is_flash_attn_2_available, is_flash_attn_3_available

from ._conventions import IGNORE_INDEX
from .attention import ATTN_IMPLEMENTATION
from .boundaries import cu_seqlens_to_position_ids, lengths_to_cu_seqlens
from .cli import HelpFormatter, UsageError
from .modeling import prepare_model_for_flattening, unsupported_reason
from .modeling.families import UNSUPPORTED_FAMILIES
from .models import tiny_causal_lm, tiny_config

DEFAULT_BACKENDS = ("sdpa", "eager", ATTN_IMPLEMENTATION)
DEFAULT_LENGTHS = (7, 1, 12, 4)


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

    @property
    def passed(self) -> bool:
        return all(result.status == "exact" for result in self.results)

    def to_dict(self) -> dict:
        return {**asdict(self), "passed": self.passed}

    def to_markdown(self) -> str:
        """A table, one row per backend."""
        rows = [f"{self.model_type} (lengths {list(self.lengths)}, tolerance {self.tolerance:g})", ""]
        rows += [
            "| backend | status | max logit diff | loss diff | max grad diff | reason |",
            "|---|---|---|---|---|---|",
        ]
        for r in self.results:
            cells = [_fmt(r.logits_diff), _fmt(r.loss_diff), _fmt(r.grad_diff)]
            rows.append(f"| {r.backend} | {r.status} | " + " | ".join(cells) + f" | {r.reason or ''} |")
        return "\n".join(rows)


def _fmt(value: float | None) -> str:
    return "" if value is None else f"{value:.2e}"


def _tiny_model(model: str | PretrainedConfig | PreTrainedModel, seed: int, overrides: dict) -> PreTrainedModel:
    if isinstance(model, PreTrainedModel):
        return copy.deepcopy(model).float().eval()
    return tiny_causal_lm(model, attn_implementation="eager", seed=seed, **overrides)


def _flattened_inputs(lengths: tuple[int, ...], vocab_size: int, seed: int) -> dict:
    """A flattened row as the collator emits it: restarting positions, boundaries, first label of each sequence -100."""
    cu = lengths_to_cu_seqlens(np.asarray(lengths))
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, vocab_size, (1, int(cu[-1])), generator=generator)
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


def _run_flat(model, batch):
    model.zero_grad(set_to_none=True)
    out = model(**{k: v for k, v in batch.items() if k != "labels"}, use_cache=False)
    count = (batch["labels"][0, 1:] != IGNORE_INDEX).sum()
    loss = _token_losses(out.logits, batch["labels"]) / count
    loss.backward()
    return out.logits.detach(), loss.detach(), _grads(model)


def _run_alone(model, batch):
    """Reference: every sequence through the model on its own; one forward per sequence, never across."""
    model.zero_grad(set_to_none=True)
    bounds = batch["cu_seq_lens_q"].tolist()
    count = (batch["labels"][0, 1:] != IGNORE_INDEX).sum()
    logits, total = [], 0.0
    for start, end in itertools.pairwise(bounds):
        ids, labels = batch["input_ids"][:, start:end], batch["labels"][:, start:end]
        out = model(input_ids=ids, position_ids=torch.arange(end - start)[None], use_cache=False)
        total = total + _token_losses(out.logits, labels)
        logits.append(out.logits.detach())
    loss = total / count
    loss.backward()
    return torch.cat(logits, dim=1), loss.detach(), _grads(model)


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _max_grad_diff(a: dict, b: dict) -> float:
    names = a.keys() | b.keys()
    zero = torch.zeros(())
    return max((a.get(n, zero) - b.get(n, zero)).abs().max().item() for n in names) if names else 0.0


def check_model(
    model: str | PretrainedConfig | PreTrainedModel,
    *,
    backends: tuple[str, ...] = DEFAULT_BACKENDS,
    lengths: tuple[int, ...] = DEFAULT_LENGTHS,
    seed: int = 0,
    tolerance: float = 1e-5,
    overrides: dict | None = None,
) -> CheckReport:
    """Compare a flattened batch with the same sequences run one at a time, per attention backend.

    Args:
        model: a `model_type` (`"llama"`), a folder with a `config.json`, a config (each shrunk by
            `flatcollate.models.tiny_config`), or a model (copied, used at its size in fp32).
        backends (`tuple[str, ...]`): `"sdpa"` and `"eager"` run transformers' own backends with `use_cache=False`
            and no `attention_mask`; `"flatcollate"` runs `prepare_model_for_flattening`.
        lengths (`tuple[int, ...]`): sequence lengths of the flattened row; at least two, so the row has a boundary.
        seed (`int`): seed of the weights and tokens.
        tolerance (`float`): largest absolute difference of logits, loss and gradients that counts as exact.
        overrides (`dict`, *optional*): config attributes for the tiny model, e.g. `{"sliding_window": 4}`.

    Returns:
        `CheckReport`, one `BackendResult` per backend.

    >>> report = check_model("llama", backends=("flatcollate",), lengths=(3, 1, 4))
    >>> report.passed, report.results[0].status
    (True, 'exact')
    """
    if len(lengths) < 2:
        raise ValueError(
            f"`lengths` {list(lengths)} gives a row without a sequence boundary, so nothing could leak and the check "
            "would prove nothing; pass at least two sequences (e.g. 7 1 12 4)."
        )
    if min(lengths) < 1:
        raise ValueError(f"`lengths` must be positive sequence lengths, got {list(lengths)}.")
    base = _tiny_model(model, seed, overrides or {})
    batch = _flattened_inputs(tuple(lengths), base.config.vocab_size, seed)
    ref_logits, ref_loss, ref_grads = _run_alone(base, batch)
    results = []
    for backend in backends:
        candidate = copy.deepcopy(base)
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
        diffs = {
            "logits_diff": (logits - ref_logits).abs().max().item(),
            "loss_diff": (loss - ref_loss).abs().item(),
            "grad_diff": _max_grad_diff(grads, ref_grads),
        }
        exact = all(value <= tolerance for value in diffs.values())
        results.append(BackendResult(backend=backend, status="exact" if exact else "contaminated", **diffs))
    return CheckReport(model_type=base.config.model_type, lengths=tuple(lengths), tolerance=tolerance, results=results)


def _set_vanilla(model: PreTrainedModel, backend: str) -> str | None:
    """Select one of transformers' own backends; the reason it cannot be selected, or None."""
    try:
        model.set_attn_implementation(backend)
    except ValueError as error:  # transformers refuses backends a family does not implement
        return str(error).split(".")[0]
    model.config.use_cache = False
    return None


MAX_CHECK_TOKENS = 4096
"""Largest total of `--lengths`: the eager runs build a `(T, T)` fp32 mask per layer call (64 MiB at 4096)."""


def register_cli(subparsers) -> None:
    parser = subparsers.add_parser(
        "check",
        help="check that a model is exact on flattened batches, per backend",
        description=(
            "Run a tiny random copy of MODEL on one flattened row and on the same sequences one at a time, per\n"
            "attention backend, and compare logits, loss and gradients (fp32, CPU).\n\n"
            "Exit status 0 when the backend prepare_model_for_flattening selects is exact, 1 when it is not (or the\n"
            "family cannot be flattened exactly), 2 for a usage error. transformers' own backends are reported for\n"
            "information; --require-all-backends makes every checked backend count."
        ),
        formatter_class=HelpFormatter,
    )
    parser.add_argument(
        "model", help="a model_type registered in transformers (e.g. llama) or a local folder with a config.json"
    )
    parser.add_argument(
        "--backends",
        nargs="+",
        default=list(DEFAULT_BACKENDS),
        help=f"attention backends to check; '{ATTN_IMPLEMENTATION}' is what prepare_model_for_flattening selects",
    )
    parser.add_argument(
        "--lengths",
        nargs="+",
        type=int,
        default=list(DEFAULT_LENGTHS),
        help=f"sequence lengths of the flattened row: at least two, {MAX_CHECK_TOKENS} tokens in all at most",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights and tokens")
    parser.add_argument(
        "--tolerance", type=float, default=1e-5, help="largest absolute difference that counts as exact (> 0)"
    )
    parser.add_argument(
        "--require-all-backends",
        action="store_true",
        help="exit 1 unless every checked backend is exact, not only the one prepare_model_for_flattening selects",
    )
    parser.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    _validate(args)
    model_type, reason = _family_reason(args.model)
    if reason is not None:
        print(f"verdict: {model_type} is NOT safe with flatcollate: {reason}.")
        return 1
    report = check_model(
        args.model, backends=tuple(args.backends), lengths=tuple(args.lengths), seed=args.seed, tolerance=args.tolerance
    )
    print(report.to_markdown())
    safe, line = _verdict(report, require_all=args.require_all_backends)
    print(f"\n{line}")
    return 0 if safe else 1


def _validate(args: argparse.Namespace) -> None:
    """Raise `UsageError` for option values the check cannot run with (before any model is built)."""
    lengths = " ".join(map(str, args.lengths))
    if len(args.lengths) < 2 or min(args.lengths) < 1:
        raise UsageError(
            f"--lengths {lengths}: pass at least two positive sequence lengths, so the flattened row has a boundary "
            "to check (e.g. --lengths 7 1 12 4)."
        )
    total = sum(args.lengths)
    if total > MAX_CHECK_TOKENS:
        gib = total**2 * 4 / 2**30
        raise UsageError(
            f"--lengths {lengths} sum to {total} tokens; the eager runs build a {total} x {total} mask "
            f"({gib:,.1f} GiB) and a check needs only a few boundaries: keep the total at most {MAX_CHECK_TOKENS} "
            "(e.g. --lengths 7 1 12 4)."
        )
    if not (math.isfinite(args.tolerance) and args.tolerance > 0):
        raise UsageError(f"--tolerance {args.tolerance}: pass a positive, finite number (default 1e-5).")
    known = _known_backends()
    for backend in args.backends:
        if backend not in known:
            raise UsageError(f"--backends: unknown backend {backend!r}; choose from {', '.join(known)}.")
        missing = _missing_kernel(backend)
        if missing:
            raise UsageError(f"--backends {backend}: {missing}")
    validate_model_argument(args.model)


def _known_backends() -> list[str]:
    names = ["eager", *AttentionInterface._global_mapping, ATTN_IMPLEMENTATION]
    return list(dict.fromkeys(n for n in names if "|" not in n))  # "paged|eager" serves generation only


def _missing_kernel(backend: str) -> str | None:
    """Why `backend` cannot run in this environment (a package it needs is not installed), or None."""
    if backend == "flash_attention_2" and not is_flash_attn_2_available():
        return "flash-attn is not installed (or there is no CUDA GPU); on CUDA: pip install 'flatcollate[flash]'."
    if backend == "flash_attention_3" and not is_flash_attn_3_available():
        return "flash-attn 3 (flash_attn_interface) is not installed, or there is no Hopper GPU."
    if backend == "flash_attention_4" and importlib.util.find_spec("flash_attn") is None:
        return "flash-attn 4 (pip install flash-attn-4) is not installed, or there is no CUDA GPU."
    if backend == "flex_attention":  # the check runs on the CPU, where flex attention has no backward
        return "flex attention has no backward pass on the CPU, where the check runs; check the other backends."
    return None


def validate_model_argument(model: str) -> None:
    """Raise `UsageError` unless `model` is a registered model_type or a folder with a config.json."""
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise UsageError(f"{model}: the folder has no config.json; pass the folder a model was saved to.")
        return
    if model in CONFIG_MAPPING:
        return
    if path.exists():
        raise UsageError(f"{model} is a file; pass the folder that holds config.json, or a model_type such as llama.")
    if re.fullmatch(r"[\w-]+/[\w.-]+", model) and not model.startswith("."):
        raise UsageError(
            f"{model!r} is not a local folder and looks like a Hub id; the check runs offline from a config: download "
            f"it first (hf download {model} config.json --local-dir <folder>) and pass the folder with config.json, "
            "or a model_type such as llama."
        )
    if "/" in model or model.startswith((".", "~")):
        raise UsageError(f"path {model} not found; pass an existing folder with a config.json, or a model_type.")
    close = difflib.get_close_matches(model, list(CONFIG_MAPPING), n=3)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    raise UsageError(
        f"unknown model_type {model!r}: pass a model_type registered in transformers (llama, qwen2, mistral, ...) "
        f"or a folder with a config.json.{hint}"
    )


def _family_reason(model: str) -> tuple[str, str | None]:
    """The config's model_type and why it can never be exact on flattened batches (None when it may be)."""
    config = tiny_config(model)
    model_type = config.model_type
    if type(config) in AutoModelForCausalLM._model_mapping:
        return model_type, None
    if model_type in UNSUPPORTED_FAMILIES:
        return model_type, UNSUPPORTED_FAMILIES[model_type]
    if getattr(config, "is_encoder_decoder", False):
        return model_type, "it is an encoder-decoder model; flattening applies to decoder-only causal LMs"
    return model_type, f"transformers has no causal-LM class for {model_type}"


def _verdict(report: CheckReport, *, require_all: bool) -> tuple[bool, str]:
    """Whether the backends that count are exact, and the one-line verdict."""
    by_backend = {r.backend: r for r in report.results}
    selected = by_backend.get(ATTN_IMPLEMENTATION)
    counted = report.results if require_all or selected is None else [selected]
    failed = [r for r in counted if r.status != "exact"]
    subject = "with flatcollate" if counted == [selected] else "on every checked backend"
    if failed:
        why = "; ".join(f"{r.backend} {r.status}" + (f" ({r.reason})" if r.reason else "") for r in failed)
        return False, f"verdict: {report.model_type} is NOT safe {subject}: {why}."
    line = f"verdict: {report.model_type} is safe {subject} (logits, loss and gradients within {report.tolerance:g})."
    others = [f"{r.backend} {r.status}" for r in report.results if r not in counted and r.status != "exact"]
    if others:
        line += (
            f" Other backends: {', '.join(others)}; information only, prepare_model_for_flattening does not use them "
            "(--require-all-backends makes them count)."
        )
    return True, line
