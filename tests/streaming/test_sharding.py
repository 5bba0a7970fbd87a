"""Readers split a sharded source by shards: every row is read once in all, resume is exact, modes are not mixed.

Reads are counted where they happen, in the DataLoader workers too: every read appends the row's index to a file.
"""

import copy
import io

import numpy as np
import pytest
import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from flatcollate import DataCollatorWithFlattening
from flatcollate.streaming import StreamingPacker, StreamStats, interleave

datasets = pytest.importorskip("datasets")
pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")

NUM_ROWS = 47  # divides by no reader count


class ReadLog:
    """Called on every row read (as a `map` function or from `__getitem__`); appends the row's index to a file."""

    def __init__(self, path):
        self.path = str(path)

    def __call__(self, row):
        with open(self.path, "a") as log:
            log.write(f"{row['input_ids'][0]}\n")
        return row

    def reads(self):
        try:
            with open(self.path) as log:
                return sorted(int(line) for line in log)
        except FileNotFoundError:
            return []


class RecordedRows:
    """A random-access list of rows that logs every row it hands out.

    It carries a `_fingerprint`, as a `datasets.Dataset` does, so identifying it reads no row (a plain list is
    identified by reading 8 rows spread over it).
    """

    def __init__(self, rows, log):
        self.rows, self.log = rows, log
        self._fingerprint = f"recorded-{len(rows)}"

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, index):
        return self.log(self.rows[index])


def make_rows(n, *, offset=0, seed=0):
    """Row i holds tokens equal to `offset + i`, so every sequence names its row."""
    lengths = np.random.default_rng(seed).integers(1, 13, size=n)
    return [{"input_ids": [offset + i] * int(k)} for i, k in enumerate(lengths)]


def sharded(log, *, num_shards, n=NUM_ROWS, offset=0):
    table = datasets.Dataset.from_list(make_rows(n, offset=offset))
    return table.to_iterable_dataset(num_shards=num_shards).map(log)


def delivered(loader):
    """The row index of every sequence the loader yields."""
    rows = []
    for pack in loader:
        cuts = np.cumsum(pack["seq_lengths"])[:-1]
        rows += [int(piece[0]) for piece in np.split(pack["input_ids"].numpy(), cuts)]
    return rows


def all_readers(make_source, *, world_size, num_workers, **options):
    rows = []
    for rank in range(world_size):
        packer = StreamingPacker(make_source(), pack_len=16, buffer_size=4, rank=rank, world_size=world_size, **options)
        rows += delivered(StatefulDataLoader(packer, batch_size=None, num_workers=num_workers))
    return rows


@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_enough_shards_every_row_read_once_in_all(world_size, num_workers, tmp_path):
    log = ReadLog(tmp_path / "reads")
    rows = all_readers(lambda: sharded(log, num_shards=6), world_size=world_size, num_workers=num_workers)
    assert sorted(rows) == list(range(NUM_ROWS))
    assert log.reads() == list(range(NUM_ROWS))


@pytest.mark.parametrize(("world_size", "num_workers"), [(2, 0), (3, 0), (1, 2), (2, 2), (3, 2)])
def test_fewer_shards_than_readers_falls_back_to_row_index(world_size, num_workers, tmp_path):
    readers = world_size * max(num_workers, 1)
    log = ReadLog(tmp_path / "reads")
    rows = all_readers(lambda: sharded(log, num_shards=readers - 1), world_size=world_size, num_workers=num_workers)
    assert sorted(rows) == list(range(NUM_ROWS))
    # Row-index sharding: every reader walks the whole stream.
    assert log.reads() == sorted(list(range(NUM_ROWS)) * readers)


@pytest.mark.parametrize(("world_size", "num_workers"), [(1, 0), (3, 0), (2, 2)])
def test_random_access_source_never_touches_other_readers_rows(world_size, num_workers, tmp_path):
    log = ReadLog(tmp_path / "reads")
    rows = all_readers(lambda: RecordedRows(make_rows(NUM_ROWS), log), world_size=world_size, num_workers=num_workers)
    assert sorted(rows) == list(range(NUM_ROWS))
    assert log.reads() == list(range(NUM_ROWS))


