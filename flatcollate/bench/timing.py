"""How every benchmark times a step, warms up and holds its threads: one clock for the training loop of the SFT and
image-text tasks, the log-prob passes of the GRPO task and the TRL trainers of the DPO, KTO and reward tasks.

A step's wall-clock seconds come from CUDA events on a GPU (recorded on the stream around the step, read once the end
is reached) and from `time.perf_counter` on a CPU; its CPU seconds are this process's, all threads
(`time.process_time`), which other work on a shared machine disturbs far less than wall-clock time.

Warm-up: before its timed pass a mode runs untimed passes over the first batches of that pass until two passes take
within `SETTLE_TOLERANCE` of each other (first calls allocate, pick kernels, compile), at most `MAX_SETTLE_PASSES`
passes and `MAX_SETTLE_SECONDS`; then one untimed pass over `warmup_steps` other batches (`timed_pass`). A TRL trainer,
which runs its own loop, warms up on its first `warmup_steps` optimizer steps (`TrainerClock`).
"""

import contextlib
import time

import torch
from transformers import TrainerCallback

from .memory import PeakMemory

SETTLE_STEPS = 4
"""Batches of a settling pass: the first ones of the timed pass, so the shapes are those that will be timed."""

SETTLE_TOLERANCE = 0.1
"""Warm-up ends when a settling pass takes within 10% of the pass before it..."""

MAX_SETTLE_PASSES = 4
"""... or after this many passes ..."""

MAX_SETTLE_SECONDS = 60.0
"""... or once the warm-up has taken this long (a large model on a GPU: the first step compiles, later ones are
short, and a full-size pass need not be repeated to know it)."""


def resolve_device(name: str) -> torch.device:
    """`"auto"` -> CUDA when available, else CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


@contextlib.contextmanager
def bench_threads(threads: int | None, device: torch.device):
    """Run with `threads` torch threads (one on a CPU by default: on a machine shared with other work, a second thread
    spins waiting for a descheduled sibling and the ratios swing several-fold), then restore the setting."""
    threads = threads or (1 if device.type == "cpu" else None)
    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous_threads)


class StepClock:
    """`start()` before a step, `lap()` after it: appends the step's seconds to `step_s` (wall clock; CUDA events on a
    GPU) and `cpu_s` (this process's CPU seconds), and starts the next step.

    >>> clock = StepClock(torch.device("cpu"))
    >>> clock.start(); clock.lap(); clock.lap()
    >>> len(clock.step_s), len(clock.cpu_s), min(clock.step_s) >= 0
    (2, 2, True)
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.step_s: list[float] = []
        self.cpu_s: list[float] = []

    def start(self) -> None:
        if self.device.type == "cuda":
            self._event = torch.cuda.Event(enable_timing=True)
            self._event.record()
        self._wall, self._cpu = time.perf_counter(), time.process_time()

    def lap(self) -> None:
        if self.device.type == "cuda":
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            end.synchronize()
            self.step_s.append(self._event.elapsed_time(end) / 1e3)  # milliseconds
        else:
            self.step_s.append(time.perf_counter() - self._wall)
        self.cpu_s.append(time.process_time() - self._cpu)
        self.start()


class TrainingSteps:
    """A step of the SFT and image-text tasks: one AdamW step of `model` on a batch, returning its loss. `reset()`
    puts back the weights `model` had when this was made and a fresh AdamW, so every pass trains the same steps from
    the same weights."""

    def __init__(self, model, *, lr: float):
        self.model, self.lr = model, lr
        self.initial = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}

    def reset(self) -> None:
        self.model.load_state_dict(self.initial)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=self.lr)

    def __call__(self, inputs: dict) -> float:
        loss = self.model(**inputs, use_cache=False).loss
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.item()


def run_pass(steps, batches: list[dict], *, device: torch.device) -> dict[str, list[float]]:
    """`steps.reset()`, then `steps(batch)` on every batch, its tensors moved to `device` before the step's clock
    starts; `steps` is a `TrainingSteps` or anything with its `reset()` and `__call__(inputs) -> loss`.

    Returns:
        `step_s` and `cpu_s` of every step (`StepClock`), and `losses`.
    """
    steps.reset()
    clock, losses = StepClock(device), []
    for batch in batches:
        inputs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        clock.start()
        losses.append(steps(inputs))
        clock.lap()
    return {"step_s": clock.step_s, "cpu_s": clock.cpu_s, "losses": losses}


def settle(steps, batches: list[dict], *, device: torch.device) -> dict:
    """Untimed passes (`run_pass`) over `batches` until two consecutive ones take within `SETTLE_TOLERANCE` of each
    other, at most `MAX_SETTLE_PASSES` passes and, past the first, `MAX_SETTLE_SECONDS`.

    Returns:
        `dict`: `settle_passes` (the passes it took), `first_step_s` (the very first step: allocation, kernel
        selection, compilation) and `warm_up_s` (the whole warm-up).
    """
    previous, seconds = None, []
    for passes in range(1, MAX_SETTLE_PASSES + 1):
        step_s = run_pass(steps, batches, device=device)["step_s"]
        seconds += step_s
        settled = previous is not None and abs(sum(step_s) - previous) <= SETTLE_TOLERANCE * previous
        if settled or sum(seconds) > MAX_SETTLE_SECONDS or passes == MAX_SETTLE_PASSES:
            return {"settle_passes": passes, "first_step_s": seconds[0], "warm_up_s": sum(seconds)}
        previous = sum(step_s)
    raise AssertionError("unreachable: the last pass returns")


def timed_pass(steps, batches: list[dict], warm_batches: list[dict], *, device: torch.device) -> dict:
    """`settle` on the first `SETTLE_STEPS` batches, one untimed pass over `warm_batches`, then the timed pass over
    `batches`, each pass after `steps.reset()` (`run_pass`).

    Returns:
        `run_pass`'s figures of the timed pass, `settle`'s, and the peak memory of the timed pass
        (`peak_memory_bytes`) with what it added to the memory in use before it (`added_memory_bytes`).
    """
    settled = settle(steps, batches[:SETTLE_STEPS], device=device)
    run_pass(steps, warm_batches, device=device)
    memory = PeakMemory(device)
    memory.reset()
    record = run_pass(steps, batches, device=device)
    return {**record, **settled, **memory.figures()}


class TrainerClock(TrainerCallback):
    """`StepClock` of a `transformers.Trainer`: every optimizer step from the end of the one before (the first from
    the start of training), so a step holds all the trainer does for it (collation included); the peak memory is
    reset when the steps after the first `warmup_steps` start."""

    def __init__(self, warmup_steps: int, device: torch.device):
        self.warmup_steps, self.clock, self.memory = warmup_steps, StepClock(device), PeakMemory(device)

    def on_train_begin(self, args, state, control, **kwargs):
        if self.warmup_steps == 0:
            self.memory.reset()
        self.clock.start()

    def on_step_end(self, args, state, control, **kwargs):
        self.clock.lap()
        if state.global_step == self.warmup_steps:
            self.memory.reset()
            self.clock.start()  # the reset is not part of a step

    def figures(self) -> dict:
        """Seconds of the steps after the warm-up, the first step's, and the memory figures of those steps."""
        warm = self.warmup_steps
        first = self.clock.step_s[0] if self.clock.step_s else None
        timed = {"step_s": self.clock.step_s[warm:], "cpu_s": self.clock.cpu_s[warm:], "first_step_s": first}
        return {**timed, "settle_passes": 0, **self.memory.figures()}
