"""Training throughput and peak memory of padded, padded-to-max, transformers' own padding-free path, flattened and
packed batches, measured in one run.

Every mode trains the same model from the same initial weights on the same synthetic sequences (drawn from a length
profile), for the same number of sequences. Before the first timed pass each mode warms up until its step times
settle (first calls allocate and pick kernels). Repeats interleave the modes (the order rotates every repeat), so
noise from a shared machine hits all modes alike, and every ratio to `padded` is taken within one repeat. Each timed
pass starts after warm-up steps, from freshly reset weights and optimizer, so the loss curves of `padded` and
`flattened` must coincide: the JSON reports their largest difference.

On a CPU, torch runs one thread unless `threads` says otherwise: on a machine shared with other work, a second
thread spins waiting for a descheduled sibling and the ratios swing several-fold from run to run.
"""

import contextlib
import math
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

import flatcollate

from ..models import apply_overrides, tiny_config
from .build import build_on_device
from .config import MODES, PEER_MODE, ThroughputConfig
from .flops import attention_width, linear_parameters, training_flops
from .memory import PeakMemory
from .plan import Plan, plan_batches, profile_fill
from .repeats import run_order
from .summary import summarize


def run_throughput(config: ThroughputConfig, *, progress: bool = True) -> dict:
    """Train every mode and collect timings, memory, token counts and losses.

    Returns:
        `dict` (JSON-ready): `config`, `environment`, `headline` (see `summary.headline`), `pool` (the sequences
        trained on), `modes` (per mode: tokens/s median and spread, seconds per step, peak memory, padding
        fraction, steps per epoch, losses), `ratios_vs_padded`, `loss_equivalence`, `skipped` (modes that could not
        run, with the reason) and `model` (type, parameter count, sizes).
    """
    check_config(config)
    device = resolve_device(config.device)
    with bench_threads(config.threads, device):
        return _run(config, device=device, progress=progress)


@contextlib.contextmanager
def bench_threads(threads: int | None, device: torch.device):
    """Run with `threads` torch threads (one on a CPU by default, the benchmarks' setting), then restore."""
    threads = threads or (1 if device.type == "cpu" else None)
    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous_threads)


def pass_flops(model: PreTrainedModel, lengths) -> float:
    """Model FLOPs of one training pass over sequences of `lengths` (`flatcollate.bench.flops.training_flops`)."""
    layers, width = attention_width(model.config)
    return training_flops(linear_parameters(model), layers, width, lengths)


def model_summary(model: PreTrainedModel) -> dict:
    """Type, parameter count and sizes of the model trained, for the report."""
    sizes = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "vocab_size")
    return {
        "model_type": model.config.model_type,
        "parameters": sum(p.numel() for p in model.parameters()),
        **{name: getattr(model.config, name, None) for name in sizes},
    }


def _run(config: ThroughputConfig, *, device: torch.device, progress: bool) -> dict:
    model = build_model(config, device=device)
    # transformers' own padding-free path runs on a model flatcollate has not prepared (no packed backend, no guard).
    peer = build_model(config, device=device, prepare=False) if PEER_MODE in config.modes else None
    plan = plan_batches(config, vocab_size=model.config.vocab_size, modes=config.modes)
    modes, batches, warm_batches = plan.modes, plan.batches, plan.warm_batches
    flat_attn = resolve_flattened_attn(config.flattened_attn)
    initial = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
    memory = PeakMemory(device)
    runs = {mode: [] for mode in modes}
    total = config.repeats * sum(len(batches[m]) + len(warm_batches[m]) for m in modes)
    total += sum(settle_budget(batches[m][:SETTLE_STEPS]) for m in modes)
    bar = tqdm(total=total, desc="training steps", unit="step", disable=not progress)
    settled = {}
    for mode in modes:
        bar.set_postfix(warm_up=mode)
        trained = _model_for(mode, model, peer, flat_attn)
        warm_up = batches[mode][:SETTLE_STEPS]
        settled[mode] = settle(trained, warm_up, initial, lr=config.lr, device=device, bar=bar)
    # The order rotates each repeat so slow phases of a shared machine do not always hit the same mode.
    for repeat, mode in run_order(modes, config.repeats):
        bar.set_postfix(repeat=repeat, mode=mode)
        trained = _model_for(mode, model, peer, flat_attn)
        record = timed_pass(trained, plan, mode, initial, lr=config.lr, memory=memory, bar=bar)
        runs[mode].append({**record, "first_step_s": settled[mode]["first_step_s"]})
    bar.close()
    result = summarize(
        config,
        runs,
        batches,
        plan.collate_s,
        pool=plan.pool,
        pack_len=plan.pack_len,
        skipped=plan.skipped,
        device=device,
        attn=flat_attn,
        profile_fill=profile_fill(config),
        settle_passes={mode: settled[mode]["settle_passes"] for mode in modes},
        pass_flops=pass_flops(model, plan.pool.lengths),
    )
    result["model"] = model_summary(model)
    return result


