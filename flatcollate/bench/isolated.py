"""The throughput benchmark with every timed pass in a fresh process: `run_throughput` measured the way the published
figures are (`flatcollate.bench.repeats`).

Each (mode, repeat) is one worker process that builds the model from the config's seed, collates the same batches
(`flatcollate.bench.plan`), warms up until its step times settle, then runs one untimed and one timed pass
(`measure_mode`). Nothing is shared between modes: not the allocator, not the RSS high-water mark, not a kernel cache.
The modes take turns within each repeat, the order rotating, and ratios to `padded` are taken within each repeat, as
in the in-process run; the result has the same layout, so the same report is written from it.
"""

from collections.abc import Sequence
from dataclasses import asdict

from .config import PEER_MODE, ThroughputConfig
from .memory import PeakMemory
from .plan import plan_batches, profile_fill
from .repeats import run_repeats
from .summary import summarize
from .throughput import (
    SETTLE_STEPS,
    bench_threads,
    build_model,
    check_config,
    model_config,
    model_summary,
    pass_flops,
    resolve_device,
    resolve_flattened_attn,
    settle,
    timed_pass,
)


def config_from_json(data: dict) -> ThroughputConfig:
    """The `ThroughputConfig` a worker got as JSON (lists back to tuples)."""
    return ThroughputConfig(**{**data, "modes": tuple(data["modes"])})


def measure_mode(config: ThroughputConfig, mode: str) -> dict:
    """Worker: train `mode` alone in this process: settle, one untimed pass, one timed pass.

    Returns:
        `dict` (JSON-ready): the timed pass's `step_s`, `cpu_s`, `losses`, `peak_memory_bytes`, `added_memory_bytes`
        (see `throughput.timed_pass`), `settle_passes`, `first_step_s` and `warm_up_s` (`throughput.settle`),
        `pass_flops` and `model` (`throughput.model_summary`).
    """
    check_config(config)
    device = resolve_device(config.device)
    with bench_threads(config.threads, device):
        # transformers' own padding-free path runs on a model flatcollate has not prepared.
        model = build_model(config, device=device, prepare=mode != PEER_MODE)
        plan = plan_batches(config, vocab_size=model.config.vocab_size, modes=[mode])
        if mode != PEER_MODE:
            name = "sdpa" if mode.startswith("padded") else resolve_flattened_attn(config.flattened_attn)
            model.set_attn_implementation(name)
        initial = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
        bar = _NoBar()
        settled = settle(model, plan.batches[mode][:SETTLE_STEPS], initial, lr=config.lr, device=device, bar=bar)
        record = timed_pass(model, plan, mode, initial, lr=config.lr, memory=PeakMemory(device), bar=bar)
        flops = pass_flops(model, plan.pool.lengths)
    return {**record, **settled, "pass_flops": flops, "model": model_summary(model)}


class _NoBar:
    """What `run_pass` and `settle` advance when nobody watches (a worker's progress is its parent's bar)."""

    def update(self, steps: int = 1) -> None:
        pass


def run_throughput_in_processes(config: ThroughputConfig, command: Sequence[str], *, progress: bool = True) -> dict:
    """`run_throughput`'s result, every (mode, repeat) a worker process started as `command --worker <payload>`
    (a script that answers with `serve_worker(argv, lambda case, mode: measure_mode(config_from_json(case["config"]),
    mode))`)."""
    check_config(config)
    device = resolve_device(config.device)
    with bench_threads(config.threads, device):
        plan = plan_batches(config, vocab_size=model_config(config).vocab_size, modes=config.modes)
        attn = resolve_flattened_attn(config.flattened_attn)
        (run,) = run_repeats(
            command,
            [{"config": asdict(config)}],
            plan.modes,
            repeats=config.repeats,
            label=lambda case: case["config"]["profile"],
            progress=progress,
        )
        result = summarize(
            config,
            run.figures,
            plan.batches,
            plan.collate_s,
            pool=plan.pool,
            pack_len=plan.pack_len,
            skipped=plan.skipped,
            device=device,
            attn=attn,
            profile_fill=profile_fill(config),
            settle_passes={mode: run.values(mode, "settle_passes") for mode in plan.modes},
            pass_flops=run.first(plan.modes[0], "pass_flops"),
        )
    result["environment"]["process_per_pass"] = True
    result["model"] = run.first(plan.modes[0], "model")
    return result
