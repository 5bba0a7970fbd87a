"""`TokenBudgetBatchSampler`: every index once per epoch, plain step counts, budget kept, ranks balanced."""

import math

import numpy as np
import pytest

from flatcollate.data.sampler import TokenBudgetBatchSampler, balanced_batches


def all_ranks(lengths, replicas, **kwargs):
    samplers = [TokenBudgetBatchSampler(lengths, num_replicas=replicas, rank=r, **kwargs) for r in range(replicas)]
    return samplers, [list(s) for s in samplers]


@pytest.mark.parametrize(("n", "batch_size", "replicas"), [(1, 1, 1), (97, 8, 1), (1025, 16, 4), (50, 3, 2), (8, 8, 1)])
def test_every_index_once_and_plain_step_count(n, batch_size, replicas):
    lengths = np.random.default_rng(n).integers(1, 512, n)
    max_tokens = 512 * batch_size
    samplers, per_rank = all_ranks(lengths, replicas, batch_size=batch_size, max_tokens=max_tokens, seed=1)
    steps = math.ceil(math.ceil(n / replicas) / batch_size)
    assert all(len(s) == steps and len(b) == steps for s, b in zip(samplers, per_rank, strict=True))
    seen = sorted(i for batches in per_rank for batch in batches for i in batch)
    assert seen == list(range(n))
    assert max(lengths[b].sum() for batches in per_rank for b in batches) <= max_tokens


