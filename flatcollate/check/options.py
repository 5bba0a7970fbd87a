"""Checks of `flatcollate check` options, before any model is built: each mistake raises `UsageError` (one line,
exit status 2). torch and transformers are imported inside the functions, so `--help` stays fast."""

import argparse
import difflib
import re

from .._paths import expand_path
from ..cli import UsageError

MAX_CHECK_TOKENS = 4096
"""Largest total of `--lengths`: the eager runs build a `(T, T)` fp32 mask per layer call (64 MiB at 4096)."""


def validate_options(args: argparse.Namespace) -> None:
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
    if args.device not in ("cpu", "cuda") and not args.device.startswith("cuda:"):
        raise UsageError(f"--device {args.device}: pass cpu or cuda (cuda:N for one GPU).")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(
            f"--device {args.device}: this torch ({torch.__version__}) sees no CUDA device; install a CUDA build of "
            "torch on a GPU machine, or check on the CPU."
        )
    known = known_backends()
    for backend in args.backends:
        if backend not in known:
            raise UsageError(f"--backends: unknown backend {backend!r}; choose from {', '.join(known)}.")
        missing = missing_kernel(backend, args.device)
        if missing:
            raise UsageError(f"--backends {backend}: {missing}")
    validate_model_argument(args.model)


def validate_task_options(args: argparse.Namespace, image_text: str | None) -> None:
    """Raise `UsageError` for options the `dpo` and `reward` checks do not take (fp32 on the CPU; `reward` takes text
    families only)."""
    if image_text is not None and args.task != "dpo":
        raise UsageError(
            f"--task {args.task}: {image_text} is an image-text-to-text architecture; the {args.task} check takes text "
            "families (FlatRewardTrainer flattens text pairs only). Check it with --task dpo or --task sft."
        )
    for option, set_ in (("--device", args.device != "cpu"), ("--dtype", args.dtype != "float32")):
        if set_:
            raise UsageError(f"{option}: the {args.task} check runs in float32 on the CPU; leave {option} out.")


def validate_image_text_options(args: argparse.Namespace, model_type: str) -> None:
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


def known_backends() -> list[str]:
    from transformers import AttentionInterface

    from ..attention import ATTN_IMPLEMENTATION

    names = ["eager", *AttentionInterface._global_mapping, ATTN_IMPLEMENTATION]
    return list(dict.fromkeys(n for n in names if "|" not in n))  # "paged|eager" serves generation only


def missing_kernel(backend: str, device: str) -> str | None:
    """Why `backend` cannot train on `device` (`"cpu"`, `"cuda"`, `"cuda:N"`) here (a package it needs is not
    installed, or the device has no backward for it), or None."""
    from transformers.utils import is_flash_attn_2_available, is_flash_attn_3_available

    from ..attention import capabilities

    if backend == "flash_attention_2" and not is_flash_attn_2_available():
        return "flash-attn is not installed (or there is no CUDA GPU); on CUDA: pip install 'flatcollate[flash]'."
    if backend == "flash_attention_3" and not is_flash_attn_3_available():
        return "flash-attn 3 (flash_attn_interface) is not installed, or there is no Hopper GPU."
    if backend == "flash_attention_4" and capabilities.flash_attn_4_varlen_func is None:
        return "flash-attn 4 (pip install flash-attn-4) is not installed, or there is no CUDA GPU."
    if backend == "flex_attention" and device == "cpu":
        return "flex attention has no backward pass on the CPU; train it on CUDA (--device cuda), or pick another."
    return None


def validate_model_argument(model: str, *, command: str = "check") -> None:
    """Raise `UsageError` unless `model` is a registered model_type or a folder with a config.json; an unknown name
    gets the closest model_types (the mapping also holds a few class names, which are not suggested)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    path = expand_path(model)
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
            f"{model!r} is not a local folder and looks like a Hub id; the {command} runs offline from a config: "
            f"download it first (hf download {model} config.json --local-dir <folder>) and pass the folder with "
            "config.json, or a model_type such as llama."
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
