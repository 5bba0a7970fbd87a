"""Mixing several row sources into one stream with fixed probabilities, reproducibly and resumably.

Draw `i` picks source `k` with probability `probabilities[k]`, from a generator seeded with `(seed, i // 1024)`, so the
choice depends only on `(seed, i)` and a resumed stream draws the same sources. Split by shards, each reader mixes its
own shards of every source with its own draws (seeded with `(seed, reader, readers, i // 1024)`)::

    sources   A: shards A0 A1 A2 A3      B: a list b0 b1 b2 ...
    reader 0 of 2 mixes   A0 A2   with   b0 b2 b4 ...
    reader 1 of 2 mixes   A1 A3   with   b1 b3 b5 ...
"""

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from .sources import RowSource, SequenceSource, as_source, position_problem

_DRAW_BLOCK = 1024


class InterleavedSource(RowSource):
    """Rows drawn from several sources with fixed probabilities; built by `interleave`.

    The choice of source for draw `i` depends only on `(seed, i)` (and on `reader`, the `(index, count)` of the reader
    whose shards a mix of shards reads), so the state is the draw counter plus the state of every child. The stream
    ends when the chosen source is exhausted (as `datasets.interleave_datasets` does with
    `stopping_strategy="first_exhausted"`), which keeps the proportions honest to the end.
    """

    def __init__(
        self, sources: Sequence[RowSource], probabilities: np.ndarray, seed: int, *, reader: tuple[int, ...] = ()
    ):
        self.sources = list(sources)
        self.probabilities = probabilities
        self.seed = seed
        self.reader = tuple(reader)
        self.position = 0
        self._cumulative = np.cumsum(probabilities)
        self._block_index = -1
        self._block = np.empty(0, dtype=np.int64)

    def _choice(self, draw: int) -> int:
        block_index, offset = divmod(draw, _DRAW_BLOCK)
        if block_index != self._block_index:
            uniforms = np.random.default_rng([self.seed, *self.reader, block_index]).random(_DRAW_BLOCK)
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

    def skip(self, count: int) -> None:
        # Draw by draw: the stream ends at the first draw whose source is exhausted, as in `_advance`.
        for _ in range(count):
            child = self.sources[self._choice(self.position)]
            child.skip(1)
            self.position += 1

    @property
    def num_shards(self) -> int | None:
        """The fewest shards of any sharded source; random-access sources are split row by row, so do not count.

        `None` (split by row index) when a source can be split by neither, or when every source is random access
        (row-index sharding already reads nothing twice then).
        """
        counts = [source.num_shards for source in self.sources if not isinstance(source, SequenceSource)]
        if not counts or None in counts:
            return None
        return min(counts)

    def shard(self, index: int, count: int) -> "InterleavedSource":
        if self.num_shards is None:
            return super().shard(index, count)
        parts = [source.shard(index, count) for source in self.sources]
        return InterleavedSource(parts, self.probabilities, self.seed, reader=(*self.reader, index, count))

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
        problem = position_problem(state, limit=None)
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
