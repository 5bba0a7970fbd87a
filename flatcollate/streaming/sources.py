"""Row sources a streaming packer reads from, each able to report and restore its position exactly.

Every source walks one global stream of rows, `0, 1, 2, ...`. A reader that owns only some rows (a data-parallel rank
or a DataLoader worker) still walks the whole stream, but asks for the rows it does not own with `take=False`: a
random-access source then moves its cursor without reading the row at all, a plain iterable reads and discards it.

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

_DRAW_BLOCK = 1024
_END = object()


class RowSource:
    """Base class: a cursor over one stream of rows.

    Subclasses implement `_advance(take)`, which returns the next row (or `None` when `take` is false) and raises
    `StopIteration` at the end, plus `fingerprint`, `state_dict`, `check_state` and `load_state_dict`.
    """

    position: int = 0

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

    def fingerprint(self) -> dict:
        if self._content is None:  # computed once: `state_dict()` runs after every batch
            self._content = sequence_fingerprint(self.rows)
        return {"kind": "sequence", "num_rows": len(self.rows), "content": self._content}

    def state_dict(self) -> dict:
        return {"position": self.position}

    def check_state(self, state: Any) -> str | None:
        return _position_problem(state, limit=len(self.rows))

    def load_state_dict(self, state: dict | None) -> None:
        self.position = 0 if state is None else int(state["position"])


class IterableSource(RowSource):
    """Rows from an iterable: a `datasets.IterableDataset` resumes from its own state, anything else is replayed."""

    def __init__(self, rows: Iterable):
        self.rows = rows
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
            # worker only some of the dataset's shards, while sharding here is done by row index over the whole stream.
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
        problem = _position_problem(state, limit=None)
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


class InterleavedSource(RowSource):
    """Rows drawn from several sources with fixed probabilities; built by `interleave`.

    The choice of source for draw `i` depends only on `(seed, i)`, so the state is the draw counter plus the state of
    every child. The stream ends when the chosen source is exhausted (as `datasets.interleave_datasets` does with
    `stopping_strategy="first_exhausted"`), which keeps the proportions honest to the end.
    """

    def __init__(self, sources: Sequence[RowSource], probabilities: np.ndarray, seed: int):
        self.sources = list(sources)
        self.probabilities = probabilities
        self.seed = seed
        self.position = 0
        self._cumulative = np.cumsum(probabilities)
        self._block_index = -1
        self._block = np.empty(0, dtype=np.int64)

    def _choice(self, draw: int) -> int:
        block_index, offset = divmod(draw, _DRAW_BLOCK)
        if block_index != self._block_index:
            uniforms = np.random.default_rng([self.seed, block_index]).random(_DRAW_BLOCK)
            choices = np.searchsorted(self._cumulative, uniforms * self._cumulative[-1], side="right")
            self._block = np.minimum(choices, len(self.sources) - 1)
            self._block_index = block_index
        return int(self._block[offset])

    def describe(self, position: int) -> str:
        index = self._choice(position)
        return f"source {index} {self.sources[index].describe(self.sources[index].position)} (stream row {position})"

    def _advance(self, take: bool) -> Any:
        child = self.sources[self._choice(self.position)]
        row = child._advance(take)
        child.position += 1
        return row

    def fingerprint(self) -> dict:
        return {
            "kind": "interleave",
            "probabilities": [float(p) for p in self.probabilities],
            "seed": self.seed,
            "sources": [source.fingerprint() for source in self.sources],
        }

    def state_dict(self) -> dict:
        return {"position": self.position, "sources": [source.state_dict() for source in self.sources]}

    def check_state(self, state: Any) -> str | None:
        problem = _position_problem(state, limit=None)
        if problem is not None:
            return problem
        children = state.get("sources")
        if not isinstance(children, list) or len(children) != len(self.sources):
            count = len(children) if isinstance(children, list) else type(children).__name__
            return f"the interleaved source state holds {count} source states for {len(self.sources)} sources"
        for index, (source, child) in enumerate(zip(self.sources, children, strict=True)):
            problem = source.check_state(child)
            if problem is not None:
                return f"source {index}: {problem}"
        # Every draw advances exactly one source.
        total = sum(int(child["position"]) for child in children)
        if total != state["position"]:
            return f"the interleaved source made {state['position']} draws but its sources' positions sum to {total}"
        return None

    def load_state_dict(self, state: dict | None) -> None:
        self.position = 0 if state is None else int(state["position"])
        children = [None] * len(self.sources) if state is None else state["sources"]
        for source, child_state in zip(self.sources, children, strict=True):
            source.load_state_dict(child_state)


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


def interleave(sources: Sequence[Iterable], probabilities: Sequence[float], seed: int) -> InterleavedSource:
    """Mix several row sources, drawing each row from source `k` with probability `probabilities[k]`.

    Args:
        sources: lists, `datasets` datasets or iterables of rows (see `as_source`).
        probabilities: one non-negative weight per source; normalized to sum to 1.
        seed (`int`): the draws depend only on `(seed, row index)`, so a resumed stream draws the same sources.

    Returns:
        `InterleavedSource`, usable as the source of `StreamingPacker` or iterated directly.

    >>> mixed = interleave([["a"] * 5, ["b"] * 5], [0.5, 0.5], seed=0)
    >>> sorted(set(mixed))
    ['a', 'b']
    """
    if len(sources) == 0:
        raise ValueError("`interleave` needs at least one source.")
    weights = np.asarray(probabilities, dtype=np.float64)
    if weights.shape != (len(sources),):
        raise ValueError(f"Got {len(sources)} sources but {weights.size} probabilities; give one per source.")
    if not np.all(np.isfinite(weights)) or np.any(weights < 0) or weights.sum() <= 0:
        raise ValueError(f"`probabilities` must be non-negative with a positive sum, got {weights.tolist()}.")
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool):
        raise TypeError(f"`seed` must be an int, got {seed!r}.")
    return InterleavedSource([as_source(source) for source in sources], weights / weights.sum(), int(seed))


def _position_problem(state: Any, *, limit: int | None) -> str | None:
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
