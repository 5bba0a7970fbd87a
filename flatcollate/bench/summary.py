"""Raw per-repeat figures of every task into medians, spreads, ratios to `padded`, MFU, the loss agreement and the
headline: one summary for every benchmark.

Every mode of a run trains the same real tokens per timed pass (`harness.Workload.real_tokens`), so real tokens per
second is those tokens over the summed step times of a pass, and a ratio between two modes is taken within each
repeat (the modes took turns in it). The headline is what `flatcollate bench` prints last: how many times padded's
real tokens per second `flattened` trains (and transformers' own padding-free path, `hf_flattened`, where measured),
the median of the within-repeat ratios, on CPU seconds on a CPU (other processes disturb them far less than
wall-clock seconds) and on wall-clock seconds on a GPU. A spread of those ratios wider than `NOISY_SPREAD` of the
median marks it as not to be trusted.
"""

import os
import platform
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from .config import PEER_MODE
from .flops import mfu, peak_flops
from .repeats import Repeats, ratio_spread, spread

NOISY_SPREAD = 0.25
"""(max - min) / median of the headline ratio above which the run is flagged as too noisy to trust."""


def summarize(task, config, work, run: Repeats, *, device: torch.device, process_per_run: bool = True) -> dict:
    """The result of `harness.run_bench`; `process_per_run` says whether every run was a worker process.

    Returns:
        `dict` (JSON-ready): `task`, `config`, `environment` (device, threads, versions, peak FLOP/s, what the task's
        workers add), `model`, `data` (the task's, `Workload.data`), `modes` (per mode: real tokens/s and per CPU
        second, median and min-max; seconds per step; peak memory and what the timed pass added; real and computed
        tokens, padding fraction, optimizer steps; collation seconds; first step; warm-up passes; attention backend;
        model TFLOP/s and MFU; losses of the first repeat), `ratios_vs_padded`, `headline`, `loss_equivalence` and
        `pass_flops`.
    """
    first = run.figures[work.modes[0]][0]
    environment = {**_environment(device), "torch_threads": first["torch_threads"], **first["environment"]}
    environment["process_per_run"] = process_per_run
    environment["peak_flops"] = peak_flops(environment["device"], config.dtype) if device.type == "cuda" else None
    modes = {mode: _mode_row(run.figures[mode], mode, work, first["pass_flops"], environment) for mode in work.modes}
    return {
        "task": task.name,
        "config": asdict(config),
        "environment": environment,
        "model": first["model"],
        "data": work.data,
        "modes": modes,
        "ratios_vs_padded": _ratios(run.figures, modes, device),
        "headline": headline(run.figures, device, subject=task.subject, baseline=task.baseline, verb=task.verb),
        "loss_equivalence": _loss_equivalence(run.figures),
        "pass_flops": first["pass_flops"],
    }


def _mode_row(passes: list[dict], mode: str, work, pass_flops: float, environment: dict) -> dict:
    steps = {len(p["step_s"]) for p in passes}
    if steps != {work.steps[mode]}:  # every worker trains what the parent planned
        raise RuntimeError(f"{mode}: the workers timed {sorted(steps)} steps per pass, planned {work.steps[mode]}.")
    real, computed = work.real_tokens, work.computed_tokens[mode]
    peak, added = [p["peak_memory_bytes"] for p in passes], [p["added_memory_bytes"] for p in passes]
    tflops = spread([pass_flops / sum(p["step_s"]) / 1e12 for p in passes])
    row = {
        "tokens_per_s": spread([real / sum(p["step_s"]) for p in passes]),
        "tokens_per_cpu_s": None,
        "seconds_per_step": spread(np.concatenate([p["step_s"] for p in passes])),
        "peak_memory_bytes": None if None in peak else int(np.median(peak)),
        "peak_memory_over_baseline_bytes": None if None in added else int(np.median(added)),
        "real_tokens": real,
        "computed_tokens": computed,
        "padding_fraction": 1 - real / computed,
        "optimizer_steps": work.steps[mode],
        "collate_s": work.collate_s.get(mode),
        "first_step_s": spread([p["first_step_s"] for p in passes]),
        "warm_up_passes": [p["settle_passes"] for p in passes],
        "attn": passes[0]["attn"],
        "model_tflops_per_s": tflops,
        "mfu": mfu(tflops["median"] * 1e12, 1.0, environment["peak_flops"]),
        "losses": passes[0]["losses"],
    }
    if environment["device_type"] == "cpu":
        row["tokens_per_cpu_s"] = spread([real / sum(p["cpu_s"]) for p in passes])
    return row


def _ratios(runs: dict, modes: dict, device: torch.device) -> dict:
    """Per mode, its throughput over padded's within each repeat (wall clock, and CPU seconds on a CPU), and its peak
    memory over padded's."""
    if "padded" not in runs:
        return {}
    ratios = {}
    for mode, passes in runs.items():
        ratios[mode] = {"tokens_per_s": _repeat_ratios(passes, runs["padded"], "step_s")}
        if device.type == "cpu":
            ratios[mode]["tokens_per_cpu_s"] = _repeat_ratios(passes, runs["padded"], "cpu_s")
        for key in ("peak_memory_bytes", "peak_memory_over_baseline_bytes"):
            if modes[mode][key] and modes["padded"][key]:
                ratios[mode][key.removesuffix("_bytes")] = modes[mode][key] / modes["padded"][key]
    return ratios


def _loss_equivalence(runs: dict) -> dict | None:
    """The largest difference between padded's and flattened's loss at any step of any repeat: they train the same
    sequences from the same weights, so their curves must coincide."""
    if "padded" not in runs or "flattened" not in runs:
        return None
    pairs = zip(runs["padded"], runs["flattened"], strict=True)
    diff = max(float(np.abs(np.subtract(a["losses"], b["losses"])).max()) for a, b in pairs)
    return {"compared": ["padded", "flattened"], "steps": len(runs["padded"][0]["losses"]), "max_abs_loss_diff": diff}


def _repeat_ratios(passes: list[dict], baseline: list[dict], key: str) -> dict:
    """Throughput ratio to the baseline within each repeat (`repeats.ratio_spread`): every mode trains the same
    tokens per pass, so it is the baseline's pass time over this mode's pass time."""
    return ratio_spread([sum(p[key]) for p in baseline], [sum(p[key]) for p in passes])


def headline(
    runs: dict,
    device: torch.device,
    *,
    subject: str = "flatcollate (flattened)",
    baseline: str = "padded batches",
    verb: str = "trains",
) -> dict | None:
    """The one headline rule of every benchmark (see the module docstring): flattened over padded, and with
    `hf_flattened` also it over padded and flattened over it; `noisy` when the flattened ratio's spread exceeds
    `NOISY_SPREAD` of its median. `subject` and `baseline` name the two sides, `verb` what a step does. None
    without `padded` and `flattened`."""
    if "padded" not in runs or "flattened" not in runs:
        return None
    key = "cpu_s" if device.type == "cpu" else "step_s"
    flattened = _repeat_ratios(runs["flattened"], runs["padded"], key)
    result = {
        "subject": subject,
        "verb": verb,
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


def cpu_name() -> str:
    """The CPU's model name (`/proc/cpuinfo` on Linux, where `platform.processor()` is often empty), or `"cpu"`."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    return platform.processor() or "cpu"


def _environment(device: torch.device) -> dict:
    return {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name(),
        "device_type": device.type,
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
