"""DPO training throughput and peak memory: `trl.DPOTrainer` on padded batches against `FlatDPOTrainer` on flattened
rows, on preference pairs whose lengths follow a real pair profile (`flatcollate.profiles.pair_profile`).

Every run of a trainer is a fresh process (`python -m flatcollate.bench.dpo --worker <payload>`,
`flatcollate.bench.repeats`): it builds the model from the seed (a tiny random-weight causal LM by default), its
reference copy and the offline word-level tokenizer, writes the drawn pairs as text (`flatcollate.bench.dpo_data`),
and trains `warmup_steps + steps` optimizer steps with a constant-rate AdamW, the batches in dataset order. Both
trainers see the same batches from the same weights, so their losses must agree step by step; the report gives the
largest difference. The trainers take turns within each repeat, the order rotating, and the ratio of their real
tokens per second is taken within each repeat and of the medians.

A step's time runs from the end of the step before to the end of this one, so it holds what the trainer does per
step: collating the batch, the reference and policy forwards, the backward and the optimizer step. Only the steps
after the warm-up are timed; the peak memory is that of the timed steps.
"""

import copy
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict

import numpy as np
import torch
from transformers import AutoModelForCausalLM, TrainerCallback

from .build import build_on_device
from .config import DPO_MODES, DPOBenchConfig
from .dpo_data import draw_pairs, pair_texts
from .dpo_summary import summarize_dpo
from .memory import PeakMemory
from .repeats import Runner, run_repeats, serve_worker
from .throughput import bench_threads, check_training_options, model_config, model_summary, resolve_device

WORKER = ("-m", "flatcollate.bench.dpo")
"""How the parent starts a worker: `python -m flatcollate.bench.dpo --worker <payload>`."""


def check_dpo_config(config: DPOBenchConfig) -> None:
    """Raise `ValueError` naming the field, the value and what it must be, before anything is built."""
    counts = {"batch_size": 1, "max_length": 1, "steps": 1, "repeats": 1, "warmup_steps": 0}
    for name, minimum in counts.items():
        value = getattr(config, name)
        if not (isinstance(value, int) and value >= minimum):
            raise ValueError(f"`{name}` must be an int >= {minimum}, got {value!r}.")
    if config.threads is not None and not (isinstance(config.threads, int) and config.threads >= 1):
        raise ValueError(f"`threads` must be a positive int or None, got {config.threads!r}.")
    check_training_options(config)


def config_from_json(data: dict) -> DPOBenchConfig:
    """The `DPOBenchConfig` a worker got as JSON."""
    return DPOBenchConfig(**data)


def measure_dpo_mode(config: DPOBenchConfig, mode: str) -> dict:
    """Worker: train `mode` (`"padded"`: `trl.DPOTrainer`; `"flattened"`: `FlatDPOTrainer`) alone in this process.

    Returns:
        `dict` (JSON-ready): the timed steps' `step_s` and `cpu_s` (this process's CPU seconds), `losses` of every
        step, `optimizer_steps`, `peak_memory_bytes` and `added_memory_bytes` (see `memory.PeakMemory`),
        `gradient_checkpointing` and `model` (`throughput.model_summary`).
    """
    import datasets
    import transformers
    import trl

    from ..integrations.trl import FlatDPOTrainer
    from ..synthetic import offline_tokenizer

    if mode not in DPO_MODES:
        raise ValueError(f"Unknown DPO benchmark mode {mode!r}; choose from {DPO_MODES}.")
    check_dpo_config(config)
    datasets.disable_progress_bars()
    transformers.logging.set_verbosity_error()
    device = resolve_device(config.device)
    with bench_threads(config.threads, device), tempfile.TemporaryDirectory() as out:
        model = build_dpo_model(config, device=device)
        tokenizer = offline_tokenizer(model.config.vocab_size)
        draw = draw_pairs(config)
        dataset = datasets.Dataset.from_list(pair_texts(draw, vocab_size=model.config.vocab_size, seed=config.seed))
        args = trl.DPOConfig(**trainer_options(config, out, device))
        clock = StepClock(config.warmup_steps, PeakMemory(device))
        trainer_class = recording({"padded": trl.DPOTrainer, "flattened": FlatDPOTrainer}[mode])
        trainer = trainer_class(
            model=model,
            ref_model=copy.deepcopy(model),
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[clock],
        )
        _check_tokenized_lengths(trainer.train_dataset, draw)
        trainer.train()
        return trainer_figures(trainer, clock, model)


def trainer_figures(trainer, clock, model) -> dict:
    """What a DPO or reward worker reports after `trainer.train()`: step and CPU seconds and peak memory of the timed
    steps (`clock`), the losses and optimizer steps, and the model trained."""
    return {
        "step_s": clock.step_s,
        "cpu_s": clock.cpu_s,
        "losses": trainer.losses,
        "optimizer_steps": trainer.state.global_step,
        "peak_memory_bytes": clock.memory.peak(),
        "added_memory_bytes": clock.added_memory(),
        "gradient_checkpointing": bool(trainer.args.gradient_checkpointing),
        "torch_threads": torch.get_num_threads(),
        "model": model_summary(model),
    }


