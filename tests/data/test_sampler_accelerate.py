"""`TokenBudgetBatchSampler` under accelerate: exactly one of them shards, every example once per epoch across ranks.

`accelerator.prepare(loader)` (and `transformers.Trainer`) wrap a DataLoader's batch sampler in accelerate's
`BatchSamplerShard`, which deals batch `i` to process `i % num_processes`. The sampler built with `shard=False` yields
every rank's batch of every step for it to deal; the default sampler, which already yields only its rank's batches,
refuses to be dealt again.
"""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from torch.utils.data import DataLoader

from flatcollate.data.sampler import TokenBudgetBatchSampler

from ..training.launch import free_port, needs_gloo

accelerate_data_loader = pytest.importorskip("accelerate.data_loader")
BatchSamplerShard, prepare_data_loader = (
    accelerate_data_loader.BatchSamplerShard,
    accelerate_data_loader.prepare_data_loader,
)

RUN = Path(__file__).with_name("accelerate_sampler_run.py")
LENGTHS = np.random.default_rng(0).integers(1, 90, 40)
OPTIONS = {"batch_size": 2, "max_tokens": 200, "seed": 1}


def self_sharded(num_processes, **options):
    """The reference: each rank's own sampler (`shard=True`), iterated by a plain DataLoader."""
    return [
        list(TokenBudgetBatchSampler(LENGTHS, **OPTIONS, num_replicas=num_processes, rank=r, **options))
        for r in range(num_processes)
    ]


@pytest.mark.parametrize("num_processes", [1, 2, 3])
@pytest.mark.parametrize("drop_last", [False, True])
def test_batch_sampler_shard_deals_each_rank_its_own_balanced_batches(num_processes, drop_last):
    dealt = []
    for rank in range(num_processes):
        sampler = TokenBudgetBatchSampler(
            LENGTHS, **OPTIONS, drop_last=drop_last, num_replicas=num_processes, shard=False
        )
        assert sampler.batch_size is None, "accelerate keeps only batches of exactly `batch_size` when it is set"
        dealt.append(list(BatchSamplerShard(sampler, num_processes=num_processes, process_index=rank)))
    assert dealt == self_sharded(num_processes, drop_last=drop_last)
    seen = sorted(i for batches in dealt for batch in batches for i in batch)
    kept = len(LENGTHS) // (num_processes * OPTIONS["batch_size"]) * num_processes * OPTIONS["batch_size"]
    assert seen == (sorted(set(seen)) if drop_last else list(range(len(LENGTHS))))
    assert len(seen) == (kept if drop_last else len(LENGTHS))


@pytest.mark.parametrize("num_processes", [2, 3])
def test_prepare_data_loader_gives_every_example_once_per_epoch(num_processes):
    steps = math.ceil(math.ceil(len(LENGTHS) / num_processes) / OPTIONS["batch_size"])
    for epoch in range(2):
        seen = []
        for rank in range(num_processes):
            sampler = TokenBudgetBatchSampler(LENGTHS, **OPTIONS, num_replicas=num_processes, shard=False)
            sampler.set_epoch(epoch)
            assert len(sampler) == steps * num_processes
            loader = DataLoader(list(range(len(LENGTHS))), batch_sampler=sampler, collate_fn=list)
            prepared = prepare_data_loader(loader, num_processes=num_processes, process_index=rank)
            assert len(prepared) == steps
            seen += [i for batch in prepared for i in batch]
        assert sorted(seen) == list(range(len(LENGTHS))), f"epoch {epoch}"


@pytest.mark.parametrize("num_replicas", [1, 2])
def test_a_sampler_that_shards_itself_refuses_to_be_dealt_again(num_replicas):
    sampler = TokenBudgetBatchSampler(LENGTHS, **OPTIONS, num_replicas=num_replicas, rank=0)
    loader = DataLoader(list(range(len(LENGTHS))), batch_sampler=sampler, collate_fn=list)
    prepared = prepare_data_loader(loader, num_processes=2, process_index=0)
    with pytest.raises(ValueError, match=r"accelerate's `BatchSamplerShard` deals .* 2 processes.*shard=False"):
        list(prepared)