def timed_pass(model, plan: Plan, mode: str, initial: dict, *, lr: float, memory: PeakMemory, bar) -> dict:
    """One untimed pass over the mode's warm-up batches, then the timed pass over its batches (`run_pass`), with the
    peak memory of the timed pass (`peak_memory_bytes`) and what it added (`added_memory_bytes`)."""
    device = memory.device
    run_pass(model, plan.warm_batches[mode], initial, lr=lr, device=device, bar=bar)
    memory.reset()
    record = run_pass(model, plan.batches[mode], initial, lr=lr, device=device, bar=bar)
    peak = memory.peak()
    record["peak_memory_bytes"] = peak
    record["added_memory_bytes"] = None if peak is None or memory.baseline is None else peak - memory.baseline
    return record


SETTLE_STEPS = 4
"""Batches of a settling pass: the first ones of the timed pass, so the shapes are those that will be timed."""

SETTLE_TOLERANCE = 0.1
"""Warm-up ends when a settling pass takes within 10% of the pass before it..."""

MAX_SETTLE_PASSES = 4
"""... or after this many passes ..."""

MAX_SETTLE_SECONDS = 60.0
"""... or once the warm-up has taken this long (a large model on a GPU: the first step compiles, later ones are
short, and a full-size pass need not be repeated to know it)."""


def _model_for(mode: str, model, peer, flat_attn: str):
    """The model a mode trains, with the attention backend it uses selected."""
    if mode == PEER_MODE:
        return peer
    model.set_attn_implementation("sdpa" if mode.startswith("padded") else flat_attn)
    return model


def settle_budget(batches: list) -> int:
    """Steps `settle` counts on the progress bar for `batches`: the most it can train, so the total is known upfront."""
    return MAX_SETTLE_PASSES * len(batches)


def settle(model, batches, initial, *, lr: float, device: torch.device, bar) -> dict:
    """Untimed passes over `batches` until two consecutive passes take within `SETTLE_TOLERANCE` of each other, at
    most `MAX_SETTLE_PASSES` passes and, past the first pass, at most `MAX_SETTLE_SECONDS`: the first passes of a
    mode pay for allocation, kernel selection and compilation, reported apart as `first_step_s`. The bar advances
    by `settle_budget(batches)` whatever the passes it took: the passes not needed are counted as skipped.

    Returns:
        `dict`: `settle_passes` (the passes it took), `first_step_s` (wall-clock seconds of the very first step) and
        `warm_up_s` (of the whole warm-up).
    """
    previous, steps = None, []
    for passes in range(1, MAX_SETTLE_PASSES + 1):
        step_s = run_pass(model, batches, initial, lr=lr, device=device, bar=bar)["step_s"]
        steps += step_s
        seconds = sum(step_s)
        settled = previous is not None and abs(seconds - previous) <= SETTLE_TOLERANCE * previous
        if settled or sum(steps) > MAX_SETTLE_SECONDS or passes == MAX_SETTLE_PASSES:
            bar.update(settle_budget(batches) - passes * len(batches))
            return {"settle_passes": passes, "first_step_s": steps[0], "warm_up_s": sum(steps)}
        previous = seconds
    raise AssertionError("unreachable: the last pass returns")


