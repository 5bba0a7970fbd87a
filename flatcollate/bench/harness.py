"""The one benchmark harness: a task is a plug-in that says what its modes train on and how one mode trains; the
harness runs every (mode, repeat) in a fresh process, the modes taking turns, and summarizes, reports and plots every
task alike (`summary`, `report`).

A task is a module of `flatcollate.bench.tasks` that defines `TASK`, a `Task`; adding a task touches that one new
module. What a task runs, by process::

    parent   task.workload(config)         what every mode trains on: real and computed tokens, steps, the data
             run_repeats(...)              python -m flatcollate.bench.worker --worker {"task", "config", "variant"}
    worker   task.measure(config, mode)    builds the model, trains, returns the figures of one timed pass
    parent   summarize(...)                medians, spreads, ratios within each repeat, headline, MFU
"""

import importlib
import json
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from .repeats import Runner, run_repeats
from .tasks import task_names
from .timing import bench_threads, resolve_device

WORKER_COMMAND = (sys.executable, "-m", "flatcollate.bench.worker")
"""How the harness starts a worker: `flatcollate.bench.worker`, with the interpreter that runs the benchmark."""


@dataclass(frozen=True)
class Workload:
    """What every mode of one run trains on, known before any worker starts.

    Args:
        modes (`tuple[str, ...]`): the modes measured, in report order.
        real_tokens (`int`): tokens of the sequences in one timed pass, the same in every mode (padding excluded).
        computed_tokens (`dict[str, int]`): per mode, the tokens the model computes on in that pass, padding included.
        steps (`dict[str, int]`): per mode, optimizer steps of one timed pass (each worker must time this many).
        data (`dict`): JSON-ready description of the data for the report: `sequence_data`'s keys, then the task's
            own (`Task.data_lines` reads them).
        collate_s (`dict[str, float]`): per mode, seconds the parent took to collate its batches (where it did).
    """

    modes: tuple[str, ...]
    real_tokens: int
    computed_tokens: dict[str, int]
    steps: dict[str, int]
    data: dict
    collate_s: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_batches(cls, batches: dict[str, list[dict]], data: dict, collate_s: dict[str, float]) -> "Workload":
        """The workload of modes whose batches the parent collated: tokens counted in them, a step per batch."""
        from .batches import real_tokens, slot_tokens

        real = {sum(real_tokens(batch) for batch in mode_batches) for mode_batches in batches.values()}
        assert len(real) == 1, f"every mode trains the same sequences, got {real} real tokens"
        computed = {mode: sum(slot_tokens(batch) for batch in mode_batches) for mode, mode_batches in batches.items()}
        steps = {mode: len(mode_batches) for mode, mode_batches in batches.items()}
        return cls(tuple(batches), real.pop(), computed, steps, data, collate_s)


PROFILE_DRAWS = 20_000
"""Sequences, examples or pairs every task draws from its profile to estimate the padding of its padded batches over
the profile (`sequence_data`): the few a run trains draw little of the long tail."""


def sequence_data(lengths, *, truncated: int, profile_padding: float, profile_sample: str) -> dict:
    """What every task says about its data (`Workload.data`): the sequences of one timed pass (`lengths`, `(S,)` ints,
    cut to `max_length`), how many `max_length` cut (`truncated`), and the padding fraction of the padded mode's
    batches over `profile_sample` (e.g. `"20,000 pairs"`) drawn the same way from the profile, not only the few a run
    trains.

    >>> sequence_data([3, 5], truncated=1, profile_padding=0.25, profile_sample="8 sequences")["longest"]
    5
    """
    lengths = np.asarray(lengths)
    return {
        "sequences": int(lengths.size),
        "mean_length": float(lengths.mean()),
        "longest": int(lengths.max()),
        "truncated": int(truncated),
        "profile_padding": float(profile_padding),
        "profile_sample": profile_sample,
    }


