"""Exact resume through `StatefulDataLoader`: a run stopped after k batches and resumed yields the same batches."""

import io

import numpy as np
import pytest
import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from flatcollate import DataCollatorWithFlattening
from flatcollate.streaming import StreamingPacker, interleave

pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")


class CountingRows:
    """A plain re-iterable (no random access): resume has to replay it; counts how many rows were read."""

    def __init__(self, rows):
        self.rows, self.reads = rows, 0

    def __iter__(self):
        for row in self.rows:
            self.reads += 1
            yield row


def make_rows(n, *, seed, offset=0, max_len=24):
    lengths = np.random.default_rng(seed).integers(1, max_len + 1, size=n)
    return [{"input_ids": [offset + i] * int(k), "labels": list(range(int(k)))} for i, k in enumerate(lengths)]


def make_source(kind):
    if kind == "list":
        return make_rows(90, seed=0)
    if kind == "iterable":
        return CountingRows(make_rows(90, seed=0))
    if kind == "interleave":
        return interleave([make_rows(60, seed=1), make_rows(60, seed=2, offset=1000)], [0.7, 0.3], seed=5)
    datasets = pytest.importorskip("datasets")
    return datasets.Dataset.from_list(make_rows(90, seed=0)).to_iterable_dataset(num_shards=4)


def make_loader(source, *, num_workers, overlong="error", rank=0, world_size=1):
    packer = StreamingPacker(
        source, pack_len=24, buffer_size=5, overlong=overlong, rank=rank, world_size=world_size, strategy="best_fit"
    )
    return StatefulDataLoader(packer, batch_size=2, num_workers=num_workers, collate_fn=DataCollatorWithFlattening())


def as_lists(batches):
    return [{key: value.tolist() if torch.is_tensor(value) else value for key, value in b.items()} for b in batches]