def check_config(config: ThroughputConfig) -> None:
    """Raise `ValueError` naming the field, the value and what it must be, before anything is built."""
    unknown = sorted(set(config.modes) - set(MODES))
    if unknown:
        raise ValueError(f"Unknown mode(s) {unknown} in `modes`; choose from {MODES}.")
    positive = {"batch_size": config.batch_size, "max_length": config.max_length, "steps": config.steps}
    positive |= {"repeats": config.repeats, "threads": config.threads, "pack_len": config.pack_len}
    for name, value in positive.items():
        optional = name in ("threads", "pack_len")
        if not (optional and value is None) and not (isinstance(value, int) and value >= 1):
            raise ValueError(f"`{name}` must be a positive int{' or None' if optional else ''}, got {value!r}.")
    if not (isinstance(config.warmup_steps, int) and config.warmup_steps >= 0):
        raise ValueError(f"`warmup_steps` must be an int >= 0, got {config.warmup_steps!r}.")
    check_training_options(config)


def check_training_options(config) -> None:
    """Raise `ValueError` for a learning rate, device or dtype no benchmark takes (every benchmark config has them)."""
    if not (math.isfinite(config.lr) and config.lr > 0):
        raise ValueError(f"`lr` must be a positive, finite float, got {config.lr!r}.")
    if config.device not in ("auto", "cpu", "cuda") or config.dtype not in ("float32", "bfloat16"):
        raise ValueError(
            f"`device` must be auto, cpu or cuda and `dtype` float32 or bfloat16, got {config.device!r}, "
            f"{config.dtype!r}."
        )


def resolve_device(name: str) -> torch.device:
    """`"auto"` -> CUDA when available, else CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def model_config(config: ThroughputConfig) -> PretrainedConfig:
    """The model's config: the tiny one with `model_overrides`, or the config's own sizes with them."""
    if config.tiny:
        return tiny_config(config.model, **config.model_overrides)
    from_folder = Path(config.model).is_dir()
    base = AutoConfig.from_pretrained(config.model) if from_folder else AutoConfig.for_model(config.model)
    apply_overrides(base, **config.model_overrides)  # per-layer lists follow a new num_hidden_layers
    return base


def build_model(config: ThroughputConfig, *, device: torch.device, prepare: bool = True) -> PreTrainedModel:
    """Random-weight causal LM from the config (no download) built on `device` (`build.build_on_device`), in train
    mode, without a KV cache; `prepare` runs `prepare_model_for_flattening` on it."""
    model_config_ = model_config(config)
    model_config_.use_cache = False
    model = build_on_device(AutoModelForCausalLM, model_config_, device=device, dtype=config.dtype, seed=config.seed)
    return flatcollate.prepare_model_for_flattening(model) if prepare else model


def resolve_flattened_attn(name: str) -> str:
    """`"auto"` -> the `flatcollate` packed attention backend when the package provides it, else `"sdpa"`."""
    if name != "auto":
        return name
    attention = getattr(flatcollate, "attention", None)
    if attention is None:
        import importlib.util

        if importlib.util.find_spec("flatcollate.attention") is None:
            return "sdpa"
        import flatcollate.attention as attention
    return attention.register_packed_attention()


def run_pass(model, batches, initial, *, lr: float, device: torch.device, bar) -> dict[str, list[float]]:
    """Reset weights and optimizer, then one optimizer step per batch.

    Returns:
        `step_s` (wall-clock seconds per step), `cpu_s` (this process's CPU seconds per step, all threads) and
        `losses`.
    """
    model.load_state_dict(initial)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    record = {"step_s": [], "cpu_s": [], "losses": []}
    for batch in batches:
        inputs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        _synchronize(device)
        start, cpu_start = time.perf_counter(), time.process_time()
        loss = model(**inputs, use_cache=False).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        record["losses"].append(loss.item())  # `.item()` waits for the device, so the time below covers the step
        record["step_s"].append(time.perf_counter() - start)
        record["cpu_s"].append(time.process_time() - cpu_start)
        bar.update(1)
    return record


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
