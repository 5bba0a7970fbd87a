"""Checks of `flatcollate bench` options shared by the text and image-text benchmarks: each raises `UsageError` with
one line before any work starts."""

import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..cli import UsageError


def check_profile(profile: str) -> None:
    """Raise `UsageError` unless `profile` loads as a length profile (the message says what one is)."""
    from ..profiles.load import load_profile

    try:
        load_profile(profile)
    except (ValueError, OSError) as error:
        raise UsageError(f"--profile {profile}: {str(error).splitlines()[0]}") from None


def check_writable(out_dir: Path) -> None:
    """Raise `UsageError` unless `out_dir` is (or can be created as) a folder this process can write files into."""
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"--out-dir {out_dir}: exists and is not a folder.")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out_dir):
            pass
    except OSError as error:
        raise UsageError(f"--out-dir {out_dir}: cannot write there ({error.strerror or error}).") from None


def check_plotting() -> None:
    """Raise `UsageError` unless the report's plots can be drawn: matplotlib comes with the `bench` extra, not with
    the library, and a run should not end without its plots."""
    try:
        from . import plots  # noqa: F401  (what `write_report` imports: found on the path is not enough)
    except ModuleNotFoundError as error:
        raise UsageError(str(error)) from None


def check_attn(name: str, device: str) -> None:
    """Raise `UsageError` unless `--attn` names a backend transformers (or flatcollate) registers and whose kernel is
    installed: `auto`, `flatcollate`, `sdpa`, `eager`, `flex_attention` (CUDA), `flash_attention_2/3/4`."""
    from ..check.options import known_backends, missing_kernel

    if name == "auto":
        return
    known = known_backends()
    if name not in known:
        raise UsageError(f"--attn {name}: unknown backend; choose auto or one of {', '.join(known)}.")
    missing = missing_kernel(name, device)
    if missing:
        raise UsageError(f"--attn {name}: {missing}")


def check_pack_len(pack_len: int | None, max_length: int) -> None:
    """Raise `UsageError` for a `--pack-len` below `--max-length`: a sequence cut to `--max-length` would not fit."""
    if pack_len is not None and pack_len < max_length:
        raise UsageError(
            f"--pack-len {pack_len} is shorter than --max-length {max_length}, so a sequence of --max-length tokens "
            f"would fit no pack; pass --pack-len {max_length} or more, or lower --max-length."
        )


@dataclass(frozen=True)
class MemoryEstimate:
    """A lower bound of what one benchmark process needs, in bytes: the model with AdamW (weights, gradients and two
    moments, in the model's dtype) and the activations of the largest batch (`batch_size * max_length` tokens)."""

    parameters: int
    model: int
    activations: int

    @property
    def total(self) -> int:
        return self.model + self.activations


def memory_estimate(config) -> MemoryEstimate:
    """`MemoryEstimate` of a `SFTBenchConfig`, the model counted on the meta device (nothing is allocated).

    Activations kept for the backward, per token: about 10 hidden-size vectors and 3 intermediate-size ones per
    layer in the model's dtype, and the logits with their gradient in fp32 (`8 * vocab_size` bytes).
    """
    import torch
    from transformers import AutoModelForCausalLM

    from .build import model_config

    cfg = model_config(config)
    with torch.device("meta"):
        parameters = sum(p.numel() for p in AutoModelForCausalLM.from_config(cfg).parameters())
    size = 2 if config.dtype == "bfloat16" else 4
    text = cfg.get_text_config()
    hidden, layers = text.hidden_size, text.num_hidden_layers
    intermediate = getattr(text, "intermediate_size", None) or 4 * hidden
    tokens = config.batch_size * config.max_length
    per_token = layers * (10 * hidden + 3 * intermediate) * size + 8 * text.vocab_size
    return MemoryEstimate(parameters, 4 * size * parameters, tokens * per_token)


def available_bytes(device: str) -> int:
    """Memory free on `device` now: the GPU's free memory, or the host's available memory."""
    import psutil
    import torch

    if device == "cuda":
        return torch.cuda.mem_get_info()[0]
    return psutil.virtual_memory().available


def check_memory(config, device: str) -> None:
    """Raise `UsageError` when `memory_estimate(config)` exceeds what `device` has free (a run would be killed by the
    out-of-memory killer, or fail after minutes of work)."""
    estimate, free = memory_estimate(config), available_bytes(device)
    if estimate.total <= free:
        return
    from .report import format_parameters

    gib = 2**30
    what = "--full-size " + config.model if not config.tiny else f"--batch-size {config.batch_size}"
    raise UsageError(
        f"{what} needs about {estimate.total / gib:,.1f} GiB ({format_parameters(estimate.parameters)} parameters in "
        f"{config.dtype} with AdamW: {estimate.model / gib:,.1f} GiB; activations of {config.batch_size} x "
        f"{config.max_length} tokens: {estimate.activations / gib:,.1f} GiB) but the {device.upper()} has "
        f"{free / gib:,.1f} GiB free; shrink it (--set num_hidden_layers=2, a smaller --batch-size or --max-length) "
        "or run on a GPU (--device cuda --dtype bfloat16)."
    )
