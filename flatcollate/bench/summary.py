"""Raw per-repeat timings of the throughput benchmark into medians, spreads, ratios and the headline figure.

The headline is what `flatcollate bench` prints first: how many times padded's real tokens per second `flattened`
trains, and the same for transformers' own padding-free path (`hf_flattened`), each the median of the ratios taken
within each repeat. On a CPU it uses CPU seconds, which other processes on a shared machine disturb far less than
wall-clock seconds. A spread of those ratios wider than `NOISY_SPREAD` of the median marks the figure as not to be
trusted.
"""

import os
import platform
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from .batches import PEER_MODE, real_tokens, slot_tokens
from .flops import mfu, peak_flops
from .repeats import spread

NOISY_SPREAD = 0.25
"""(max - min) / median of the headline ratio above which the run is flagged as too noisy to trust."""


def summarize(
    config,
    runs,
    batches,
    collate_s,
    *,
    pool,
    pack_len,
    skipped,
    device,
    attn,
    profile_fill,
    settle_passes,
    pass_flops: float | None = None,
) -> dict:
    """Turn raw per-repeat timings into medians, spreads and ratios to `padded` taken within each repeat.

    `pass_flops` (the model FLOPs of one pass over the pool's sequences, `flatcollate.bench.flops`) gives each mode
    its model TFLOP/s and, on a GPU whose peak is known, its MFU."""
    environment = _environment(device, attn)
    device_peak = peak_flops(environment["device"], config.dtype) if device.type == "cuda" else None
    modes = {}
    for mode, passes in runs.items():
        real = sum(real_tokens(b) for b in batches[mode])
        slots = sum(slot_tokens(b) for b in batches[mode])
        tps = np.array([real / sum(p["step_s"]) for p in passes])
        cpu_tps = np.array([real / sum(p["cpu_s"]) for p in passes])
        step_s = np.concatenate([p["step_s"] for p in passes])
        peak = [p["peak_memory_bytes"] for p in passes]
        added = [p["added_memory_bytes"] for p in passes]
        modes[mode] = {
            "tokens_per_s": spread(tps),
            "tokens_per_cpu_s": spread(cpu_tps) if device.type == "cpu" else None,
            "seconds_per_step": spread(step_s),
            "peak_memory_bytes": None if None in peak else int(np.median(peak)),
            "peak_memory_over_baseline_bytes": None if None in added else int(np.median(added)),
            "real_tokens_per_epoch": real,
            "computed_tokens_per_epoch": slots,
            "padding_fraction": 1 - real / slots,
            "steps_per_epoch": len(batches[mode]),
            "collate_s": collate_s[mode],
            "first_step_s": spread([p["first_step_s"] for p in passes]) if "first_step_s" in passes[0] else None,
            "model_tflops_per_s": None,
            "mfu": None,
            "losses": passes[0]["losses"],
        }
        if pass_flops is not None:
            tflops = spread([pass_flops / sum(p["step_s"]) / 1e12 for p in passes])
            modes[mode]["model_tflops_per_s"] = tflops
            modes[mode]["mfu"] = mfu(tflops["median"] * 1e12, 1.0, device_peak)
    ratios = {}
    if "padded" in runs:
        for mode, passes in runs.items():
            ratios[mode] = {"tokens_per_s": _repeat_ratios(passes, runs["padded"], "step_s")}
            if device.type == "cpu":
                ratios[mode]["tokens_per_cpu_s"] = _repeat_ratios(passes, runs["padded"], "cpu_s")
            for key in ("peak_memory_bytes", "peak_memory_over_baseline_bytes"):
                if modes[mode][key] and modes["padded"][key]:
                    ratios[mode][key.removesuffix("_bytes")] = modes[mode][key] / modes["padded"][key]
    equivalence = None
    if "padded" in runs and "flattened" in runs:
        pairs = zip(runs["padded"], runs["flattened"], strict=True)
        diff = max(float(np.abs(np.subtract(a["losses"], b["losses"])).max()) for a, b in pairs)
        equivalence = {"compared": ["padded", "flattened"], "steps": config.steps, "max_abs_loss_diff": diff}
    return {
        "config": asdict(config),
        "environment": {**environment, "warm_up_passes": settle_passes, "peak_flops": device_peak},
        "pass_flops": pass_flops,
        "headline": headline(runs, device),
        "pool": {
            "sequences": len(pool.lengths),
            "real_tokens": int(pool.lengths.sum()),
            "mean_length": float(pool.lengths.mean()),
            "max_length_seen": int(pool.lengths.max()),
            "truncated": pool.truncated,
            "pack_len": int(pack_len),
            "profile_padded_fill": profile_fill,
        },
        "modes": modes,
        "ratios_vs_padded": ratios,
        "loss_equivalence": equivalence,
        "skipped": skipped,
    }


def _repeat_ratios(passes: list[dict], baseline: list[dict], key: str) -> dict:
    """Throughput ratio to the baseline within each repeat: every mode trains the same tokens per pass, so it is the
    baseline's pass time over this mode's pass time."""
    base = np.array([sum(p[key]) for p in baseline])
    return spread(base / np.array([sum(p[key]) for p in passes]))


def cpu_name() -> str:
    """The CPU's model name (`/proc/cpuinfo` on Linux, where `platform.processor()` is often empty), or `"cpu"`."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    return platform.processor() or "cpu"


def _environment(device: torch.device, attn: str) -> dict:
    return {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name(),
        "device_type": device.type,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "flattened_attn": attn,
        "padded_attn": "sdpa",
    }


def headline(
    runs: dict,
    device: torch.device,
    *,
    subject: str = "flatcollate (flattened)",
    baseline: str = "padded batches",
) -> dict | None:
    """The one headline rule of every benchmark (SFT, image-text, DPO, reward): flattened over padded, and with
    `hf_flattened` also it over padded and flattened over it, each the median of the ratios taken within each repeat,
    on CPU seconds on a CPU (other work on a shared machine stretches wall-clock time far more) and on wall-clock
    seconds on a GPU; `noisy` when the flattened ratio's spread exceeds `NOISY_SPREAD` of its median. `subject` and
    `baseline` name the two sides in the printed headline. None without `padded` and `flattened`."""
    if "padded" not in runs or "flattened" not in runs:
        return None
    key = "cpu_s" if device.type == "cpu" else "step_s"
    flattened = _repeat_ratios(runs["flattened"], runs["padded"], key)
    result = {
        "subject": subject,
        "baseline": baseline,
        "metric": "real tokens per CPU second" if key == "cpu_s" else "real tokens per second",
        "flattened_vs_padded": flattened,
        "peer_vs_padded": None,
        "flattened_vs_peer": None,
        "relative_spread": (flattened["max"] - flattened["min"]) / flattened["median"],
    }
    if PEER_MODE in runs:
        result["peer_vs_padded"] = _repeat_ratios(runs[PEER_MODE], runs["padded"], key)
        result["flattened_vs_peer"] = _repeat_ratios(runs["flattened"], runs[PEER_MODE], key)
    result["noisy"] = bool(result["relative_spread"] > NOISY_SPREAD)
    return result
