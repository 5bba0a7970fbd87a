"""Online bin packing against a plain per-sequence reference, on random length mixes and named edge cases."""

import numpy as np
import pytest

from flatcollate.streaming.bins import Item, OnlineBins, packs_from_state, packs_to_state


def reference_pack(lengths, *, pack_len, buffer_size, strategy):
    """Readable restatement of the packing rules with Python lists; returns packs as lists of indices."""
    bins, out = [], []  # each bin: [indices, fill]
    for index, length in enumerate(lengths):
        chosen = None
        for b in bins:
            if b[1] + length <= pack_len and (
                chosen is None or (strategy == "best_fit" and pack_len - b[1] < pack_len - chosen[1])
            ):
                chosen = b
                if strategy == "greedy":
                    break
        if chosen is None:
            chosen = [[], 0]
            bins.append(chosen)
        chosen[0].append(index)
        chosen[1] += length
        if chosen[1] == pack_len:
            bins.remove(chosen)
            out.append(chosen[0])
        while sum(len(b[0]) for b in bins) > buffer_size:
            fullest = max(bins, key=lambda b: b[1])  # max keeps the first (oldest) of ties
            bins.remove(fullest)
            out.append(fullest[0])
    return out + [b[0] for b in bins]


def run_bins(lengths, *, pack_len, buffer_size, strategy):
    bins = OnlineBins(pack_len=pack_len, buffer_size=buffer_size, strategy=strategy)
    packs = []
    for index, length in enumerate(lengths):
        ids = np.full(length, index, dtype=np.int64)
        packs += bins.add(Item(index, ids, ids.copy()))
    packs += bins.flush()
    return [[item.example_id for item in pack] for pack in packs]


CASES = {
    "length_one": [1] * 7,
    "exactly_limit": [16, 16, 16],
    "one_sequence": [5],
    "many_tiny": [1, 2] * 40,
    "mixed": [16, 1, 15, 8, 8, 3, 13, 9],
}


@pytest.mark.parametrize("strategy", ["greedy", "best_fit"])
@pytest.mark.parametrize("buffer_size", [1, 3, 64])
@pytest.mark.parametrize("case", sorted(CASES))
def test_named_cases_match_reference(case, buffer_size, strategy):
    lengths = CASES[case]
    got = run_bins(lengths, pack_len=16, buffer_size=buffer_size, strategy=strategy)
    assert got == reference_pack(lengths, pack_len=16, buffer_size=buffer_size, strategy=strategy)


@pytest.mark.parametrize("strategy", ["greedy", "best_fit"])
def test_random_mixes_match_reference_and_keep_every_sequence(strategy):
    rng = np.random.default_rng(0)
    for trial in range(30):
        pack_len = int(rng.integers(4, 64))
        buffer_size = int(rng.integers(1, 20))
        lengths = rng.integers(1, pack_len + 1, size=int(rng.integers(1, 80))).tolist()
        got = run_bins(lengths, pack_len=pack_len, buffer_size=buffer_size, strategy=strategy)
        assert got == reference_pack(lengths, pack_len=pack_len, buffer_size=buffer_size, strategy=strategy), trial
        assert sorted(i for pack in got for i in pack) == list(range(len(lengths)))
        assert all(sum(lengths[i] for i in pack) <= pack_len for pack in got)


def test_best_fit_fills_better_than_one_sequence_per_pack():
    rng = np.random.default_rng(1)
    lengths = rng.integers(1, 200, size=500).tolist()
    packs = run_bins(lengths, pack_len=256, buffer_size=64, strategy="best_fit")
    fill = sum(lengths) / (256 * len(packs))
    assert fill > 0.9


def test_state_round_trip_continues_identically():
    rng = np.random.default_rng(2)
    lengths = rng.integers(1, 30, size=60).tolist()
    expected = run_bins(lengths, pack_len=32, buffer_size=8, strategy="best_fit")
    bins = OnlineBins(pack_len=32, buffer_size=8, strategy="best_fit")
    packs = []
    for index, length in enumerate(lengths):
        if index == 25:  # rebuild from the state halfway
            state = bins.state_dict()
            bins = OnlineBins(pack_len=32, buffer_size=8, strategy="best_fit")
            bins.load_state_dict(state)
        ids = np.arange(length, dtype=np.int64) + index
        packs += bins.add(Item(index, ids, -ids))
    packs += bins.flush()
    assert [[item.example_id for item in p] for p in packs] == expected
    for pack in packs:
        for item in pack:
            np.testing.assert_array_equal(item.input_ids, np.arange(lengths[item.example_id]) + item.example_id)
            np.testing.assert_array_equal(item.labels, -item.input_ids)


def test_empty_packs_state_round_trip():
    assert packs_from_state(packs_to_state([])) == []