def build_dpo_model(config: DPOBenchConfig, *, device: torch.device):
    """Random-weight causal LM from the config's seed (no download), `sdpa`, no KV cache; `FlatDPOTrainer` prepares
    its own copy."""
    model_config_ = model_config(config)
    model_config_.use_cache = False
    return build_on_device(AutoModelForCausalLM, model_config_, device=device, dtype=config.dtype, seed=config.seed)


def recording(trainer_class):
    """`trainer_class` that keeps every optimizer step's loss (one batch per step), unrounded."""

    class Recording(trainer_class):
        losses: list[float]

        def training_step(self, *args, **kwargs):
            loss = super().training_step(*args, **kwargs)
            self.losses = [*getattr(self, "losses", []), loss.item()]
            return loss

    return Recording


def _check_tokenized_lengths(dataset, draw) -> None:
    """TRL's tokenization of the texts gives the drawn lengths, eos included (an internal invariant of the data)."""
    expected = np.stack([draw.prompt, draw.chosen + 1, draw.rejected + 1], axis=1)
    got = np.array([[len(row[key]) for key in ("prompt_ids", "chosen_ids", "rejected_ids")] for row in dataset])
    assert got.shape == expected.shape and (got == expected).all(), "TRL tokenized the pairs to other lengths"


class StepClock(TrainerCallback):
    """Wall and CPU seconds of every optimizer step after the first `warmup_steps`, each from the end of the step
    before (the first from the start of training); the peak memory is reset when the timed steps start."""

    def __init__(self, warmup_steps: int, memory: PeakMemory):
        self.warmup_steps, self.memory = warmup_steps, memory
        self.step_s: list[float] = []
        self.cpu_s: list[float] = []
        self.baseline: int | None = None

    def _mark(self) -> None:
        if self.memory.device.type == "cuda":
            torch.cuda.synchronize(self.memory.device)
        self.last = (time.perf_counter(), time.process_time())

    def on_train_begin(self, args, state, control, **kwargs):
        if self.warmup_steps == 0:
            self.memory.reset()
        self._mark()

    def on_step_end(self, args, state, control, **kwargs):
        before = self.last
        self._mark()
        if state.global_step > self.warmup_steps:
            self.step_s.append(self.last[0] - before[0])
            self.cpu_s.append(self.last[1] - before[1])
        elif state.global_step == self.warmup_steps:
            self.memory.reset()
            self._mark()

    def added_memory(self) -> int | None:
        """What the timed steps added to the memory in use when they started."""
        peak = self.memory.peak()
        return None if peak is None or self.memory.baseline is None else peak - self.memory.baseline


def run_dpo_bench(config: DPOBenchConfig, *, progress: bool = True, runner: Runner | None = None) -> dict:
    """Train both trainers `config.repeats` times each, every run a fresh process, and summarize.

    Args:
        config (`DPOBenchConfig`): what to measure.
        progress (`bool`): a progress bar over the runs on stderr.
        runner (`Runner`, *optional*): carries out one run (default: a worker process; tests pass one that runs
            `measure_dpo_mode` in this process).

    Returns:
        `dict` (JSON-ready): `config`, `environment`, `pairs` (what was trained on), `modes` (per trainer: real
        tokens/s and per CPU second, median and min-max; seconds per step; peak memory; padding fraction; optimizer
        steps; losses), `ratio` (flattened over padded: of the medians, min-max of the per-repeat ratios; on CPU
        seconds too) and `loss_equivalence`.
    """
    return run_pair_task(config, WORKER, "dpo", progress=progress, runner=runner)


def run_pair_task(
    config: DPOBenchConfig, worker: Sequence[str], task: str, *, progress: bool, runner: Runner | None
) -> dict:
    """The DPO or reward benchmark (`task`): each (trainer, repeat) run by `python <worker> --worker ...` in a fresh
    process, the trainers taking turns, summarized by `summarize_dpo`."""
    check_dpo_config(config)
    device = resolve_device(config.device)
    (run,) = run_repeats(
        [sys.executable, *worker],
        [{"config": asdict(config)}],
        DPO_MODES,
        repeats=config.repeats,
        label=lambda case: f"{task} {case['config']['profile']}",
        progress=progress,
        runner=runner,
    )
    return summarize_dpo(config, run, device=device, task=task)


def trainer_options(config, out: str, device) -> dict:
    """The TRL config options both preference benchmarks train with: the same steps, batch, optimizer and seed."""
    return {
        "output_dir": out,
        "per_device_train_batch_size": config.batch_size,
        "max_steps": config.warmup_steps + config.steps,
        "max_length": config.max_length,
        "learning_rate": config.lr,
        "optim": "adamw_torch",
        "lr_scheduler_type": "constant",
        "train_sampling_strategy": "sequential",
        "logging_strategy": "no",
        "save_strategy": "no",
        "report_to": [],
        "use_cpu": device.type == "cpu",
        "bf16": False,
        "seed": config.seed,
        "disable_tqdm": True,
    }


if __name__ == "__main__":
    serve_worker(sys.argv[1:], lambda case, mode: measure_dpo_mode(config_from_json(case["config"]), mode))
