"""Rows that `encode_fn` skipped: counted by reason, reported, and carried in the resume state.

An encoder built with `flatcollate.build_encoder(..., on_error="skip")` returns a `SkippedRow(index, reason, message)`
for a row it cannot encode. The packer leaves that row out of every pack and hands it to a `SkipCounter`, which logs a
warning the first time a reason occurs and keeps, per reason, the count, the first few row origins and the first
message. The counter's state is part of `StreamingPacker.state_dict()`::

    skipped   counts          {reason: int >= 1}
              first_rows      {reason: [origin, ...]}   the first min(count, 5) origins, e.g. "row 12"
              first_messages  {reason: str}             the message of the first skipped row

Only plain dicts, lists, strings and ints, so the state survives `torch.load(weights_only=True)`.
"""

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from ..data.row_errors import SkippedRow
from ..data.supervised import EncodeStats
from .sharding import Readers

logger = logging.getLogger(__name__)
SHOWN = 5  # row origins kept per reason
SKIP_KEYS = ("counts", "first_rows", "first_messages")


@dataclass(frozen=True)
class StreamStats(EncodeStats):
    """What one reader of a `StreamingPacker` (a rank's DataLoader worker) did with the rows of its current pass.

    Args:
        num_rows (`int`): rows of this reader read from the source so far.
        num_encoded (`int`): of them, rows encoded and handed to the bins (packed, or waiting in the buffer).
        skipped (`dict[str, int]`): rows `encode_fn` skipped, per reason (see `flatcollate.data.row_errors`).
        first_skipped (`dict[str, list[str]]`): where the first few skipped rows of each reason came from, in stream
            order (`"row 12"`, `"source 1 row 3 (stream row 9)"`).
        first_messages (`dict[str, str]`): the message of the first skipped row of each reason.

    The fields and their printed form are those of `flatcollate.data.supervised.EncodeStats`; rows are named by their
    origin.

    >>> print(StreamStats(4, 3, {"no_assistant": 1}, {"no_assistant": ["row 2"]}, {"no_assistant": "row 2: ..."}))
    encoded 3 of 4 rows
      skipped 1 (no_assistant): rows row 2; first: row 2: ...
    """

    @classmethod
    def merge(cls, parts: Iterable["StreamStats"]) -> "StreamStats":
        """The sum of several readers' stats (workers, ranks); `first_skipped` keeps the first few of each part in turn.

        >>> a = StreamStats(3, 2, {"no_assistant": 1}, {"no_assistant": ["row 0"]}, {"no_assistant": "row 0: ..."})
        >>> StreamStats.merge([a, StreamStats(2, 2)]).num_rows
        5
        """
        num_rows, num_encoded, counts, first_rows, messages = 0, 0, {}, {}, {}
        for part in parts:
            num_rows, num_encoded = num_rows + part.num_rows, num_encoded + part.num_encoded
            for reason, count in part.skipped.items():
                counts[reason] = counts.get(reason, 0) + count
                kept = first_rows.setdefault(reason, [])
                kept += part.first_skipped[reason][: SHOWN - len(kept)]
                messages.setdefault(reason, part.first_messages[reason])
        return cls(num_rows, num_encoded, counts, first_rows, messages)

    @classmethod
    def from_state(cls, state: dict) -> "StreamStats":
        """Stats read from a saved state: a `StreamingPacker.state_dict()`, or a `StatefulDataLoader.state_dict()`
        holding one per worker (they are summed).

        A state holds one rank's readers only; gather the per-rank stats (e.g. `torch.distributed.all_gather_object`)
        and `merge` them for the whole run.
        """
        states = list(_packer_states(state))
        if not states:
            raise ValueError("No `StreamingPacker` state found; pass `packer.state_dict()` or `loader.state_dict()`.")
        return cls.merge(_stats_of(packer_state) for packer_state in states)