def test_a_sampler_for_accelerate_refuses_a_plain_dataloader_and_another_process_count():
    sampler = TokenBudgetBatchSampler(LENGTHS, **OPTIONS, num_replicas=2, shard=False)
    with pytest.raises(ValueError, match=r"shard=False.*num_replicas=2.*without accelerate's `BatchSamplerShard`"):
        list(DataLoader(list(range(len(LENGTHS))), batch_sampler=sampler, collate_fn=list))
    with pytest.raises(ValueError, match=r"num_replicas=2 but accelerate's `BatchSamplerShard` deals .* 3 processes"):
        list(BatchSamplerShard(sampler, num_processes=3, process_index=0))
    with pytest.raises(ValueError, match=r"`rank` is not used with shard=False"):
        TokenBudgetBatchSampler(LENGTHS, **OPTIONS, num_replicas=2, rank=1, shard=False)


STOP_AT = 13  # 10 steps an epoch on 2 processes: the 4th step of the second epoch
ENV = {**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"}


def launch(output: Path, *args: str, num_processes: int = 2) -> subprocess.CompletedProcess:
    """`accelerate_sampler_run.py` on `num_processes` processes (torchrun, gloo), or in this one's place for 1."""
    torchrun = [
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        str(num_processes),
        "--master_port",
        str(free_port()),
    ]
    command = [sys.executable, *(torchrun if num_processes > 1 else []), str(RUN), "--output", str(output), *args]
    return subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=180)


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    """One two-process run: both setups over two epochs, then the resumable loop stopped after `STOP_AT` steps."""
    output = tmp_path_factory.mktemp("two_processes")
    return output, launch(output, "--stop-at", str(STOP_AT))


@pytest.mark.slow
@needs_gloo
def test_two_accelerate_processes_see_every_example_once_per_epoch(two_processes):
    output, done = two_processes
    ranks = [json.loads((output / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["num_processes"] for r in ranks] == [2, 2]
    default_seen = [i for r in ranks for i in r["default_seen"] or []]
    assert all(r["default_error"] for r in ranks), f"sharded twice: {len(set(default_seen))} of 40 examples seen"
    assert "shard=False" in ranks[0]["default_error"]
    assert all("epochs" in r for r in ranks), done.stderr[-4000:]
    assert ranks[0]["steps"] == ranks[1]["steps"] == 10
    for epoch in range(2):
        seen = ranks[0]["epochs"][epoch] + ranks[1]["epochs"][epoch]
        assert sorted(seen) == list(range(40)), f"epoch {epoch}"
    assert ranks[0]["epochs"][0] != ranks[0]["epochs"][1], "set_epoch reshuffles"


@pytest.mark.slow
@needs_gloo
def test_two_accelerate_processes_resumed_mid_epoch_train_the_uninterrupted_batches(two_processes):
    output, done = two_processes
    assert done.returncode == 0, done.stderr[-4000:]
    checkpoint = output / f"step_{STOP_AT}"
    assert (checkpoint / "custom_checkpoint_0.pkl").exists(), "accelerator.save_state saved the sampler's state"
    resumed = launch(output, "--resume", str(checkpoint))  # new processes, nothing in memory from the stopped run
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    for rank in range(2):
        run = json.loads((output / f"rank{rank}.json").read_text())
        after = json.loads((output / f"resumed_rank{rank}.json").read_text())
        assert "error" not in after, after.get("error")
        assert len(run["stopped"]) == STOP_AT
        assert run["stopped"] + after["trained"] == run["batches"], f"rank {rank}"
    one_process = output / "one_process"
    one_process.mkdir()
    refused = launch(one_process, "--resume", str(checkpoint), num_processes=1)
    assert refused.returncode == 0, refused.stderr[-4000:]
    error = json.loads((one_process / "resumed_rank0.json").read_text())["error"]
    assert "saved with num_replicas=2 but this sampler has num_replicas=1" in error
    assert "relaunch on 2 processes" in error
