"""`StreamingPacker`: tokenize, shard and pack a stream on the fly, with a state that resumes exactly."""

import logging
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from ..boundaries import cu_seqlens_to_position_ids, lengths_to_cu_seqlens
from ..data.row_errors import SkippedRow
from .bins import STRATEGY_CHOICES, Item, OnlineBins, Strategy, packs_from_state, packs_to_state
from .examples import OVERLONG_CHOICES, EncodeFn, Overlong, encode_row, fit_to_pack
from .sharding import Readers, Sharding, check_sharding, plan_readers
from .skips import SkipCounter, StreamStats, empty_skips
from .sources import RowSource, as_source
from .state import check_state, upgrade_state

# 2: sources are identified by content, not only by kind and row count. 3: rows skipped by `encode_fn` are counted.
# 4: readers split a sharded source by shards (the config holds the mode).
_STATE_VERSION = 4

logger = logging.getLogger(__name__)


class StreamingPacker(IterableDataset):
    """Packs a stream of examples into rows of at most `pack_len` tokens that keep every sequence boundary.

    Each yielded example is a pre-packed row for `flatcollate.DataCollatorWithFlattening`::

        input_ids    [a0 a1 a2 b0 b1 c0 c1 c2]     (L,) int64, L <= pack_len
        labels       [a0 a1 a2 b0 b1 c0 c1 c2]     (L,) int64 (-100 where a token carries no loss)
        position_ids [ 0  1  2  0  1  0  1  2]     (L,) int64, restarting at every sequence
        seq_lengths  [3, 2, 3]                     list of ints, one per sequence, summing to L

    The boundaries are given twice on purpose: `transformers.Trainer` with `remove_unused_columns=True` (its default)
    removes `seq_lengths`, which no model's `forward` takes, but keeps `position_ids`; the collator finds the
    boundaries from either and checks that they agree when both are present.

    Sharding: with `world_size` ranks of `num_workers` DataLoader workers each, there are `R = world_size *
    num_workers` readers; reader `r = rank * num_workers + worker_id` reads either
    - by source shards: the shards `r, r + R, ...` of a `datasets.IterableDataset` (or of every iterable source of an
      `interleave`), when it has at least `R` shards; no row is read by two readers;
    - by row index (otherwise): the stream rows whose index is congruent to `r` modulo `R`. A random-access source
      reads only those rows; an iterable source is read in full by every reader and the other rows are discarded.
    Every row is owned by exactly one reader whatever the row count (see `flatcollate.streaming.sharding`).

    Resume: `state_dict()` / `load_state_dict()` (called per worker by `torchdata.stateful_dataloader.
    StatefulDataLoader`) hold the source position and the buffered, already-encoded sequences, so a resumed run yields
    exactly the packs an uninterrupted run yields, without encoding consumed rows again. A state saved under another
    configuration (pack length, buffer, strategy, rank, world size, worker count, sharding mode) or from other data
    (sources are compared by kind, size and a content fingerprint) is refused, and so is a corrupted state.

    Skipped rows: `encode_fn` may return a `flatcollate.data.SkippedRow` (as `build_encoder(..., on_error="skip")`
    does) for a row it cannot encode. That row goes into no pack; it is counted by reason, the first row of each reason
    is logged as a warning with its origin and message, and a reader whose pass skipped rows logs its totals when the
    source runs out. `stats()` gives the counts (a `StreamStats`: rows read, rows encoded, skipped rows per reason with
    their first origins and message). Each reader (DataLoader worker of a rank) counts the rows it owns: the counts
    are part of its `state_dict()`, so a resumed run reports the totals of an uninterrupted one, and
    `StreamStats.from_state(loader.state_dict())` sums a rank's workers. Every other bad row still raises, including
    a non-mapping row and anything wrong with what `encode_fn` returned.

    Args:
        source: a list or map-style `datasets.Dataset` (resumes by index), a `datasets.IterableDataset` (resumes from
            its own state), the result of `interleave(...)`, or any re-iterable of rows (resumes by replaying it).
        pack_len (`int`): most tokens in a packed row.
        encode_fn: per-row callable returning `{"input_ids", "labels"}`, or a `SkippedRow` to skip the row; `None`
            when rows are already tokenized.
        buffer_size (`int`, defaults to 64): most sequences held in open bins.
        strategy (`"greedy"` or `"best_fit"`, defaults to `"best_fit"`): how a sequence picks its bin.
        overlong (`"error"`, `"split"` or `"truncate"`, defaults to `"error"`): what happens to a sequence longer than
            `pack_len`.
        rank, world_size (`int`, *optional*): data-parallel position; default to `torch.distributed` when it is
            initialized, else a single process.
        sharding (`"auto"`, `"shards"` or `"rows"`, defaults to `"auto"`): split the readers' work by source shards
            when there is one per reader, always by shards (an error when there are too few), or always by row index.
        return_example_ids (`bool`, defaults to `False`): also yield `example_ids`, one id per sequence, unique across
            readers (a split sequence repeats its row's id): the stream row index by row index; by shards `i * R + r`
            for the `i`-th row reader `r` read from its shards.

    >>> rows = [{"input_ids": list(range(n))} for n in (5, 4, 3, 4)]
    >>> [p["seq_lengths"] for p in StreamingPacker(rows, pack_len=8, buffer_size=4)]
    [[5, 3], [4, 4]]
    """

    def __init__(
        self,
        source: Iterable | RowSource,
        *,
        pack_len: int,
        encode_fn: EncodeFn | None = None,
        buffer_size: int = 64,
        strategy: Strategy = "best_fit",
        overlong: Overlong = "error",
        rank: int | None = None,
        world_size: int | None = None,
        sharding: Sharding = "auto",
        return_example_ids: bool = False,
    ):
        _check_positive("pack_len", pack_len)
        _check_positive("buffer_size", buffer_size)
        if strategy not in STRATEGY_CHOICES:
            raise ValueError(f"`strategy` must be one of {STRATEGY_CHOICES}, got {strategy!r}.")
        if overlong not in OVERLONG_CHOICES:
            raise ValueError(f"`overlong` must be one of {OVERLONG_CHOICES}, got {overlong!r}.")
        if (rank is None) != (world_size is None):
            raise ValueError("Pass both `rank` and `world_size`, or neither (then torch.distributed decides).")
        if rank is None:
            initialized = torch.distributed.is_available() and torch.distributed.is_initialized()
            rank, world_size = (
                (torch.distributed.get_rank(), torch.distributed.get_world_size()) if initialized else (0, 1)
            )
        _check_positive("world_size", world_size)
        if not 0 <= rank < world_size:
            raise ValueError(f"`rank` must be in [0, {world_size}), got {rank}.")
        self.source = as_source(source)
        check_sharding(self.source, sharding=sharding, world_size=world_size, num_workers=None)
        self.sharding = sharding
        self.pack_len, self.buffer_size, self.strategy, self.overlong = pack_len, buffer_size, strategy, overlong
        self.encode_fn = encode_fn
        self.rank, self.world_size = rank, world_size
        self.return_example_ids = return_example_ids
        self._bins: OnlineBins | None = None
        self._pending: list[list[Item]] = []
        self._resume: dict | None = None
        self._skips = SkipCounter()
        self._readers = Readers("rows", 0, 1)  # set per pass
        self._stream: RowSource = self.source  # what this reader reads: the source, or its shards

    def _config(self) -> dict:
        worker = get_worker_info()
        num_workers, worker_id = (1, 0) if worker is None else (worker.num_workers, worker.id)
        readers = plan_readers(
            self.source,
            rank=self.rank,
            world_size=self.world_size,
            worker_id=worker_id,
            num_workers=num_workers,
            sharding=self.sharding,
        )
        return {
            "version": _STATE_VERSION,
            "pack_len": self.pack_len,
            "buffer_size": self.buffer_size,
            "strategy": self.strategy,
            "overlong": self.overlong,
            "source": self.source.fingerprint(),
            "rank": self.rank,
            "world_size": self.world_size,
            "num_workers": num_workers,
            "worker_id": worker_id,
            "sharding": readers.mode,
        }

    def __iter__(self) -> Iterator[dict[str, Any]]:
        # Set up eagerly (not inside the generator) so `state_dict()` is right before the first item is drawn.
        state, self._resume = self._resume, None
        self._readers = Readers.from_config(self._config())
        self._stream = self._readers.stream(self.source)
        self._stream.load_state_dict(None if state is None else state["source"])
        self._bins = OnlineBins(pack_len=self.pack_len, buffer_size=self.buffer_size, strategy=self.strategy)
        self._pending = []
        self._skips.load_state_dict(None if state is None else state["skipped"])
        if state is not None:
            self._bins.load_state_dict(state["bins"])
            self._pending = packs_from_state(state["pending"])
        return self._generate(self._bins, self._stream, self._readers)

    def _generate(self, bins: OnlineBins, stream: RowSource, readers: Readers) -> Iterator[dict[str, Any]]:
        yield from self._yield_all(bins, self._pending)
        while True:
            try:
                stream.skip(readers.to_skip(stream.position))  # the rows of other readers (none by shards)
                row, origin = stream.next_row(take=True)
            except StopIteration:
                break
            example_id = readers.example_id(stream.position - 1)
            encoded = encode_row(row, encode_fn=self.encode_fn, origin=origin)
            if isinstance(encoded, SkippedRow):
                self._skips.add(encoded, origin=origin)
                continue
            input_ids, labels = encoded
            pieces = fit_to_pack(input_ids, labels, pack_len=self.pack_len, overlong=self.overlong, origin=origin)
            ready = [pack for ids, lab in pieces for pack in bins.add(Item(example_id, ids, lab))]
            # Every pack decided by this row is yielded before the next row is read, so the state between two
            # yields still holds the packs not yet yielded: they are put back in front until they leave.
            yield from self._yield_all(bins, ready)
        if self._skips.counts:
            logger.warning("StreamingPacker reader %d of %d: %s", readers.reader, readers.num_readers, self.stats())
        yield from self._yield_all(bins, bins.flush())

    def _yield_all(self, bins: OnlineBins, ready: list[list[Item]]) -> Iterator[dict[str, Any]]:
        self._pending = list(ready)
        while self._pending:
            pack = self._pending.pop(0)
            yield self._to_example(pack)

    def _to_example(self, pack: list[Item]) -> dict[str, Any]:
        seq_lengths = [int(item.input_ids.size) for item in pack]
        example = {
            "input_ids": torch.from_numpy(np.concatenate([item.input_ids for item in pack])),
            "labels": torch.from_numpy(np.concatenate([item.labels for item in pack])),
            "position_ids": torch.from_numpy(cu_seqlens_to_position_ids(lengths_to_cu_seqlens(np.array(seq_lengths)))),
            "seq_lengths": seq_lengths,
        }
        if self.return_example_ids:
            example["example_ids"] = [item.example_id for item in pack]
        return example

    def state_dict(self) -> dict:
        """Position in the source, buffered sequences and packs decided but not yet yielded, plus the configuration.

        Reflects everything yielded so far; tensors are int64, so the state survives `torch.save` and
        `torch.load(weights_only=True)`. Raises `ValueError` on a packer that has neither iterated in this process nor
        loaded a state (the object in the main process while DataLoader workers iterate copies of it): save
        `StatefulDataLoader.state_dict()` instead.
        """
        if self._bins is None:
            if self._resume is not None:
                return self._resume
            if get_worker_info() is None:
                raise ValueError(_NOT_ITERATED)
            return self._start_state()  # a DataLoader worker's state before its first item
        return {
            "config": self._config(),
            "source": self._stream.state_dict(),
            "bins": self._bins.state_dict(),
            "pending": packs_to_state(self._pending),
            "skipped": self._skips.state_dict(),
        }

    def _start_state(self) -> dict:
        empty = packs_to_state([])
        return {"config": self._config(), "source": None, "bins": empty, "pending": empty, "skipped": empty_skips()}

    def stats(self) -> StreamStats:
        """Rows this reader read, encoded and skipped (by reason) in its current pass, or the pass a loaded state is in.

        >>> from flatcollate.data import SkippedRow
        >>> rows = [{"input_ids": [1, 2]}, {"input_ids": []}, {"input_ids": [3]}]
        >>> def encode(row):
        ...     return row if row["input_ids"] else SkippedRow(None, "empty_field", "example: no tokens")
        >>> packer = StreamingPacker(rows, pack_len=8, encode_fn=encode)
        >>> [p["seq_lengths"] for p in packer]
        [[2, 1]]
        >>> print(packer.stats())
        encoded 2 of 3 rows
          skipped 1 (empty_field): rows row 1; first: example: no tokens
        """
        if self._bins is None:
            return StreamStats.from_state(self._start_state() if self._resume is None else self._resume)
        return self._skips.stats(self._readers.rows_owned(self._stream.position))

    def load_state_dict(self, state: dict) -> None:
        """Resume the next pass from `state`.

        The whole state is checked first (see `flatcollate.streaming.state`): a state saved under another
        configuration or from other data, or one that is corrupted, raises `ValueError` naming what is wrong.
        """
        state = upgrade_state(state, version=_STATE_VERSION)
        config = self._config()
        check_state(state, config=config, source=Readers.from_config(config).stream(self.source))
        self._resume = state


_NOT_ITERATED = (
    "StreamingPacker.state_dict() was called on a packer that has not iterated in this process: it holds no position, "
    "and its state would resume from the first row, replaying every row already yielded. With DataLoader workers "
    "(num_workers > 0) each worker iterates its own copy of the packer and the object in the main process never moves. "
    "Save `StatefulDataLoader.state_dict()` instead (it holds the state of every worker) and restore it with "
    "`flatcollate.streaming.load_loader_state(loader, state)` or `StatefulDataLoader.load_state_dict()`."
)


def _check_positive(name: str, value: Any) -> None:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
        raise TypeError(f"`{name}` must be an int, got {value!r}.")
    if value <= 0:
        raise ValueError(f"`{name}` must be positive, got {value}.")
