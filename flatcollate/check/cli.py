"""The `flatcollate check` command: options, usage errors in one line, and a verdict on the selected backend."""

import argparse
import difflib
import importlib.util
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING

from ..cli import HelpFormatter, UsageError

if TYPE_CHECKING:
    from .report import CheckReport

# torch, transformers and the check itself are imported inside the functions that validate and run a check, so
# `flatcollate check --help` answers at once.

DTYPES = ("bfloat16", "float16", "float32")
"""Names of the torch dtypes a flattened run can use."""

DEFAULT_BACKENDS_TEXT = "sdpa eager flatcollate"
"""`flatcollate.check.DEFAULT_BACKENDS` as `--help` shows it (without importing the check; a test keeps them equal)."""

MAX_CHECK_TOKENS = 4096
"""Largest total of `--lengths`: the eager runs build a `(T, T)` fp32 mask per layer call (64 MiB at 4096)."""


def register_cli(subparsers) -> None:
    parser = subparsers.add_parser(
        "check",
        help="check that a model is exact on flattened batches, per backend",
        description=(
            "Run a tiny random copy of MODEL on one flattened row and on the same sequences one at a time, per\n"
            "attention backend, and compare logits, loss and gradients (fp32, CPU). An image-text-to-text MODEL\n"
            "(qwen2_vl, llava, ...) runs examples with 1, 2 and 0 images, flattened, against each example alone.\n\n"
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
        default=None,
        help="attention backends to check; 'flatcollate' is what prepare_model_for_flattening selects (default: "
        f"{DEFAULT_BACKENDS_TEXT})",
    )
    parser.add_argument(
        "--lengths",
        nargs="+",
        type=int,
        default=None,
        help=(
            "sequence lengths of the flattened row: at least two, "
            f"{MAX_CHECK_TOKENS} tokens in all at most (default: from the config, one sequence longer than every "
            "sliding window or attention chunk it declares, a length-1 sequence and an odd length)"
        ),
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights and tokens")
    parser.add_argument(
        "--tolerance",
        type=float,
        default=None,
        help="largest absolute difference that counts as exact (> 0); default 1e-5 in float32 on the CPU, else twice "
        "the error of the per-sequence run in the same dtype and device",
    )
    parser.add_argument(
        "--device", default="cpu", help="where the flattened run goes: cpu, or cuda to reach the flash-attn kernels"
    )
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=DTYPES,
        help="dtype of the flattened run; the reference runs in float32 on the CPU",
    )
    parser.add_argument(
        "--require-all-backends",
        action="store_true",
        help="exit 1 unless every checked backend is exact, not only the one prepare_model_for_flattening selects",
    )
    parser.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    import torch

    from .model import check_model
    from .text import DEFAULT_BACKENDS
    from .vision import image_text_model_type, not_built_reason

    args.backends = args.backends or list(DEFAULT_BACKENDS)
    _validate(args)
    image_text = image_text_model_type(args.model)
    if image_text is not None:
        _validate_image_text(args, image_text)
        if (not_built := not_built_reason(image_text)) is not None:
            print(f"verdict: {image_text} was not checked: {not_built}.")
            return 1
    else:
        model_type, reason = _family_reason(args.model)
        if reason is not None:
            print(f"verdict: {model_type} is NOT safe with flatcollate: {reason}.")
            return 1
    lengths = None if args.lengths is None else tuple(args.lengths)
    report = check_model(
        args.model,
        backends=tuple(args.backends),
        lengths=lengths,
        seed=args.seed,
        tolerance=args.tolerance,
        device=args.device,
        dtype=getattr(torch, args.dtype),
    )
    print(report.to_markdown())
    safe, line = _verdict(report, require_all=args.require_all_backends)
    print(f"\n{line}")
    return 0 if safe else 1


def _validate(args: argparse.Namespace) -> None:
    """Raise `UsageError` for option values the check cannot run with (before any model is built)."""
    import torch

    lengths = " ".join(map(str, args.lengths or []))
    if args.lengths is not None and (len(args.lengths) < 2 or min(args.lengths) < 1):
        raise UsageError(
            f"--lengths {lengths}: pass at least two positive sequence lengths, so the flattened row has a boundary "
            "to check (e.g. --lengths 7 1 12 4)."
        )
    total = sum(args.lengths or [])
    if total > MAX_CHECK_TOKENS:
        gib = total**2 * 4 / 2**30
        raise UsageError(
            f"--lengths {lengths} sum to {total} tokens; the eager runs build a {total} x {total} mask "
            f"({gib:,.1f} GiB) and a check needs only a few boundaries: keep the total at most {MAX_CHECK_TOKENS} "
            "(e.g. --lengths 7 1 12 4)."
        )
    if args.tolerance is not None and not (math.isfinite(args.tolerance) and args.tolerance > 0):
        raise UsageError(f"--tolerance {args.tolerance}: pass a positive, finite number (default 1e-5).")
    if args.device not in ("cpu", "cuda") and not args.device.startswith("cuda:"):
        raise UsageError(f"--device {args.device}: pass cpu or cuda (cuda:N for one GPU).")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(
            f"--device {args.device}: this torch ({torch.__version__}) sees no CUDA device; install a CUDA build of "
            "torch on a GPU machine, or check on the CPU."
        )
    known = _known_backends()
    for backend in args.backends:
        if backend not in known:
            raise UsageError(f"--backends: unknown backend {backend!r}; choose from {', '.join(known)}.")
        missing = _missing_kernel(backend)
        if missing:
            raise UsageError(f"--backends {backend}: {missing}")
    validate_model_argument(args.model)


def _validate_image_text(args: argparse.Namespace, model_type: str) -> None:
    """Raise `UsageError` for options an image-text-to-text check does not take (its examples hold images)."""
    given = {
        "--lengths": args.lengths is not None,
        "--device": args.device != "cpu",
        "--dtype": args.dtype != "float32",
    }
    for option, set_ in given.items():
        if set_:
            raise UsageError(
                f"{option}: {model_type} is an image-text-to-text architecture, checked on examples with 1, 2 and 0 "
                f"images in float32 on the CPU; leave {option} out."
            )


def _known_backends() -> list[str]:
    from transformers import AttentionInterface

    from ..attention import ATTN_IMPLEMENTATION

    names = ["eager", *AttentionInterface._global_mapping, ATTN_IMPLEMENTATION]
    return list(dict.fromkeys(n for n in names if "|" not in n))  # "paged|eager" serves generation only


def _missing_kernel(backend: str) -> str | None:
    """Why `backend` cannot run in this environment (a package it needs is not installed), or None."""
    from transformers.utils import is_flash_attn_2_available, is_flash_attn_3_available

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
    """Raise `UsageError` unless `model` is a registered model_type or a folder with a config.json; an unknown name
    gets the closest model_types (the mapping also holds a few class names, which are not suggested)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

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
    model_types = [name for name in CONFIG_MAPPING if name == name.lower()]
    close = difflib.get_close_matches(model.lower(), model_types, n=3)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    raise UsageError(
        f"unknown model_type {model!r}: pass a model_type registered in transformers (llama, qwen2, mistral, ...) "
        f"or a folder with a config.json.{hint}"
    )


def _family_reason(model: str) -> tuple[str, str | None]:
    """The config's model_type and why it can never be exact on flattened batches (None when it may be)."""
    from transformers import AutoModelForCausalLM

    from ..modeling.families import UNSUPPORTED_FAMILIES
    from ..models import tiny_config

    config = tiny_config(model)
    model_type = config.model_type
    if type(config) in AutoModelForCausalLM._model_mapping:
        return model_type, None
    if model_type in UNSUPPORTED_FAMILIES:
        return model_type, UNSUPPORTED_FAMILIES[model_type]
    if getattr(config, "is_encoder_decoder", False):
        return model_type, "it is an encoder-decoder model; flattening applies to decoder-only causal LMs"
    return model_type, f"transformers has no causal-LM class for {model_type}"


def _verdict(report: "CheckReport", *, require_all: bool) -> tuple[bool, str]:
    """Whether the backends that count are exact, and the one-line verdict."""
    from ..attention import ATTN_IMPLEMENTATION

    by_backend = {r.backend: r for r in report.results}
    selected = by_backend.get(ATTN_IMPLEMENTATION)
    counted = report.results if require_all or selected is None else [selected]
    failed = [r for r in counted if r.status != "exact"]
    subject = "with flatcollate" if counted == [selected] else "on every checked backend"
    if failed:
        why = "; ".join(f"{r.backend} {r.status}" + (f" ({r.reason})" if r.reason else "") for r in failed)
        return False, f"verdict: {report.model_type} is NOT safe {subject}: {why}."
    within = _tolerance_words(report)
    line = f"verdict: {report.model_type} is safe {subject} (logits, loss and gradients within {within})."
    others = [f"{r.backend} {r.status}" for r in report.results if r not in counted and r.status != "exact"]
    if others:
        line += (
            f" Other backends: {', '.join(others)}; information only, prepare_model_for_flattening does not use them "
            "(--require-all-backends makes them count)."
        )
    return True, line


def _tolerance_words(report: "CheckReport") -> str:
    if len(set(report.tolerances.values())) > 1:
        return f"the {report.dtype} tolerances above"
    return f"{report.tolerance:g}"
