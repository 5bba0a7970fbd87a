"""How the readers of a stream split it: by source shards when there is a shard for every reader, else by row index.

A reader is one DataLoader worker of one data-parallel rank: reader `rank * num_workers + worker_id` of
`R = world_size * num_workers`. Two ways to split the work::

    by shards     reader r reads the shards r, r + R, r + 2R, ... of the source and nothing else
    by row index  reader r walks the stream and takes the rows r, r + R, r + 2R, ...; it skips the others

    8 shards, 2 ranks x 2 workers (R = 4)
    by shards     rank 1 worker 0 = reader 2 reads shards 2 and 6: 1/4 of the rows are read
    by row index  rank 1 worker 0 = reader 2 takes rows 2, 6, 10, ...: an iterable source is read in full

Random-access sources (lists, map-style `datasets.Dataset`) are split by row index and read only the rows the reader
takes: the cursor jumps over the others. Iterable sources are read in full by every reader when split by row index, so
`sharding="auto"` splits by shards whenever the source has them (a `datasets.IterableDataset`, or an `interleave`
whose iterable sources all have them) and there are at least as many as readers; a single reader reads by row index.

The mode is part of the resume state: a state saved in one mode is refused in the other.
"""

from dataclasses import dataclass
from typing import Any, Literal

from .interleaving import InterleavedSource
from .sources import IterableSource, RowSource, SequenceSource

Sharding = Literal["auto", "shards", "rows"]
SHARDING_CHOICES = ("auto", "shards", "rows")


@dataclass(frozen=True)
class Readers:
    """Which reader this is and how the readers split the stream.

    Args:
        mode (`"shards"` or `"rows"`): by source shards or by row index.
        reader (`int`): this reader, `rank * num_workers + worker_id`.
        num_readers (`int`): `world_size * num_workers`.

    >>> readers = Readers("rows", reader=1, num_readers=4)
    >>> readers.to_skip(2), readers.rows_owned(10)  # skip rows 2..4 to reach row 5; rows 1, 5, 9 are its own
    (3, 3)
    >>> readers = Readers("shards", reader=1, num_readers=4)
    >>> readers.rows_owned(10), readers.example_id(2)  # every row of its own shards; its third row
    (10, 9)
    """

    mode: Literal["shards", "rows"]
    reader: int
    num_readers: int

    def stream(self, source: RowSource) -> RowSource:
        """The source this reader reads: its shards, or the whole stream."""
        return source.shard(self.reader, self.num_readers) if self.mode == "shards" else source

    def to_skip(self, position: int) -> int:
        """Rows to skip from `position` of this reader's stream to its next own row (none by shards)."""
        return 0 if self.mode == "shards" else (self.reader - position) % self.num_readers

    def rows_owned(self, position: int) -> int:
        """How many of the rows `0 .. position - 1` of this reader's stream are its own (all of them by shards)."""
        if self.mode == "shards":
            return position
        return max(0, -(-(position - self.reader) // self.num_readers))

    def example_id(self, position: int) -> int:
        """An id for the row at `position` of this reader's stream, unique across readers and congruent to the reader
        modulo `num_readers`: the row index by row index, `position * num_readers + reader` by shards.
        """
        return position * self.num_readers + self.reader if self.mode == "shards" else position

    @classmethod
    def from_config(cls, config: dict) -> "Readers":
        """The readers a `StreamingPacker` configuration (in its state) describes."""
        num_readers = config["world_size"] * config["num_workers"]
        return cls(config["sharding"], config["rank"] * config["num_workers"] + config["worker_id"], num_readers)


def plan_readers(
    source: RowSource, *, rank: int, world_size: int, worker_id: int, num_workers: int, sharding: Sharding
) -> Readers:
    """The `Readers` of one DataLoader worker of one rank (`num_workers=1` without workers).

    Raises `ValueError` when `sharding="shards"` cannot give every reader a shard.
    """
    num_readers = world_size * num_workers
    check_sharding(source, sharding=sharding, world_size=world_size, num_workers=num_workers)
    shards = source.num_shards
    by_shards = sharding == "shards" or (
        sharding == "auto" and num_readers > 1 and shards is not None and shards >= num_readers
    )
    return Readers("shards" if by_shards else "rows", rank * num_workers + worker_id, num_readers)


def check_sharding(source: RowSource, *, sharding: Sharding, world_size: int, num_workers: int | None) -> None:
    """Raise unless `sharding` is known and, when it is `"shards"`, the source has a shard for each reader.

    Also refuses a source split with `split_dataset_by_node` that several ranks read. `num_workers` is `None` while it
    is not known yet (when the packer is built): only the ranks are counted then.
    """
    if sharding not in SHARDING_CHOICES:
        raise ValueError(f"`sharding` must be one of {SHARDING_CHOICES}, got {sharding!r}.")
    split = _split_by_node(source)
    if split is not None and world_size > 1:
        raise ValueError(
            f"A `datasets.IterableDataset` of the source was already split with `split_dataset_by_node` (rank "
            f"{split.rank} of {split.world_size}), and the packer splits the stream again among world_size="
            f"{world_size} ranks: every rank would get only part of its rows. Pass the dataset before "
            "`split_dataset_by_node` (the packer splits it by shards, or by row index when shards are too few), or "
            "pass rank=0, world_size=1 to the packer."
        )
    if sharding != "shards":
        return
    if source.num_shards is None:
        if isinstance(source, SequenceSource):
            raise ValueError(
                f'sharding="shards" was asked for, but the source (a {type(source.rows).__name__}) is random access: '
                'split by row index, every reader already reads only its own rows. Use sharding="auto".'
            )
        raise ValueError(
            f'sharding="shards" was asked for, but the source ({type(source).__name__}) has no shards: only a '
            "`datasets.IterableDataset` (not split with `split_dataset_by_node`), or an `interleave` whose iterable "
            'sources all are one, can be read by shards. Use sharding="auto" (by row index).'
        )
    num_readers = world_size * (num_workers or 1)
    if source.num_shards < num_readers:
        layout = (
            f"{world_size} ranks" if num_workers is None else f"{world_size} ranks x {num_workers} DataLoader workers"
        )
        raise ValueError(
            f'sharding="shards" was asked for, but the source has num_shards={source.num_shards} for {num_readers} '
            f'readers ({layout}); every reader needs a shard. Use sharding="auto" (by row index when shards are too '
            "few), fewer DataLoader workers, or more shards (`Dataset.to_iterable_dataset(num_shards=...)`, more data "
            "files, `IterableDataset.reshard()`)."
        )


def _split_by_node(source: RowSource) -> Any:
    """The `DistributedConfig` of a `datasets.IterableDataset` in the source split by node, or `None`."""
    if isinstance(source, InterleavedSource):
        return next(filter(None, map(_split_by_node, source.sources)), None)
    if isinstance(source, IterableSource):
        return getattr(source.rows, "_distributed", None)
    return None