def test_ranks_of_a_step_carry_nearly_the_same_tokens():
    lengths = np.random.default_rng(0).integers(1, 2048, 4000)
    _, per_rank = all_ranks(lengths, 4, batch_size=8, max_tokens=16384, seed=0)
    plain = lengths[: len(lengths) // 32 * 32].reshape(-1, 4, 8).sum(-1)
    for step in zip(*per_rank, strict=True):
        tokens = [lengths[b].sum() for b in step]
        assert max(tokens) - min(tokens) <= lengths.max()
    spread = np.array([[lengths[b].sum() for b in step] for step in zip(*per_rank, strict=True)])
    assert spread.std() < plain.std() / 4, "token counts per batch are far more even than a plain sampler's"


def test_seeded_and_epoch_dependent():
    lengths = np.random.default_rng(0).integers(1, 100, 300)
    a = TokenBudgetBatchSampler(lengths, batch_size=10, max_tokens=2000, seed=3)
    b = TokenBudgetBatchSampler(lengths, batch_size=10, max_tokens=2000, seed=3)
    assert list(a) == list(b)
    first = list(a)
    a.set_epoch(1)
    assert list(a) != first
    assert sorted(i for batch in a for i in batch) == list(range(300))


def test_drop_last_uses_whole_batches_only():
    lengths = np.random.default_rng(0).integers(1, 100, 103)
    _, per_rank = all_ranks(lengths, 2, batch_size=10, max_tokens=5000, drop_last=True)
    assert [len(b) for b in per_rank] == [5, 5]
    seen = [i for batches in per_rank for batch in batches for i in batch]
    assert len(seen) == len(set(seen)) == 100


def test_errors_are_clear():
    with pytest.raises(ValueError, match=r"example 2 has 600 tokens > max_tokens 500"):
        TokenBudgetBatchSampler([10, 20, 600], batch_size=2, max_tokens=500)
    with pytest.raises(ValueError, match=r"max_tokens 100 cannot hold 10 examples \(900 tokens\) in 5 steps"):
        list(TokenBudgetBatchSampler([90] * 10, batch_size=2, max_tokens=100))
    with pytest.raises(ValueError, match="rank 2 is not in"):
        TokenBudgetBatchSampler([1, 2], batch_size=1, max_tokens=10, num_replicas=2, rank=2)
    with pytest.raises(ValueError, match="cannot fill 3 steps x 2 replicas"):
        TokenBudgetBatchSampler([1] * 5, batch_size=1, max_tokens=10, num_replicas=2, rank=0)


def reference_lpt(lengths, k):
    """Slow longest-processing-time: scan every group for the lightest, per sequence."""
    loads = [0] * k
    for size in sorted(lengths, reverse=True):
        b = loads.index(min(loads))
        loads[b] += size
    return sorted(loads)


@pytest.mark.parametrize("seed", range(5))
def test_balanced_batches_match_reference_loads(seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 300, 40 + 30 * seed)
    k = 1 + seed * 3
    groups = balanced_batches(lengths, k, seed=seed)
    assert sorted(np.concatenate(groups).tolist()) == list(range(len(lengths)))
    assert sorted(int(lengths[g].sum()) for g in groups) == reference_lpt(lengths.tolist(), k)


@pytest.mark.parametrize(
    ("lengths", "error", "match"),
    [
        ([3, 0, 2], ValueError, r"example 1 has 0 tokens; every example needs at least 1 token"),
        ([3, 2, -4], ValueError, r"example 2 has -4 tokens; every example needs at least 1 token"),
        ([3, 2.5, 2], TypeError, r"lengths must hold integers, got float64 \(example 1: 2.5\)"),
        ([3.0, 2.0], TypeError, r"lengths must hold integers, got float64 \(example 0: 3.0\)"),
        ([True, False], TypeError, r"lengths must hold integers, got bool"),
        ([[3, 2], [2, 2]], TypeError, r"lengths must be 1-D \(one token count per example\), got shape \(2, 2\)"),
        (5, TypeError, r"lengths must be 1-D \(one token count per example\), got shape \(\)"),
        ([[3, 2], [2]], TypeError, r"lengths must be 1-D \(one token count per example\), got a ragged nested list"),
    ],
)
def test_bad_lengths_name_the_example_and_the_fix(lengths, error, match):
    with pytest.raises(error, match=match):
        TokenBudgetBatchSampler(lengths, batch_size=1, max_tokens=10)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"batch_size": 0}, ValueError, r"batch_size must be a positive int, got 0"),
        ({"batch_size": -2}, ValueError, r"batch_size must be a positive int, got -2"),
        ({"batch_size": 1.5}, TypeError, r"batch_size must be a positive int, got 1.5 \(float\)"),
        ({"batch_size": True}, TypeError, r"batch_size must be a positive int, got True \(bool\)"),
        ({"max_tokens": 0}, ValueError, r"max_tokens must be a positive int, got 0"),
        ({"max_tokens": 10.5}, TypeError, r"max_tokens must be a positive int, got 10.5 \(float\)"),
        ({"max_tokens": "10"}, TypeError, r"max_tokens must be a positive int, got '10' \(str\)"),
        ({"num_replicas": 0, "rank": 0}, ValueError, r"num_replicas must be a positive int, got 0"),
        ({"num_replicas": 2, "rank": 1.0}, TypeError, r"rank must be an int, got 1.0 \(float\)"),
        ({"num_replicas": 2, "rank": -1}, ValueError, r"rank -1 is not in \[0, num_replicas=2\)"),
        ({"seed": 0.5}, TypeError, r"seed must be an int, got 0.5 \(float\)"),
    ],
)
def test_bad_options_name_the_option_and_the_value(kwargs, error, match):
    kwargs = {"batch_size": 1, "max_tokens": 10, **kwargs}
    with pytest.raises(error, match=match):
        TokenBudgetBatchSampler([3, 2, 4, 1], **kwargs)


def test_accepts_integer_arrays_tensors_and_lists():
    import torch

    expected = list(TokenBudgetBatchSampler([3, 2, 4, 1], batch_size=2, max_tokens=10))
    for lengths in (np.array([3, 2, 4, 1], dtype=np.uint16), torch.tensor([3, 2, 4, 1]), (3, 2, 4, 1)):
        sampler = TokenBudgetBatchSampler(lengths, batch_size=np.int64(2), max_tokens=10)
        assert list(sampler) == expected
        assert all(len(batch) >= 1 for batch in sampler), "no empty batch reaches the collator"
