"""Resuming a `TokenBudgetBatchSampler` mid-epoch: its state, the check of a resume, and the position in an epoch.

An epoch's batches depend only on the sampler's configuration and the epoch, so a state holds those and no batch::

    sampler.state_dict()          {"epoch": 1, "config": {"batch_size": 2, "max_tokens": 200, "num_replicas": 2,
                                   "seed": 1, "drop_last": False, "lengths": "40 examples, sha256 3f9a..."}}
    iter(sampler).state_dict()    {"yielded": 6}    batches this pass over the epoch has handed out so far

The sampler's state has no rank and no position, so it is the same on every rank: accelerate saves a registered
object (`accelerator.register_for_checkpointing(sampler)`) from the main process and loads that file on every rank.
The position lives with whoever knows how many batches were trained on:

    StatefulDataLoader            saves the iterator's state with the count of batches it delivered (both taken when
                                  a batch is drawn) and restores both: exact, with or without workers.
    accelerator.prepare(loader)   draws ahead of the training loop: the next step, every rank's batch of a step
                                  (`BatchSamplerShard`), and what workers prefetch. After 3 steps on 2 processes the
                                  sampler has handed out 8 batches, not 6 (16 with 2 workers). So the loop's own step
                                  count says where to go on: `accelerator.skip_first_batches(loader, steps_done)`.

A state saved under another configuration is refused with a `ValueError` naming every option that changed, its saved
and its current value, and how to resume. Only ints, bools and strings, so a state survives
`torch.load(weights_only=True)`.
"""

import hashlib
from collections.abc import Callable
from typing import Any

import numpy as np

STATE_KEYS = ("epoch", "config")
CONFIG_KEYS = ("batch_size", "max_tokens", "num_replicas", "seed", "drop_last", "lengths")
_HOW_TO_MATCH = {
    "num_replicas": "relaunch on {saved} processes (num_replicas is the data-parallel world size)",
    "lengths": "resume on the dataset the state was saved from (the same examples in the same order)",
}


def lengths_fingerprint(lengths: np.ndarray) -> str:
    """The number of examples and a hash of their token counts: the data a state belongs to.

    Args:
        lengths (`np.ndarray` of shape `(N,)`, int64): tokens per example.

    >>> lengths_fingerprint(np.array([3, 1, 2]))
    '3 examples, sha256 7c4cec7a82e1aa57'
    >>> lengths_fingerprint(np.array([3, 1, 2])) == lengths_fingerprint(np.array([1, 2, 3]))
    False
    """
    digest = hashlib.sha256(np.ascontiguousarray(lengths, dtype="<i8").tobytes()).hexdigest()[:16]
    return f"{len(lengths)} examples, sha256 {digest}"


def check_resume(state: Any, *, config: dict) -> int:
    """The epoch to resume, once `state` is known to come from a sampler built like this one (whose config is `config`).

    Args:
        state: what `TokenBudgetBatchSampler.state_dict()` returned, possibly through `torch.save` / `torch.load`.
        config (`dict`): the resuming sampler's `CONFIG_KEYS`.

    Raises:
        `TypeError`: `state` is not a dict with `epoch` and `config`.
        `ValueError`: a config saved with other keys or a bad epoch (not a sampler state), or options that changed.

    >>> config = {"batch_size": 2, "max_tokens": 200, "num_replicas": 1, "seed": 0, "drop_last": False, "lengths": "?"}
    >>> check_resume({"epoch": 3, "config": config}, config=config)
    3
    >>> check_resume({"epoch": 3, "config": config}, config={**config, "max_tokens": 300})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: Cannot resume TokenBudgetBatchSampler: the state was saved with max_tokens=200 but this sampler has \
max_tokens=300. ... To resume, build the sampler with max_tokens=200; or start from scratch without loading the state.
    """
    if not isinstance(state, dict) or any(key not in state for key in STATE_KEYS):
        keys = sorted(map(str, state)) if isinstance(state, dict) else type(state).__name__
        raise TypeError(
            f"Expected a `TokenBudgetBatchSampler.state_dict()` (a dict with `epoch` and `config`), got {keys}."
        )
    saved, epoch = state["config"], state["epoch"]
    if not isinstance(saved, dict) or set(saved) != set(config):
        keys = sorted(map(str, saved)) if isinstance(saved, dict) else type(saved).__name__
        raise _not_a_state(f"its config holds {keys}, not {sorted(config)}")
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        raise _not_a_state(f"its epoch is {epoch!r}, not an int >= 0")
    changed = [key for key in CONFIG_KEYS if saved[key] != config[key]]
    if changed:
        was = ", ".join(f"{key}={saved[key]!r}" for key in changed)
        now = ", ".join(f"{key}={config[key]!r}" for key in changed)
        rebuild = ", ".join(f"{key}={saved[key]!r}" for key in changed if key not in _HOW_TO_MATCH)
        fixes = [_HOW_TO_MATCH[key].format(saved=saved[key]) for key in changed if key in _HOW_TO_MATCH]
        how = "; ".join(([f"build the sampler with {rebuild}"] if rebuild else []) + fixes)
        raise ValueError(
            f"Cannot resume TokenBudgetBatchSampler: the state was saved with {was} but this sampler has {now}. An "
            "epoch's batches depend on them, so this run would not train the batches the saved run had left. To "
            f"resume, {how}; or start from scratch without loading the state."
        )
    return epoch


class EpochIterator:
    """One pass over an epoch's batches that can go on from a saved position (`StatefulDataLoader` saves it).

    Args:
        draw (`Callable[[], list[np.ndarray]]`): the epoch's batches in the order they are handed out, int64 index
            arrays; called at the first `next()`, so the epoch is the one set when iteration starts.
        length (`int`): how many batches `draw` returns.

    >>> batches = EpochIterator(lambda: [np.array([0, 1]), np.array([2])], length=2)
    >>> next(batches), batches.state_dict()
    ([0, 1], {'yielded': 1})
    >>> resumed = EpochIterator(lambda: [np.array([0, 1]), np.array([2])], length=2)
    >>> resumed.load_state_dict({"yielded": 1})
    >>> list(resumed)
    [[2]]
    """

    def __init__(self, draw: Callable[[], list[np.ndarray]], *, length: int):
        self._draw, self._length, self._batches, self.yielded = draw, length, None, 0

    def __iter__(self) -> "EpochIterator":
        return self

    def __next__(self) -> list[int]:
        if self._batches is None:
            self._batches = self._draw()
        if self.yielded >= len(self._batches):
            raise StopIteration
        self.yielded += 1
        return self._batches[self.yielded - 1].tolist()

    def state_dict(self) -> dict:
        return {"yielded": self.yielded}

    def load_state_dict(self, state: dict) -> None:
        """Go on after the first `state["yielded"]` batches (an int in `[0, length]`)."""
        yielded = state.get("yielded") if isinstance(state, dict) else None
        if isinstance(yielded, bool) or not isinstance(yielded, int) or not 0 <= yielded <= self._length:
            raise ValueError(
                f"Expected the state of a pass over a TokenBudgetBatchSampler epoch of {self._length} batches, a dict "
                f'{{"yielded": 0..{self._length}}}, got {state!r}. It was saved by another sampler (another '
                "batch_size or world size changes the batches per epoch); start from scratch without loading it."
            )
        self.yielded = yielded


def _not_a_state(problem: str) -> ValueError:
    return ValueError(
        f"Cannot resume TokenBudgetBatchSampler: {problem}. The state was not saved by "
        "`TokenBudgetBatchSampler.state_dict()` or is corrupted; start from scratch without loading it."
    )
