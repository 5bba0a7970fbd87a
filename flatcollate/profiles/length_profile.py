"""`LengthProfile`: a joint histogram of prompt and completion lengths, built from per-row lengths and sampled.

A profile is a joint 2-D histogram of `(prompt_length, completion_length)`. Bin edges grow geometrically, so short
lengths keep exact one-token bins while long tails share wide bins::

    prompt edges      0 1 2 ... 9 10 12 14 17 20 ... 5000 6007
    completion edges  0 1 2 ... 9 10 12 14 17 20 ...  560  649
    cells             [[prompt_bin, completion_bin], ...]  (K, 2) int, only non-empty cells
    counts            [rows in that cell, ...]             (K,) int

Sampling picks a cell in proportion to its count, then a length uniformly inside each bin. Named profiles and
profiles of your own data are read by `flatcollate.profiles.load_profile`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np

from .._paths import expand_path

GROWTH = 1.15
"""Ratio between consecutive bin edges above the exact one-token bins."""


@dataclass(frozen=True)
class LengthProfile:
    """Joint histogram of prompt and completion lengths.

    Args:
        name (`str`): where the profile came from.
        prompt_edges (`np.ndarray` of shape `(P + 1,)`, int64): increasing; bin `i` holds lengths in
            `[prompt_edges[i], prompt_edges[i + 1])`.
        completion_edges (`np.ndarray` of shape `(C + 1,)`, int64): same for completions.
        cells (`np.ndarray` of shape `(K, 2)`, int64): `(prompt_bin, completion_bin)` of every non-empty cell.
        counts (`np.ndarray` of shape `(K,)`, int64): rows in each cell, all positive.
        source (`str`): free text describing the data and tokenizer.
    """

    name: str
    prompt_edges: np.ndarray
    completion_edges: np.ndarray
    cells: np.ndarray
    counts: np.ndarray
    source: str = ""

    @classmethod
    def from_lengths(
        cls, prompt_lengths, completion_lengths, *, name: str, source: str = "", growth: float = GROWTH
    ) -> LengthProfile:
        """Bin per-row lengths into a profile.

        Args:
            prompt_lengths (array-like of shape `(N,)`, non-negative ints): tokens that are not trained on.
            completion_lengths (array-like of shape `(N,)`, non-negative ints): tokens that are trained on.
            name (`str`): profile name.
            source (`str`): description kept in the JSON.
            growth (`float`): ratio between consecutive wide bins (> 1).

        >>> p = LengthProfile.from_lengths([3, 5, 5], [1, 2, 2], name="toy")
        >>> p.counts.tolist(), p.num_rows
        ([1, 2], 3)
        """
        prompt = _as_lengths(prompt_lengths, field="prompt_lengths")
        completion = _as_lengths(completion_lengths, field="completion_lengths")
        if prompt.shape != completion.shape:
            raise ValueError(
                f"prompt_lengths has {prompt.size} rows but completion_lengths has {completion.size}; "
                "pass one prompt and one completion length per row."
            )
        if prompt.size == 0:
            raise ValueError(f"No rows to build the length profile {name!r} from; pass at least one row.")
        if (prompt + completion == 0).any():
            row = int(np.flatnonzero(prompt + completion == 0)[0])
            raise ValueError(f"Row {row} of {name!r} has no tokens at all (prompt 0, completion 0); drop empty rows.")
        prompt_edges = _geometric_edges(int(prompt.max()), growth)
        completion_edges = _geometric_edges(int(completion.max()), growth)
        p_bin = np.searchsorted(prompt_edges, prompt, side="right") - 1
        c_bin = np.searchsorted(completion_edges, completion, side="right") - 1
        flat = p_bin * (len(completion_edges) - 1) + c_bin
        keys, counts = np.unique(flat, return_counts=True)
        cells = np.stack(np.divmod(keys, len(completion_edges) - 1), axis=1)
        return cls(name, prompt_edges, completion_edges, cells.astype(np.int64), counts.astype(np.int64), source)

    @property
    def num_rows(self) -> int:
        """Rows the histogram was built from."""
        return int(self.counts.sum())

    def sample(self, n: int, *, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Draw `n` rows of lengths.

        Args:
            n (`int`): rows to draw.
            seed (`int`): seed of the generator; the same seed gives the same rows.

        Returns:
            `(prompt_lengths, completion_lengths)`, each `np.ndarray` of shape `(n,)`, int64; every row has at
            least one token.

        >>> p = LengthProfile.from_lengths([3, 5, 5], [1, 2, 2], name="toy")
        >>> prompt, completion = p.sample(4, seed=0)
        >>> prompt.shape, bool(((prompt == 3) | (prompt == 5)).all())
        ((4,), True)
        """
        if not isinstance(n, int | np.integer) or n < 0:
            raise ValueError(f"`n` must be a non-negative int, got {n!r}.")
        rng = np.random.default_rng(seed)
        cell = rng.choice(len(self.counts), size=n, p=self.counts / self.counts.sum())
        prompt = _uniform_in_bins(rng, self.prompt_edges, self.cells[cell, 0])
        completion = _uniform_in_bins(rng, self.completion_edges, self.cells[cell, 1])
        # Wide bins that start at 0 could draw an empty row; give it one completion token instead.
        completion[(prompt + completion) == 0] = 1
        return prompt, completion

    def to_dict(self) -> dict:
        """JSON-ready form read back by `load_profile`."""
        return {
            "format": "flatcollate.length_profile/1",
            "name": self.name,
            "source": self.source,
            "num_rows": self.num_rows,
            "prompt_edges": self.prompt_edges.tolist(),
            "completion_edges": self.completion_edges.tolist(),
            "cells": self.cells.tolist(),
            "counts": self.counts.tolist(),
        }

    def save(self, path: str | os.PathLike) -> None:
        """Write the profile as a compact JSON file."""
        expand_path(path).write_text(json.dumps(self.to_dict(), separators=(",", ":")) + "\n")


def _as_lengths(values, *, field: str) -> np.ndarray:
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"`{field}` must be 1-D, got shape {array.shape}.")
    if array.size and (array < 0).any():
        row = int(np.flatnonzero(array < 0)[0])
        raise ValueError(f"`{field}` row {row} is {array[row]}; lengths must be >= 0.")
    return array.astype(np.int64)


def _geometric_edges(max_value: int, growth: float) -> np.ndarray:
    """Edges 0, 1, 2, ... then growing by `growth`, ending just past `max_value` so it falls in the last bin."""
    if growth <= 1:
        raise ValueError(f"`growth` must be > 1, got {growth}.")
    steps = int(np.ceil(np.log(max(max_value, 2) + 1) / np.log(growth))) + 1
    edges = np.unique(np.round(growth ** np.arange(steps)).astype(np.int64))
    edges = np.concatenate([[0], edges[edges <= max_value], [max_value + 1]])
    return np.unique(edges)


def _uniform_in_bins(rng: np.random.Generator, edges: np.ndarray, bins: np.ndarray) -> np.ndarray:
    """One integer drawn uniformly from `[edges[b], edges[b + 1])` for every bin index `b`."""
    low, high = edges[bins], edges[bins + 1]
    return low + np.floor(rng.random(len(bins)) * (high - low)).astype(np.int64)