@pytest.mark.parametrize(("world_size", "num_workers"), [(2, 0), (1, 2)])
def test_interleave_of_sharded_sources_reads_each_row_at_most_once(world_size, num_workers, tmp_path):
    log = ReadLog(tmp_path / "reads")

    def source():
        rows = RecordedRows(make_rows(60, offset=1000), log)
        return interleave([sharded(log, num_shards=4, n=60), rows], [0.5, 0.5], seed=3)

    rows = all_readers(source, world_size=world_size, num_workers=num_workers)
    assert len(rows) == len(set(rows)) > 30
    # Every row read went into a pack: readers read nothing of each other's.
    assert log.reads() == sorted(rows)


@pytest.mark.parametrize("sharding", ["auto", "rows"])
def test_example_ids_are_unique_across_readers(sharding):
    ids = []
    for rank in range(3):
        source = datasets.Dataset.from_list(make_rows(NUM_ROWS)).to_iterable_dataset(num_shards=6)
        packer = StreamingPacker(
            source, pack_len=16, rank=rank, world_size=3, sharding=sharding, return_example_ids=True
        )
        mine = [i for pack in packer for i in pack["example_ids"]]
        assert {i % 3 for i in mine} == {rank}
        ids += mine
    assert len(ids) == len(set(ids)) == NUM_ROWS


def test_stats_count_rows_of_the_reader_in_shard_mode(tmp_path):
    log = ReadLog(tmp_path / "reads")
    counted = 0
    for rank in range(3):
        packer = StreamingPacker(sharded(log, num_shards=6), pack_len=16, rank=rank, world_size=3)
        list(packer)
        counted += packer.stats().num_rows
        assert StreamStats.from_state(packer.state_dict()).num_rows == packer.stats().num_rows
    assert counted == NUM_ROWS


def save_and_load(state):
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def make_loader(source, *, rank, world_size, num_workers, **options):
    packer = StreamingPacker(source, pack_len=24, buffer_size=5, rank=rank, world_size=world_size, **options)
    return StatefulDataLoader(packer, batch_size=2, num_workers=num_workers, collate_fn=DataCollatorWithFlattening())


def as_lists(batches):
    return [{key: value.tolist() if torch.is_tensor(value) else value for key, value in b.items()} for b in batches]