def save_and_load(state):
    """Through `torch.save` / `torch.load(weights_only=True)`, as a checkpoint would go."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("kind", ["list", "iterable", "interleave", "datasets"])
def test_resume_matches_uninterrupted_run(kind, num_workers):
    full = as_lists(make_loader(make_source(kind), num_workers=num_workers))
    assert len(full) >= 8
    for stop in (1, 3, len(full) // 2 + 1, len(full)):
        loader = make_loader(make_source(kind), num_workers=num_workers)
        head = []
        for batch in loader:
            head.append(batch)
            if len(head) == stop:
                break
        state = save_and_load(loader.state_dict())
        resumed = make_loader(make_source(kind), num_workers=num_workers)
        resumed.load_state_dict(state)
        assert as_lists(head) + as_lists(resumed) == full, f"stopped after {stop} batches"


def test_resume_does_not_reencode_consumed_rows():
    encoded = []

    def encode(row):
        encoded.append(row["input_ids"][0])
        return row

    rows = make_rows(60, seed=3)
    collate = DataCollatorWithFlattening()
    packer = StreamingPacker(rows, pack_len=24, encode_fn=encode, buffer_size=4)
    loader = StatefulDataLoader(packer, batch_size=2, collate_fn=collate)
    iterator = iter(loader)
    for _ in range(4):
        next(iterator)
    state, consumed = loader.state_dict(), len(encoded)
    encoded.clear()
    packer = StreamingPacker(rows, pack_len=24, encode_fn=encode, buffer_size=4)
    resumed = StatefulDataLoader(packer, batch_size=2, collate_fn=collate)
    resumed.load_state_dict(state)
    list(resumed)
    assert sorted(encoded) == list(range(consumed, 60))


def test_resume_with_split_sequences_mid_row():
    rows = [{"input_ids": list(range(100 * i, 100 * i + n))} for i, n in enumerate([70, 5, 50, 3, 49, 24, 1])]
    full = as_lists(make_loader(rows, num_workers=0, overlong="split"))
    for stop in range(1, len(full)):
        loader = make_loader(rows, num_workers=0, overlong="split")
        head = [b for _, b in zip(range(stop), loader, strict=False)]
        resumed = make_loader(rows, num_workers=0, overlong="split")
        resumed.load_state_dict(save_and_load(loader.state_dict()))
        assert as_lists(head) + as_lists(resumed) == full


def packer_state(**overrides):
    options = {"pack_len": 24, "buffer_size": 5, "rank": 0, "world_size": 2, **overrides}
    source = options.pop("source", make_rows(30, seed=0))
    packer = StreamingPacker(source, **options)
    iterator = iter(packer)
    next(iterator)
    return packer.state_dict()


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"pack_len": 32}, "pack_len"),
        ({"buffer_size": 6}, "buffer_size"),
        ({"strategy": "greedy"}, "strategy"),
        ({"rank": 1}, "rank"),
        ({"world_size": 3}, "world_size"),
        ({"source": make_rows(31, seed=0)}, "source"),
        ({"source": interleave([make_rows(30, seed=0)] * 2, [0.5, 0.5], seed=1)}, "source"),
    ],
)
def test_state_from_other_configuration_is_refused(overrides, field):
    state = packer_state()
    packer = StreamingPacker(overrides.pop("source", make_rows(30, seed=0)), **{**_defaults(), **overrides})
    with pytest.raises(ValueError, match=rf"Cannot resume: the state was saved with {field}="):
        packer.load_state_dict(state)


def test_interleave_seed_mismatch_is_refused():
    state = packer_state(source=interleave([make_rows(30, seed=0)] * 2, [0.5, 0.5], seed=1))
    packer = StreamingPacker(interleave([make_rows(30, seed=0)] * 2, [0.5, 0.5], seed=2), **_defaults())
    with pytest.raises(ValueError, match=r"saved with source=.*'seed': 1"):
        packer.load_state_dict(state)


def test_worker_count_mismatch_is_refused():
    loader = make_loader(make_rows(60, seed=0), num_workers=2)
    iterator = iter(loader)
    next(iterator)
    worker_state = loader.state_dict()["_snapshot"]["_worker_snapshots"]["worker_1"]["dataset_state"]
    del iterator
    assert worker_state["config"]["worker_id"] == 1
    # `StatefulDataLoader` itself refuses another worker count; a worker's state loaded elsewhere is refused here.
    packer = StreamingPacker(make_rows(60, seed=0), pack_len=24, buffer_size=5, strategy="best_fit")
    with pytest.raises(ValueError, match="Cannot resume: the state was saved with num_workers=2"):
        packer.load_state_dict(worker_state)


def _defaults():
    return {"pack_len": 24, "buffer_size": 5, "rank": 0, "world_size": 2}


def test_state_of_the_packer_in_the_main_process_is_refused_while_workers_iterate():
    # With workers, each worker iterates its own copy: the object in the main process holds no position, and its state
    # would resume from the first row, replaying every row already trained on.
    loader = make_loader(make_rows(60, seed=0), num_workers=2)
    iterator = iter(loader)
    for _ in range(3):
        next(iterator)
    with pytest.raises(ValueError, match=r"has not iterated in this process.*`StatefulDataLoader.state_dict\(\)`"):
        loader.dataset.state_dict()
    del iterator


def test_state_of_a_packer_that_never_iterated_is_refused_and_its_stats_are_empty():
    packer = StreamingPacker(make_rows(20, seed=0), pack_len=24)
    with pytest.raises(ValueError, match=r"`StatefulDataLoader.state_dict\(\)`"):
        packer.state_dict()
    assert packer.stats().num_rows == 0


@pytest.mark.parametrize("num_workers", [0, 2])
def test_loader_state_taken_before_the_first_batch_resumes_from_the_start(num_workers):
    full = as_lists(make_loader(make_rows(60, seed=0), num_workers=num_workers))
    state = save_and_load(make_loader(make_rows(60, seed=0), num_workers=num_workers).state_dict())
    resumed = make_loader(make_rows(60, seed=0), num_workers=num_workers)
    resumed.load_state_dict(state)
    assert as_lists(resumed) == full
