"""Online bin packing with a bounded buffer: sequences arrive one by one, packs leave as soon as they are decided.

Open bins hold at most `buffer_size` sequences in total. An arriving sequence goes into an open bin it fits
(`greedy`: the oldest such bin, first fit; `best_fit`: the one it leaves with the least room, oldest on ties) or opens
a new bin. A bin leaves when it is exactly full; when the buffer overflows, the fullest bin leaves (oldest on ties).
At the end of the stream the open bins leave oldest first. Everything depends only on the arrival order, so a packer
rebuilt from `state_dict()` continues exactly as the original would have::

    pack_len 8, best_fit      arrivals: a(5) b(4) c(3) d(4)
    a -> [a a a a a . . .]
    b -> [a a a a a . . .] [b b b b . . . .]
    c -> [a a a a a c c c]  full, leaves
    d -> [b b b b d d d d]  full, leaves
"""

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from .._conventions import NP_IDS_DTYPE

Strategy = Literal["greedy", "best_fit"]
STRATEGY_CHOICES = ("greedy", "best_fit")


@dataclass(frozen=True)
class Item:
    """One sequence waiting in a bin: `example_id` is its row index in the source stream."""

    example_id: int
    input_ids: np.ndarray
    labels: np.ndarray


class OnlineBins:
    """The open bins of a streaming packer (see the module docstring for the rules).

    Args:
        pack_len (`int`): capacity of a pack in tokens.
        buffer_size (`int`): most sequences held in open bins at once.
        strategy (`"greedy"` or `"best_fit"`).

    >>> bins = OnlineBins(pack_len=8, buffer_size=4, strategy="best_fit")
    >>> items = [Item(i, np.zeros(n, np.int64), np.zeros(n, np.int64)) for i, n in enumerate([5, 4, 3, 4])]
    >>> [[item.example_id for item in pack] for item in items for pack in bins.add(item)]
    [[0, 2], [1, 3]]
    """

    def __init__(self, *, pack_len: int, buffer_size: int, strategy: Strategy):
        self.pack_len = pack_len
        self.buffer_size = buffer_size
        self.strategy = strategy
        self.bins: list[list[Item]] = []
        self.fills = np.zeros(0, dtype=np.int64)

    @property
    def num_items(self) -> int:
        return sum(len(b) for b in self.bins)

    def add(self, item: Item) -> list[list[Item]]:
        """Place one sequence (at most `pack_len` tokens); returns the packs that are now complete, in order."""
        length = item.input_ids.size
        assert 0 < length <= self.pack_len, "over-long sequences are handled before packing"
        index = self._choose(length)
        if index is None:
            self.bins.append([])
            self.fills = np.append(self.fills, 0)
            index = len(self.bins) - 1
        self.bins[index].append(item)
        self.fills[index] += length
        ready = [self._pop(index)] if self.fills[index] == self.pack_len else []
        while self.num_items > self.buffer_size:
            # argmax returns the first (oldest) of equally full bins.
            ready.append(self._pop(int(np.argmax(self.fills))))
        return ready

    def flush(self) -> list[list[Item]]:
        """All open bins, oldest first; the buffer is empty afterwards."""
        ready, self.bins, self.fills = self.bins, [], np.zeros(0, dtype=np.int64)
        return ready

    def _choose(self, length: int) -> int | None:
        room = self.pack_len - self.fills
        fits = room >= length
        if not fits.any():
            return None
        if self.strategy == "greedy":
            return int(np.argmax(fits))
        return int(np.argmin(np.where(fits, room, self.pack_len + 1)))

    def _pop(self, index: int) -> list[Item]:
        self.fills = np.delete(self.fills, index)
        return self.bins.pop(index)

    def state_dict(self) -> dict:
        return packs_to_state(self.bins)

    def load_state_dict(self, state: dict) -> None:
        self.bins = packs_from_state(state)
        self.fills = np.array([sum(item.input_ids.size for item in b) for b in self.bins], dtype=np.int64)


def packs_to_state(packs: list[list[Item]]) -> dict:
    """Packs of buffered sequences as flat int64 tensors (safe for `torch.load(weights_only=True)`)."""
    items = [item for pack in packs for item in pack]
    empty = np.zeros(0, dtype=NP_IDS_DTYPE)
    return {
        "pack_sizes": torch.tensor([len(pack) for pack in packs], dtype=torch.int64),
        "example_ids": torch.tensor([item.example_id for item in items], dtype=torch.int64),
        "lengths": torch.tensor([item.input_ids.size for item in items], dtype=torch.int64),
        "input_ids": torch.from_numpy(np.concatenate([item.input_ids for item in items] or [empty])),
        "labels": torch.from_numpy(np.concatenate([item.labels for item in items] or [empty])),
    }


def packs_from_state(state: dict) -> list[list[Item]]:
    """Inverse of `packs_to_state`."""
    cuts = np.cumsum(state["lengths"].numpy())[:-1]
    ids = np.split(state["input_ids"].numpy().astype(NP_IDS_DTYPE), cuts)
    labels = np.split(state["labels"].numpy().astype(NP_IDS_DTYPE), cuts)
    example_ids = state["example_ids"].tolist()
    # `np.split` of an empty buffer gives one empty piece; zip stops at the (empty) list of ids.
    items = [Item(e, i, lab) for e, i, lab in zip(example_ids, ids, labels, strict=False)]
    bounds = np.concatenate([[0], np.cumsum(state["pack_sizes"].numpy())]).astype(np.int64)
    return [items[start:stop] for start, stop in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True)]