@pytest.mark.parametrize(("world_size", "num_workers"), [(2, 0), (2, 2)])
def test_resume_in_shard_mode_matches_uninterrupted_run(world_size, num_workers, tmp_path):
    log = ReadLog(tmp_path / "reads")
    options = {"rank": 1, "world_size": world_size, "num_workers": num_workers}
    full = as_lists(make_loader(sharded(log, num_shards=4, n=120), **options))
    assert len(full) >= 6
    for stop in (1, len(full) // 2, len(full) - 1):
        loader = make_loader(sharded(log, num_shards=4, n=120), **options)
        head = []
        for batch in loader:
            head.append(batch)
            if len(head) == stop:
                break
        state = save_and_load(loader.state_dict())
        resumed = make_loader(sharded(log, num_shards=4, n=120), **options)
        resumed.load_state_dict(state)
        assert as_lists(head) + as_lists(resumed) == full, f"stopped after {stop} batches"


def test_resume_of_interleaved_shards_matches_uninterrupted_run(tmp_path):
    log = ReadLog(tmp_path / "reads")

    def source():
        return interleave([sharded(log, num_shards=4, n=120), make_rows(90, offset=1000)], [0.6, 0.4], seed=2)

    full = as_lists(make_loader(source(), rank=1, world_size=2, num_workers=0))
    assert len(full) >= 6
    for stop in (1, len(full) // 2, len(full) - 1):
        loader = make_loader(source(), rank=1, world_size=2, num_workers=0)
        head = [batch for _, batch in zip(range(stop), loader, strict=False)]
        resumed = make_loader(source(), rank=1, world_size=2, num_workers=0)
        assert loader.dataset.state_dict()["config"]["sharding"] == "shards"
        resumed.load_state_dict(save_and_load(loader.state_dict()))
        assert as_lists(head) + as_lists(resumed) == full, f"stopped after {stop} batches"


def test_resume_in_shard_mode_reads_no_row_again(tmp_path):
    log = ReadLog(tmp_path / "reads")
    loader = make_loader(sharded(log, num_shards=4, n=120), rank=0, world_size=2, num_workers=0)
    iterator = iter(loader)
    for _ in range(3):
        next(iterator)
    state = save_and_load(loader.state_dict())
    resumed = make_loader(sharded(log, num_shards=4, n=120), rank=0, world_size=2, num_workers=0)
    resumed.load_state_dict(state)
    list(resumed)
    reads = log.reads()
    assert len(reads) == len(set(reads)) == 60  # rank 0's two shards of 30 rows, each read once


def shard_state(sharding, steps=2, num_shards=4):
    packer = StreamingPacker(
        datasets.Dataset.from_list(make_rows(80)).to_iterable_dataset(num_shards=num_shards),
        pack_len=16,
        buffer_size=4,
        rank=0,
        world_size=2,
        sharding=sharding,
    )
    iterator = iter(packer)
    for _ in range(steps):
        next(iterator)
    return save_and_load(packer.state_dict())


def shard_packer(sharding="auto", num_shards=4):
    source = datasets.Dataset.from_list(make_rows(80)).to_iterable_dataset(num_shards=num_shards)
    return StreamingPacker(source, pack_len=16, buffer_size=4, rank=0, world_size=2, sharding=sharding)


@pytest.mark.parametrize(("saved", "resumed", "mode"), [("rows", "auto", "shards"), ("shards", "rows", "rows")])
def test_state_saved_in_other_mode_is_refused(saved, resumed, mode):
    state = shard_state(saved)
    assert state["config"]["sharding"] == {"rows": "rows", "shards": "shards"}[saved]
    with pytest.raises(ValueError, match=rf"saved with sharding='{saved}' but this packer has sharding='{mode}'"):
        shard_packer(resumed).load_state_dict(state)


def test_state_from_before_shard_mode_resumes_by_row_index_only():
    state = shard_state("rows")
    old = {**state, "config": {key: value for key, value in state["config"].items() if key != "sharding"}}
    old["config"]["version"] = 3
    with pytest.raises(ValueError, match=r"saved with sharding='rows'.*sharding=\"rows\""):
        shard_packer().load_state_dict(copy.deepcopy(old))
    packer = shard_packer("rows")
    packer.load_state_dict(old)
    reference = shard_packer("rows")
    reference.load_state_dict(state)
    assert as_lists(packer) == as_lists(reference)


def test_shard_mode_state_with_unread_example_id_is_refused():
    state = shard_state("shards")
    assert state["bins"]["example_ids"].numel() > 0
    state["bins"]["example_ids"][-1] = state["source"]["position"] * 2  # reader 0 of 2: its row `position`
    with pytest.raises(ValueError, match=r"example id \d+ is not a row read before the saved source position"):
        shard_packer().load_state_dict(state)


def test_forced_shard_mode_needs_a_shard_per_reader():
    with pytest.raises(ValueError, match=r"num_shards=2.*3 readers.*sharding=\"auto\""):
        source = sharded(ReadLog("/dev/null"), num_shards=2)
        StreamingPacker(source, pack_len=8, rank=0, world_size=3, sharding="shards")
    with pytest.raises(ValueError, match=r"list.*random access.*sharding=\"auto\""):
        StreamingPacker(make_rows(10), pack_len=8, sharding="shards")
    with pytest.raises(ValueError, match="`sharding` must be one of"):
        StreamingPacker(make_rows(10), pack_len=8, sharding="files")


def test_dataset_split_by_node_is_refused_when_ranks_split_it_again():
    from datasets.distributed import split_dataset_by_node

    split = split_dataset_by_node(sharded(ReadLog("/dev/null"), num_shards=4), rank=1, world_size=2)
    with pytest.raises(ValueError, match=r"split_dataset_by_node` \(rank 1 of 2\).*world_size=2 ranks"):
        StreamingPacker(split, pack_len=16, rank=1, world_size=2)
    with pytest.raises(ValueError, match="split_dataset_by_node"):
        StreamingPacker(interleave([make_rows(5), split], [0.5, 0.5], seed=0), pack_len=16, rank=1, world_size=2)
    # One rank's split, read by one packer (its DataLoader workers split it by row index): every row of it, once.
    rows = delivered(StatefulDataLoader(StreamingPacker(split, pack_len=16), batch_size=None, num_workers=2))
    reference = [row["input_ids"][0] for row in split]
    assert sorted(rows) == sorted(reference) and len(reference) > 15
