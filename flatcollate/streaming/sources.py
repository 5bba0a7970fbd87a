"""Row sources a streaming packer reads from, each able to report and restore its position exactly.

A source is one stream of rows, `0, 1, 2, ...`. Readers (data-parallel ranks times DataLoader workers) split it in one
of two ways, chosen by `flatcollate.streaming.sharding`:

- by row index: every reader walks the stream and `skip`s the rows it does not own. A random-access source moves its
  cursor over them without reading them, so a reader touches only its own rows; an iterable reads and discards them.
- by source shards: a `datasets.IterableDataset` with at least one shard per reader (or an `interleave` of such
  sources) gives every reader a source of its own shards (`shard(index, count)`), so no row is read twice.

Resume, by kind of source:

- random access (`list`, `tuple`, a map-style `datasets.Dataset`, anything with `__len__` and `__getitem__`): the
  state is the cursor; nothing consumed is read again.
- `datasets.IterableDataset`: the state holds the dataset's own `state_dict()`; nothing consumed is read again. One
  shuffled with `.shuffle(buffer_size=...)` is refused: that state does not hold the buffer's rows.
- any other iterable: the state is the number of rows passed; resuming iterates the source again from its start and
  discards that many rows without encoding them.

`fingerprint()` identifies the data (see `fingerprints`), so that a state is only resumed on the data it was saved from.
"""

import copy
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from .fingerprints import has_shuffle_buffer, iterable_dataset_fingerprint, sequence_fingerprint

_END = object()


class RowSource:
    """Base class: a cursor over one stream of rows.

    Subclasses implement `_advance(take)`, which returns the next row (or `None` when `take` is false) and raises
    `StopIteration` at the end, plus `fingerprint`, `state_dict`, `check_state` and `load_state_dict`. A source that
    readers can split by shards also gives `num_shards` and `shard`.
    """

    position: int = 0
    num_shards: int | None = None  # shards readers can split the source into; `None`: split it by row index

    def shard(self, index: int, count: int) -> "RowSource":
        """A source of the shards `index, index + count, ...` only, for reader `index` of `count`."""
        raise TypeError(f"A {type(self).__name__} cannot be split by shards.")

    def skip(self, count: int) -> None:
        """Move past `count` rows without handing them out; raises `StopIteration` where the stream ends."""
        for _ in range(count):  # a plain iterable has to read the rows it skips
            self._advance(False)
            self.position += 1

    def next_row(self, *, take: bool) -> tuple[Any, str] | None:
        """The next row and a description of where it came from, or `None` for a row the caller does not own."""
        origin = self.describe(self.position)
        row = self._advance(take)
        self.position += 1
        return (row, origin) if take else None

    def describe(self, position: int) -> str:
        return f"row {position}"

    def __iter__(self) -> Iterator[Any]:
        self.load_state_dict(None)
        while True:
            try:
                row, _ = self.next_row(take=True)
            except StopIteration:
                return
            yield row

    def _advance(self, take: bool) -> Any:
        raise NotImplementedError

    def fingerprint(self) -> dict:
        raise NotImplementedError

    def state_dict(self) -> dict:
        raise NotImplementedError

    def check_state(self, state: Any) -> str | None:
        """What is wrong with a saved `state_dict()` of this source (`None` when it can be loaded)."""
        raise NotImplementedError

    def load_state_dict(self, state: dict | None) -> None:
        """Start from `state` (`None`: from the first row). Reading resumes lazily at the next `next_row`."""
        raise NotImplementedError


class SequenceSource(RowSource):
    """Random-access rows: skipping a row never reads it; resume jumps straight to the cursor."""

    def __init__(self, rows: Sequence):
        self.rows = rows
        self.position = 0
        self._content: str | None = None

    def _advance(self, take: bool) -> Any:
        if self.position >= len(self.rows):
            raise StopIteration
        return self.rows[self.position] if take else None

    def skip(self, count: int) -> None:
        # Random access: the cursor jumps, the skipped rows are never read.
        self.position += count
        if self.position > len(self.rows):
            self.position = len(self.rows)
            raise StopIteration

    def shard(self, index: int, count: int) -> "SequenceSource":
        """The rows `index, index + count, ...`, still random access (a shard of an `interleave` of sharded sources)."""
        return SequenceSource(StridedRows(self.rows, index, count))

    def fingerprint(self) -> dict:
        if self._content is None:  # computed once: `state_dict()` runs after every batch
            self._content = sequence_fingerprint(self.rows)
        return {"kind": "sequence", "num_rows": len(self.rows), "content": self._content}

    def state_dict(self) -> dict:
        return {"position": self.position}

    def check_state(self, state: Any) -> str | None:
        return position_problem(state, limit=len(self.rows))

    def load_state_dict(self, state: dict | None) -> None:
        self.position = 0 if state is None else int(state["position"])


