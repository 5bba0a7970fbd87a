"""Exactly one sharder: a batch sampler's batches are split among ranks either by the sampler or by accelerate.

`accelerator.prepare(loader)` (and `transformers.Trainer`, which prepares its loaders) wraps a DataLoader's batch
sampler in accelerate's `BatchSamplerShard`, which deals the sampler's batch `i` to process `i % num_processes`::

    sampler yields (shard=False, 2 ranks)   s0r0 s0r1 s1r0 s1r1 s2r0 s2r1      (step s, rank r)
    BatchSamplerShard, process 0             s0r0      s1r0      s2r0           each rank its own batch of every step
    sampler yields (shard=True, rank 0)      s0r0 s1r0 s2r0
    BatchSamplerShard, process 0             s0r0      s2r0                     half of rank 0's batches: sharded twice

accelerate gives a batch sampler no sign that it was wrapped: the wrapper only calls `iter()` on it. So the sampler
looks at the frame that called its `__iter__` (once per epoch): a `BatchSamplerShard` there is the wrapper. A
`BatchSamplerShard` exists only once `accelerate.data_loader` is imported, so nothing is imported to check.
"""

import sys
from types import FrameType
from typing import Any


def sharding_wrapper(caller: FrameType | None) -> Any:
    """The accelerate `BatchSamplerShard` running in the frame `caller` (which called `iter(sampler)`), or `None`."""
    accelerate_data_loader = sys.modules.get("accelerate.data_loader")
    if caller is None or accelerate_data_loader is None:
        return None
    owner = caller.f_locals.get("self")
    return owner if isinstance(owner, accelerate_data_loader.BatchSamplerShard) else None


def check_one_sharder(wrapper: Any, *, shard: bool, num_replicas: int, rank: int | None) -> None:
    """Raise `ValueError` unless exactly one of the sampler and `wrapper` (a `BatchSamplerShard` or `None`) shards.

    Args:
        wrapper: the accelerate `BatchSamplerShard` iterating the sampler, or `None` (a plain DataLoader).
        shard (`bool`): whether the sampler yields only its rank's batches.
        num_replicas (`int`): the sampler's data-parallel size.
        rank (`int` or `None`): the sampler's rank (`None` with `shard=False`).
    """
    dealt_to = 1 if wrapper is None else int(wrapper.num_processes)
    if shard and dealt_to > 1:
        raise ValueError(
            f"TokenBudgetBatchSampler(num_replicas={num_replicas}, rank={rank}) already decides which batches this "
            f"rank trains on, and accelerate's `BatchSamplerShard` deals them again among {dealt_to} processes "
            "(`accelerator.prepare` or `transformers.Trainer` wrapped the DataLoader): examples would be left out or "
            "repeated without an error. Build the sampler with shard=False (it then yields every rank's batch of "
            "every step and accelerate deals each rank its own), or do not pass the DataLoader to "
            "`accelerator.prepare`."
        )
    if not shard and wrapper is None and num_replicas > 1:
        raise ValueError(
            f"TokenBudgetBatchSampler(shard=False, num_replicas={num_replicas}) yields the batches of all "
            f"{num_replicas} ranks for accelerate to deal, but it is iterated without accelerate's `BatchSamplerShard` "
            "(a plain DataLoader): every rank would train on every batch. Pass the DataLoader to `accelerator.prepare`"
            " (or let `transformers.Trainer` prepare it), or build one sampler per rank with shard=True and its rank."
        )
    if not shard and wrapper is not None and dealt_to != num_replicas:
        raise ValueError(
            f"TokenBudgetBatchSampler(shard=False) balances its batches for num_replicas={num_replicas} but "
            f"accelerate's `BatchSamplerShard` deals them among {dealt_to} processes. Pass "
            "num_replicas=accelerator.num_processes (the default under torch.distributed)."
        )
