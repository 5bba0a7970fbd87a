"""A saved state is checked whole before a resume: other data and corrupted states are refused, naming what is wrong."""

import copy
import io

import numpy as np
import pytest
import torch

from flatcollate.streaming import StreamingPacker, interleave

PACK_LEN = 64


def make_rows(n, *, seed=0, offset=0):
    lengths = np.random.default_rng(seed).integers(1, 40, size=n)
    return [{"input_ids": [offset + i] * int(k)} for i, k in enumerate(lengths)]


def state_after(packer, steps):
    """The packer's state after `steps` packs, through `torch.save` / `torch.load(weights_only=True)`."""
    iterator = iter(packer)
    for _ in range(steps):
        next(iterator)
    buffer = io.BytesIO()
    torch.save(packer.state_dict(), buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def resumed_packs(packer, state):
    packer.load_state_dict(state)
    return [p["input_ids"].tolist() for p in packer]


def new_packer(source=None, **options):
    return StreamingPacker(make_rows(100) if source is None else source, pack_len=PACK_LEN, buffer_size=8, **options)


def test_valid_state_still_resumes_exactly():
    full = [p["input_ids"].tolist() for p in new_packer()]
    state = state_after(new_packer(), 5)
    assert state["bins"]["lengths"].numel() > 0  # the buffer is not empty, so its checks run
    assert full[:5] + resumed_packs(new_packer(), state) == full


# Same kind and row count, other content: each must be refused as another source.
def _datasets():
    return pytest.importorskip("datasets")


def _table(seed):
    return _datasets().Dataset.from_list(make_rows(100, seed=seed))


OTHER_SOURCES = {
    "list_other_rows": (lambda: make_rows(100, seed=0), lambda: make_rows(100, seed=1)),
    "list_one_row_changed": (lambda: make_rows(100), lambda: [*make_rows(100)[:-1], {"input_ids": [7]}]),
    "dataset_reshuffled": (lambda: _table(0).shuffle(seed=1), lambda: _table(0).shuffle(seed=2)),
    "iterable_dataset_other_data": (
        lambda: _table(0).to_iterable_dataset(num_shards=2),
        lambda: _table(1).to_iterable_dataset(num_shards=2),
    ),
    "interleave_child_changed": (
        lambda: interleave([make_rows(50), make_rows(50, offset=500)], [0.5, 0.5], seed=0),
        lambda: interleave([make_rows(50), make_rows(50, seed=3, offset=500)], [0.5, 0.5], seed=0),
    ),
}


@pytest.mark.parametrize("case", sorted(OTHER_SOURCES))
def test_state_of_another_dataset_of_the_same_length_is_refused(case):
    saved_with, resumed_with = OTHER_SOURCES[case]
    state = state_after(new_packer(saved_with()), 3)
    new_packer(saved_with()).load_state_dict(state)  # the same data, rebuilt: accepted
    with pytest.raises(ValueError, match=r"Cannot resume: the state was saved with source=.*start from scratch"):
        new_packer(resumed_with()).load_state_dict(state)


def _set(path, value):
    def corrupt(state):
        node = state
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value(node[path[-1]]) if callable(value) else value

    return corrupt


def _delete(path):
    def corrupt(state):
        node = state
        for key in path[:-1]:
            node = node[key]
        del node[path[-1]]

    return corrupt


def _long_item(state):
    """Replace the first buffered sequence by one of 100 tokens."""
    bins = state["bins"]
    first = int(bins["lengths"][0])
    bins["input_ids"] = torch.cat([torch.full((100,), 5), bins["input_ids"][first:]])
    bins["labels"] = torch.cat([torch.full((100,), 5), bins["labels"][first:]])
    bins["lengths"][0] = 100


def _empty_item(state):
    """Move the first buffered sequence's length onto the second, leaving an empty one."""
    lengths = state["bins"]["lengths"]
    lengths[1] += lengths[0]
    lengths[0] = 0


def _overfull_bin(state):
    """Merge all buffered sequences into one bin (over 64 tokens)."""
    bins = state["bins"]
    assert int(bins["lengths"].sum()) > PACK_LEN
    bins["pack_sizes"] = torch.tensor([bins["lengths"].numel()])


CORRUPTIONS = {
    "missing_top_key": (_delete(["bins"]), r"no `bins`"),
    "unknown_top_key": (_set(["extra"], 1), r"unexpected key `extra`"),
    "missing_config_key": (_delete(["config", "pack_len"]), r"config has no `pack_len`"),
    "version": (_set(["config", "version"], 99), r"saved with version=99"),
    "position_past_end": (_set(["source", "position"], 10**6), r"source position 1000000 .* \[0, 100\]"),
    "negative_position": (_set(["source", "position"], -3), r"source position -3"),
    "position_not_int": (_set(["source", "position"], 2.5), r"source position 2.5 .* int"),
    "source_not_dict": (_set(["source"], [1, 2]), r"source state"),
    "source_missing_position": (_delete(["source", "position"]), r"source state .* `position`"),
    "item_longer_than_pack_len": (_long_item, r"`bins`: a sequence of 100 tokens is longer than pack_len=64"),
    "bin_over_capacity": (_overfull_bin, r"`bins`: pack 0 holds \d+ tokens, more than pack_len=64"),
    "labels_shorter": (_set(["bins", "labels"], lambda t: t[:-1]), r"`bins`: .*`labels`"),
    "ids_longer": (_set(["bins", "input_ids"], lambda t: torch.cat([t, t[:1]])), r"`bins`: .*`input_ids`"),
    "lengths_count": (_set(["bins", "lengths"], lambda t: t[:-1]), r"`bins`: \d+ `lengths` for \d+ sequences"),
    "pack_sizes_count": (_set(["bins", "pack_sizes"], lambda t: t + 1), r"`bins`: .*`pack_sizes`"),
    "zero_length": (_empty_item, r"`bins`: a sequence of 0 tokens"),
    "negative_example_id": (_set(["bins", "example_ids"], lambda t: t - 10**4), r"`bins`: example id -\d+"),
    "example_id_not_read_yet": (_set(["bins", "example_ids"], lambda t: t + 10**4), r"`bins`: example id \d+ .*"),
    "missing_pack_key": (_delete(["pending", "labels"]), r"`pending`: no `labels`"),
    "float_tensor": (_set(["bins", "input_ids"], lambda t: t.float()), r"`bins`: `input_ids` .* int64"),
    "not_a_tensor": (_set(["bins", "lengths"], lambda t: t.tolist()), r"`bins`: `lengths` .* tensor"),
}


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_corrupted_state_is_refused_with_a_message(case):
    corrupt, message = CORRUPTIONS[case]
    state = state_after(new_packer(), 5)
    bad = copy.deepcopy(state)
    corrupt(bad)
    with pytest.raises(ValueError, match=message) as raised:
        new_packer().load_state_dict(bad)
    assert "start from scratch without loading it" in str(raised.value)


def test_more_buffered_sequences_than_buffer_size_is_refused():
    state = state_after(StreamingPacker(make_rows(100), pack_len=PACK_LEN, buffer_size=16), 5)
    assert state["bins"]["lengths"].numel() > 8
    state["config"]["buffer_size"] = 8
    with pytest.raises(ValueError, match=r"`bins` holds \d+ sequences, more than buffer_size=8"):
        new_packer().load_state_dict(state)


def test_example_ids_of_another_reader_are_refused():
    rows = make_rows(100)
    state = state_after(StreamingPacker(rows, pack_len=PACK_LEN, buffer_size=8, rank=0, world_size=2), 3)
    state["bins"]["example_ids"][-1] -= 1  # odd rows belong to rank 1
    with pytest.raises(ValueError, match=r"`bins`: example id \d+ is not a row of this reader"):
        StreamingPacker(rows, pack_len=PACK_LEN, buffer_size=8, rank=0, world_size=2).load_state_dict(state)


@pytest.mark.parametrize(
    ("corrupt", "message"),
    [
        (_set(["source", "sources", 0, "position"], lambda p: p + 1), r"draws .* sum"),
        (_set(["source", "sources"], lambda s: s[:1]), r"1 source states for 2 sources"),
    ],
)
def test_corrupted_interleave_state_is_refused(corrupt, message):
    def source():
        return interleave([make_rows(60), make_rows(60, offset=500)], [0.5, 0.5], seed=0)

    state = state_after(new_packer(source()), 3)
    corrupt(state)
    with pytest.raises(ValueError, match=message):
        new_packer(source()).load_state_dict(state)


def test_iterable_dataset_state_without_its_dataset_state_is_refused():
    def source():
        return _table(0).to_iterable_dataset(num_shards=2)

    state = state_after(new_packer(source()), 3)
    state["source"]["dataset"] = None
    with pytest.raises(ValueError, match=r"source state .* `dataset`"):
        new_packer(source()).load_state_dict(state)


def test_example_ids_out_of_stream_order_inside_a_pack_are_refused():
    state = state_after(new_packer(), 5)
    sizes = state["bins"]["pack_sizes"].tolist()
    pack = next(index for index, size in enumerate(sizes) if size > 1)
    first = sum(sizes[:pack])
    ids = state["bins"]["example_ids"]
    ids[first], ids[first + 1] = ids[first + 1].clone(), ids[first].clone()
    with pytest.raises(ValueError, match=r"`bins`: example ids decrease inside a pack"):
        new_packer().load_state_dict(state)


class Replayed:
    """A plain re-iterable: its length is unknown until it is read."""

    def __init__(self, rows):
        self.rows = rows

    def __iter__(self):
        return iter(self.rows)


def test_plain_iterable_position_past_its_end_is_refused_when_replayed():
    state = state_after(new_packer(Replayed(make_rows(100))), 3)
    state["source"]["position"] = 150
    packer = new_packer(Replayed(make_rows(100)))
    packer.load_state_dict(state)  # the length of a plain iterable is only known by reading it
    with pytest.raises(ValueError, match=r"saved source position 150 is past the end of the source \(100 rows\)"):
        list(packer)