class IterableSource(RowSource):
    """Rows from an iterable: a `datasets.IterableDataset` resumes from its own state, anything else is replayed."""

    def __init__(self, rows: Iterable, *, reader: tuple[int, int] | None = None):
        self.rows = rows
        self.reader = reader  # (index, count) when `rows` holds only the shards of one reader
        self.position = 0
        self._iterator: Iterator | None = None
        self._replay = 0
        self._inner_state: dict | None = None
        self._hf = _is_hf_iterable(rows)
        self._pipeline: str | None = None
        if self._hf and has_shuffle_buffer(rows):
            raise ValueError(
                "This `datasets.IterableDataset` was shuffled with `.shuffle(buffer_size=...)`; the rows in its "
                "shuffle buffer are not part of its `state_dict()`, so a stream read from it cannot be resumed "
                "without losing them. Shuffle before streaming instead: pass a map-style dataset shuffled with "
                "`Dataset.shuffle(seed=...)` (or its `.to_iterable_dataset()`), or shuffle the order of the source "
                "files with a fixed seed."
            )

    @property
    def num_shards(self) -> int | None:
        # A dataset already split with `split_dataset_by_node` is read as it is, by row index.
        if not self._hf or self.reader is not None or getattr(self.rows, "_distributed", None):
            return None
        return int(self.rows.num_shards)

    def shard(self, index: int, count: int) -> "IterableSource":
        """The shards `index, index + count, ...` of the `datasets.IterableDataset` (its `shard(contiguous=False)`)."""
        if self.num_shards is None:
            return super().shard(index, count)
        part = self.rows.shard(num_shards=count, index=index, contiguous=False)
        part.set_epoch(self.rows.epoch)  # `shard` starts a new dataset at epoch 0
        return IterableSource(part, reader=(index, count))

    def describe(self, position: int) -> str:
        if self.reader is None:
            return f"row {position}"
        index, count = self.reader
        return f"row {position} of shards {index}::{count}"

    def _advance(self, take: bool) -> Any:
        if self._iterator is None:
            self._iterator = self._open()
        return next(self._iterator)

    def _open(self) -> Iterator:
        if self._hf:
            # A shallow copy per pass, so a loaded state never leaks into the next epoch of the caller's dataset.
            self._dataset = copy.copy(self.rows)
            if self._inner_state is not None:
                self._dataset.load_state_dict(self._inner_state)
            # `iter(batch_size=1)` rather than `iter(dataset)`: inside a DataLoader worker the latter would hand this
            # worker only some of the dataset's shards, while the packer has already split the readers' work.
            return ({key: values[0] for key, values in batch.items()} for batch in self._dataset.iter(batch_size=1))
        iterator = iter(self.rows)
        for replayed in range(self._replay):  # replaying consumed rows is the only way back into a plain iterable
            if next(iterator, _END) is _END:
                raise ValueError(
                    f"Cannot resume: the saved source position {self._replay} is past the end of the source "
                    f"({replayed} rows). The state is corrupted or belongs to other data; start from scratch without "
                    "loading it."
                )
        return iterator

    def fingerprint(self) -> dict:
        if not self._hf:  # reading a plain iterable to identify it could cost a pass over it: its type has to do
            return {"kind": "iterable", "type": type(self.rows).__name__}
        if self._pipeline is None:
            self._pipeline = iterable_dataset_fingerprint(self.rows)
        return {"kind": "datasets.IterableDataset", "type": type(self.rows).__name__, "pipeline": self._pipeline}

    def state_dict(self) -> dict:
        state = {"position": self.position}
        if self._hf:
            state["dataset"] = self._dataset.state_dict() if self._iterator is not None else self._inner_state
        return state

    def check_state(self, state: Any) -> str | None:
        problem = position_problem(state, limit=None)
        if problem is None and self._hf:
            inner = state.get("dataset")
            if not isinstance(inner, dict) and (inner is not None or state["position"] > 0):
                return (
                    f"the source state is at position {state['position']} but holds no `dataset` state of the "
                    f"`datasets.IterableDataset` (got {type(inner).__name__})"
                )
        return problem

    def load_state_dict(self, state: dict | None) -> None:
        self._iterator = None
        self.position = 0 if state is None else int(state["position"])
        self._replay = self.position
        self._inner_state = None if state is None else state.get("dataset")


def as_source(rows: Iterable | RowSource) -> RowSource:
    """Wrap rows in the `RowSource` that resumes them best (see the module docstring)."""
    if isinstance(rows, RowSource):
        return rows
    if _is_hf_iterable(rows):
        return IterableSource(rows)
    if hasattr(rows, "__len__") and hasattr(rows, "__getitem__") and not isinstance(rows, (str, bytes, dict)):
        return SequenceSource(rows)
    if isinstance(rows, Iterator):
        raise TypeError(
            f"The source is a one-shot iterator ({type(rows).__name__}); it cannot be read again for a new epoch or "
            "a resume. Pass a list, a `datasets` dataset, or an iterable whose `__iter__` starts over."
        )
    if isinstance(rows, Iterable):
        return IterableSource(rows)
    raise TypeError(f"Expected an iterable of rows, got {type(rows).__name__}.")


class StridedRows(Sequence):
    """The rows `start, start + step, ...` of a random-access source, read only when asked for.

    >>> list(StridedRows(list("abcdefg"), 1, 3))
    ['b', 'e']
    """

    def __init__(self, rows: Sequence, start: int, step: int):
        self.rows, self._indices = rows, range(start, len(rows), step)

    def __len__(self) -> int:
        return len(self._indices)

    def __getitem__(self, index: int) -> Any:
        return self.rows[self._indices[index]]


def position_problem(state: Any, *, limit: int | None) -> str | None:
    """What is wrong with the `position` of a source state; `limit` is the row count of a sized source."""
    if not isinstance(state, dict) or "position" not in state:
        return f"the source state must be a dict with a `position`, got {repr(state)[:80]}"
    position = state["position"]
    if not isinstance(position, int | np.integer) or isinstance(position, bool):
        return f"the source position {position!r} is not an int"
    if position < 0 or (limit is not None and position > limit):
        allowed = f"[0, {limit}] (the source's row count)" if limit is not None else ">= 0"
        return f"the source position {position} is outside {allowed}"
    return None


def _is_hf_iterable(rows: Any) -> bool:
    """Whether `rows` is a `datasets.IterableDataset` (checked without importing `datasets` eagerly)."""
    return type(rows).__module__.startswith("datasets.") and hasattr(rows, "state_dict") and hasattr(rows, "iter")