@dataclass(frozen=True)
class Task:
    """A benchmark task.

    Args:
        name (`str`): its `flatcollate bench --task` name.
        flag (`str`): the option that selects it, for messages (`--task dpo`, `--vision`).
        config (`type`): its frozen config dataclass; every field has a default.
        files (`str`): stem of the report files (`<files>.json`, `.md`, `.png`, `_loss_curves.png`).
        modes (`dict[str, str]`): every mode it can measure -> what it trains, for the legend.
        subject (`str`), baseline (`str`): the flattened and the padded side, as the headline names them.
        verb (`str`): what a step does with the tokens, for the headline (`"trains"`; `"scores"` for a pass
            without gradients).
        scope (`str`): what it compares, for the message refusing an option it does not take (it takes those its
            config has a field for).
        workload (`Callable[[config], Workload]`): in the parent process.
        measure (`Callable[[config, str, torch.device], dict]`): in a worker: train one mode and return the figures
            `summary.summarize` reads (`step_s`, `cpu_s`, `losses`, `peak_memory_bytes`, `added_memory_bytes`,
            `first_step_s`, `settle_passes`, `attn`, `model`, `pass_flops`, `environment`).
        data_lines (`Callable[[dict], list[str]]`): the report's lines about the task's own data (after those about
            `sequence_data`), from a result.
        validate (`Callable[[config], None]`): checks of the command line beyond the config's fields (profile,
            model, installed packages); raises `flatcollate.cli.UsageError`.
        legend (`tuple[str, ...]`): extra legend lines of its report.
    """

    name: str
    flag: str
    config: type
    files: str
    modes: dict[str, str]
    subject: str
    baseline: str
    scope: str
    workload: Callable
    measure: Callable
    data_lines: Callable
    validate: Callable
    legend: tuple[str, ...] = ()
    verb: str = "trains"


def get_task(name: str) -> Task:
    """The `Task` of `name`; `ValueError` naming the tasks there are."""
    if name not in task_names():
        raise ValueError(f"Unknown benchmark task {name!r}; choose from {', '.join(task_names())}.")
    return importlib.import_module(f".tasks.{name}", __package__).TASK


def check_config(task: Task, config) -> None:
    """Raise `TypeError` for a config of another task and `ValueError` naming a field whose value no benchmark takes."""
    from .config import check_fields

    if not isinstance(config, task.config):
        raise TypeError(f"The {task.name} benchmark takes a {task.config.__name__}, got {type(config).__name__}.")
    check_fields(config)


def run_bench(task_name: str, config=None, *, progress: bool = True, runner: Runner | None = None) -> dict:
    """Measure every mode of `task_name` on `config` (default: the task's defaults), each (mode, repeat) in a fresh
    process, the modes taking turns; return the summary (`summary.summarize`).

    Args:
        task_name (`str`): one of `task_names()`: `"sft"`, `"vision"`, `"dpo"`, `"kto"`, `"reward"`, `"grpo"`.
        config (*optional*): the task's config dataclass.
        progress (`bool`): a progress bar over the runs on stderr.
        runner (`Runner`, *optional*): carries out one run; default a worker process (`in_process` runs it here).

    Returns:
        `dict` (JSON-ready), see `summary.summarize`.
    """
    from .summary import summarize

    task = get_task(task_name)
    config = task.config() if config is None else config
    check_config(task, config)
    device = resolve_device(config.device)
    with bench_threads(config.threads, device):
        work = task.workload(config)
        (run,) = run_repeats(
            list(WORKER_COMMAND),
            [{"task": task.name, "config": asdict(config)}],
            work.modes,
            repeats=config.repeats,
            label=lambda case: f"{task.name} {config.profile}",
            progress=progress,
            runner=runner,
        )
    return summarize(task, config, work, run, device=device, process_per_run=runner is None)


def config_from_json(task: Task, data: dict):
    """The task's config from its `asdict` form (lists back to tuples where the field is a tuple)."""
    defaults = task.config()
    return task.config(**{k: tuple(v) if isinstance(getattr(defaults, k), tuple) else v for k, v in data.items()})


def measure(case: dict, mode: str) -> dict:
    """Worker: train `mode` of `case` (`{"task", "config"}`) in this process, with the benchmark's threads."""
    task = get_task(case["task"])
    config = config_from_json(task, case["config"])
    check_config(task, config)
    if mode not in task.modes:
        raise ValueError(f"Unknown {task.name} benchmark mode {mode!r}; choose from {', '.join(task.modes)}.")
    device = resolve_device(config.device)
    with bench_threads(config.threads, device):
        return {**task.measure(config, mode, device), "torch_threads": torch.get_num_threads()}


def in_process(command, payload: dict) -> dict:
    """A `Runner` that measures one run in this process instead of a worker (for tests and debugging: the modes then
    share the allocator and caches, so the published figures always come from workers)."""
    return json.loads(json.dumps(measure(payload["case"], payload["variant"])))  # as a worker prints them
