"""Resuming `TokenBudgetBatchSampler` mid-epoch trains exactly the batches of a run that was never stopped.

The runs here are the loop of docs/data.md ("Token-budget batches and accelerate") on every rank of 1 to 3 processes,
dealt by accelerate's own `prepare_data_loader` in this process; `test_sampler_accelerate.py` runs it on two real
processes with `save_state` / `load_state`.
"""

import io

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from flatcollate.data.sampler import TokenBudgetBatchSampler
from flatcollate.data.sampler_state import EpochIterator

accelerate_data_loader = pytest.importorskip("accelerate.data_loader")
prepare_data_loader, skip_first_batches = (
    accelerate_data_loader.prepare_data_loader,
    accelerate_data_loader.skip_first_batches,
)
StatefulDataLoader = pytest.importorskip("torchdata.stateful_dataloader").StatefulDataLoader

pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")  # torchdata's loader

LENGTHS = np.random.default_rng(0).integers(1, 90, 40)
OPTIONS = {"batch_size": 2, "max_tokens": 200, "seed": 1}
EPOCHS = 2


def saved_and_loaded(state: dict) -> dict:
    """`state` through `torch.save` and `torch.load(weights_only=True)`, as a checkpoint holds it."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def prepared(sampler: TokenBudgetBatchSampler, num_processes: int, rank: int = 0):
    """`accelerator.prepare(DataLoader(...))` on process `rank` of `num_processes`."""
    loader = DataLoader(list(range(len(LENGTHS))), batch_sampler=sampler, collate_fn=list)
    return prepare_data_loader(loader, num_processes=num_processes, process_index=rank)


def train(num_processes: int, rank: int, *, state: dict | None = None, step: int = 0, stop_at: int | None = None):
    """The resumable loop of docs/data.md on one rank; returns the batches it trained on and the state at its end.

    A run from `state`, saved after `step` steps (of all epochs), goes on from there; `stop_at` stops it after that
    many steps, as a run killed right after `accelerator.save_state`.
    """
    sampler = TokenBudgetBatchSampler(LENGTHS, **OPTIONS, num_replicas=num_processes, shard=False)
    loader = prepared(sampler, num_processes, rank)
    if state is not None:
        sampler.load_state_dict(saved_and_loaded(state))  # what accelerator.load_state does
    trained = []
    start_epoch, steps_done = divmod(step, len(loader))
    for epoch in range(start_epoch, EPOCHS):
        sampler.set_epoch(epoch)
        loader.set_epoch(epoch)
        skip = steps_done if epoch == start_epoch else 0
        for batch in skip_first_batches(loader, skip) if skip else loader:
            trained.append(batch)
            step += 1
            if step == stop_at:
                return trained, sampler.state_dict()  # what accelerator.save_state saves (the main process's)
    return trained, sampler.state_dict()


def stop_points(num_processes: int) -> list[int]:
    """Steps to stop after: inside the first epoch, at its end, inside the second, one before the end of all."""
    steps = len(TokenBudgetBatchSampler(LENGTHS, **OPTIONS, num_replicas=num_processes, shard=False)) // num_processes
    return [3, steps, steps + 3, 2 * steps - 1]


@pytest.mark.parametrize("num_processes", [1, 2, 3])
def test_resume_mid_epoch_trains_the_batches_of_the_uninterrupted_run(num_processes):
    uninterrupted = [train(num_processes, rank)[0] for rank in range(num_processes)]
    for stop in stop_points(num_processes):
        stopped = [train(num_processes, rank, stop_at=stop) for rank in range(num_processes)]
        states = [state for _, state in stopped]
        assert all(state == states[0] for state in states), "every rank loads the main process's state"
        for rank, (before, _) in enumerate(stopped):
            after, _ = train(num_processes, rank, state=states[0], step=stop)
            assert len(before) == stop
            assert before + after == uninterrupted[rank], (
                f"{num_processes} processes, rank {rank}, stopped after {stop}"
            )


@pytest.mark.parametrize("num_processes", [1, 2])
def test_a_resume_one_step_off_is_caught(num_processes):
    stop = stop_points(num_processes)[2]  # inside the second epoch
    for rank in range(num_processes):
        uninterrupted, _ = train(num_processes, rank)
        before, state = train(num_processes, rank, stop_at=stop)
        for off in (-1, 1):
            after, _ = train(num_processes, rank, state=state, step=stop + off)
            assert before + after != uninterrupted
            assert after[0] == uninterrupted[stop + off], "a resume off by one step trains a neighbour's batches"


def test_on_one_process_the_prepared_loader_sets_the_sampler_epoch_itself():
    """Why the loop calls `loader.set_epoch` too: on one process accelerate does not wrap the sampler, and its loader
    sets the sampler's epoch from its own count of passes before each pass (a resumed run's loader starts at 0)."""
    sampler = TokenBudgetBatchSampler(LENGTHS, **OPTIONS, shard=False)
    first_epoch = list(prepared(sampler, 1))
    resumed = prepared(sampler, 1)
    sampler.set_epoch(1)
    assert list(resumed) == first_epoch, "the sampler's epoch alone is overwritten with the loader's count"
    resumed.set_epoch(1)
    assert list(resumed) != first_epoch and sampler.epoch == 1


def test_the_state_restores_the_epoch_and_is_the_same_on_every_rank():
    samplers = [TokenBudgetBatchSampler(LENGTHS, **OPTIONS, num_replicas=2, rank=rank) for rank in range(2)]
    samplers += [TokenBudgetBatchSampler(LENGTHS, **OPTIONS, num_replicas=2, shard=False)]
    for sampler in samplers:
        sampler.set_epoch(np.int64(3))
    states = [saved_and_loaded(sampler.state_dict()) for sampler in samplers]
    assert states[0] == states[1] == states[2]
    assert set(states[0]) == {"epoch", "config"} and states[0]["epoch"] == 3
    assert set(states[0]["config"]) == {"batch_size", "max_tokens", "num_replicas", "seed", "drop_last", "lengths"}
    resumed = TokenBudgetBatchSampler(LENGTHS, **OPTIONS, num_replicas=2, rank=1)
    resumed.load_state_dict(states[0])
    assert resumed.epoch == 3 and list(resumed) == list(samplers[1])


@pytest.mark.parametrize(
    ("changed", "match"),
    [
        ({"batch_size": 4}, r"batch_size=2 but this sampler has batch_size=4\..*build the sampler with batch_size=2"),
        ({"max_tokens": 300}, r"max_tokens=200 but this sampler has max_tokens=300\..*with max_tokens=200"),
        ({"num_replicas": 1}, r"num_replicas=2 but this sampler has num_replicas=1\..*relaunch on 2 processes"),
        ({"seed": 2}, r"seed=1 but this sampler has seed=2\..*build the sampler with seed=1"),
        ({"drop_last": True}, r"drop_last=False but this sampler has drop_last=True\..*with drop_last=False"),
        ({"lengths": LENGTHS[::-1]}, r"lengths='40 examples, sha256 \w+' but this sampler has lengths='40 examples, "
         r"sha256 \w+'\..*resume on the dataset the state was saved from"),
        ({"lengths": LENGTHS[:-1]}, r"lengths='40 examples, sha256 \w+' but this sampler has lengths='39 examples"),
        ({"batch_size": 4, "max_tokens": 300}, r"batch_size=2, max_tokens=200 but this sampler has batch_size=4, "
         r"max_tokens=300\..*build the sampler with batch_size=2, max_tokens=200;"),
    ],
)  # fmt: skip
def test_a_resume_with_another_configuration_is_refused_naming_what_changed(changed, match):
    built = {"lengths": LENGTHS, **OPTIONS, "num_replicas": 2, "shard": False}
    state = saved_and_loaded(TokenBudgetBatchSampler(**built).state_dict())
    resumed = TokenBudgetBatchSampler(**{**built, **changed})
    match = r"^Cannot resume TokenBudgetBatchSampler: the state was saved with " + match
    with pytest.raises(ValueError, match=match) as refused:
        resumed.load_state_dict(state)
    assert str(refused.value).endswith("or start from scratch without loading the state.")
    assert resumed.epoch == 0, "a refused state leaves the sampler as it was"


@pytest.mark.parametrize(
    ("corrupt", "error", "match"),
    [
        (lambda valid: None, TypeError, r"Expected a `TokenBudgetBatchSampler.state_dict\(\)` .*, got NoneType"),
        (lambda valid: {"yielded": 3}, TypeError, r"\(a dict with `epoch` and `config`\), got \['yielded'\]"),
        (
            lambda valid: {**valid, "config": {"batch_size": 2}},
            ValueError,
            r"its config holds \['batch_size'\], not \[",
        ),
        (lambda valid: {**valid, "epoch": -1}, ValueError, r"its epoch is -1, not an int >= 0"),
        (lambda valid: {**valid, "epoch": 1.0}, ValueError, r"its epoch is 1.0, not an int >= 0"),
    ],
)
def test_a_state_that_is_not_a_sampler_state_is_refused(corrupt, error, match):
    sampler = TokenBudgetBatchSampler(LENGTHS, **OPTIONS)
    with pytest.raises(error, match=match):
        sampler.load_state_dict(corrupt(sampler.state_dict()))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_stateful_dataloader_resumes_the_sampler_mid_epoch(num_workers):
    """A `StatefulDataLoader` saves the sampler's state and its iterator's position, and resumes both."""

    def loader(rank):
        sampler = TokenBudgetBatchSampler(LENGTHS, **OPTIONS, num_replicas=2, rank=rank)
        return sampler, StatefulDataLoader(list(range(len(LENGTHS))), batch_sampler=sampler, collate_fn=list,
                                           num_workers=num_workers)  # fmt: skip

    for rank in range(2):
        sampler, uninterrupted = loader(rank)
        expected = []
        for epoch in range(EPOCHS):
            sampler.set_epoch(epoch)
            expected += list(uninterrupted)
        sampler, stopped = loader(rank)
        sampler.set_epoch(1)
        batches = iter(stopped)
        before = [next(batches) for _ in range(3)]
        state = saved_and_loaded(stopped.state_dict())
        del batches
        sampler, resumed = loader(rank)
        resumed.load_state_dict(state)
        after = list(resumed)
        assert sampler.epoch == 1, "the sampler's state set the epoch"
        assert expected[len(expected) // 2 :] == before + after


def test_the_epoch_iterator_refuses_a_position_outside_the_epoch():
    sampler = TokenBudgetBatchSampler(LENGTHS, **OPTIONS)
    batches = iter(sampler)
    assert isinstance(batches, EpochIterator) and batches.state_dict() == {"yielded": 0}
    for position in (-1, len(sampler) + 1, "3", None):
        with pytest.raises(ValueError, match=rf"epoch of {len(sampler)} batches.*got \{{'yielded': "):
            batches.load_state_dict({"yielded": position})
    batches.load_state_dict({"yielded": len(sampler)})
    assert list(batches) == []