class SkipCounter:
    """Counts skipped rows by reason and logs the first of each reason; its state travels with the packer's."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.first_rows: dict[str, list[str]] = {}
        self.first_messages: dict[str, str] = {}

    def add(self, skipped: SkippedRow, *, origin: str) -> None:
        """Count one skipped row; warn if it is the first of its reason in this pass."""
        reason = skipped.reason
        if not isinstance(reason, str) or not reason:
            raise TypeError(
                f"{origin}: `encode_fn` returned a SkippedRow whose `reason` is {reason!r}; it must be a non-empty str "
                "(see `flatcollate.data.row_errors` for the encoder's reasons)."
            )
        if reason not in self.counts:
            self.counts[reason], self.first_rows[reason] = 0, []
            self.first_messages[reason] = str(skipped.message)
            logger.warning(
                "%s: skipped (%s): %s (further rows skipped for this reason are counted in `StreamingPacker.stats()`, "
                "not logged one by one)",
                origin,
                reason,
                skipped.message,
            )
        self.counts[reason] += 1
        if len(self.first_rows[reason]) < SHOWN:
            self.first_rows[reason].append(origin)

    def stats(self, num_rows: int) -> StreamStats:
        return StreamStats(
            num_rows,
            num_rows - sum(self.counts.values()),
            dict(self.counts),
            {reason: list(rows) for reason, rows in self.first_rows.items()},
            dict(self.first_messages),
        )

    def state_dict(self) -> dict:
        return {
            "counts": dict(self.counts),
            "first_rows": {reason: list(rows) for reason, rows in self.first_rows.items()},
            "first_messages": dict(self.first_messages),
        }

    def load_state_dict(self, state: dict | None) -> None:
        state = state or empty_skips()
        self.counts, self.first_rows, self.first_messages = (dict(state[key]) for key in SKIP_KEYS)
        self.first_rows = {reason: list(rows) for reason, rows in self.first_rows.items()}


def empty_skips() -> dict:
    return {key: {} for key in SKIP_KEYS}


def skips_problem(skips: Any, *, num_rows: int) -> str | None:
    """What is wrong with a `skipped` state of a reader that has read `num_rows` rows, or `None`."""
    if not isinstance(skips, dict):
        return f"expected a dict, got {type(skips).__name__}"
    for key in SKIP_KEYS:
        if key not in skips:
            return f"no `{key}`"
        if not isinstance(skips[key], dict):
            return f"`{key}` is a {type(skips[key]).__name__}, not a dict"
    extra = sorted(set(skips) - set(SKIP_KEYS), key=str)
    if extra:
        return f"unexpected key `{extra[0]}`"
    counts, first_rows, messages = (skips[key] for key in SKIP_KEYS)
    for reason, count in counts.items():
        if not isinstance(reason, str) or not reason:
            return f"reason {reason!r} is not a non-empty str"
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            return f"the count of {reason!r} is {count!r}, not an int >= 1"
    total = sum(counts.values())
    if total > num_rows:
        return f"{total} skipped rows, more rows than the {num_rows} this reader read before the saved position"
    for name, values in (("first_rows", first_rows), ("first_messages", messages)):
        if set(values) != set(counts):
            return f"`{name}` has reasons {sorted(map(str, values))}, `counts` has {sorted(counts)}"
    for reason, rows in first_rows.items():
        if not isinstance(rows, list) or len(rows) != min(counts[reason], SHOWN):
            return f"`first_rows` of {reason!r} must list the first {min(counts[reason], SHOWN)} origins"
        if not all(isinstance(row, str) for row in rows):
            return f"`first_rows` of {reason!r} holds something other than strings"
        if not isinstance(messages[reason], str):
            return f"`first_messages` of {reason!r} is a {type(messages[reason]).__name__}, not a str"
    return None


def _stats_of(state: dict) -> StreamStats:
    readers = Readers.from_config({"sharding": "rows", **state["config"]})  # before version 4: by row index
    position = 0 if state["source"] is None else int(state["source"]["position"])
    counter = SkipCounter()
    counter.load_state_dict(state.get("skipped"))
    return counter.stats(readers.rows_owned(position))


def _packer_states(state: Any) -> Iterator[dict]:
    """Every `StreamingPacker` state inside `state` (itself, or nested in a DataLoader's state), in key order."""
    if not isinstance(state, dict):
        return
    if "config" in state and "bins" in state and "pending" in state:
        yield state
        return
    for key in sorted(state, key=str):
        yield from _packer_states(state[key])
