"""What identifies a row source across runs, so that a resume state is only accepted for the data it was saved from.

- a map-style `datasets.Dataset`: its own `_fingerprint`, which changes with every transform (`shuffle(seed=1)` and
  `shuffle(seed=2)` differ) and is the same when the same data is loaded or built again. A transform that `datasets`
  cannot hash gives a random fingerprint (`datasets` warns about it); such a dataset is refused on resume.
- any other random-access source (a list of rows): a hash of its length and of up to `SAMPLED_ROWS` rows spread evenly
  over it. Cheap, and it catches reordered or other data; an edit confined to rows that are not sampled goes unseen.
- a `datasets.IterableDataset`: a hash of its pipeline, the chain of example iterables (map, filter, interleave...)
  down to the arguments of its data sources: the file names, or the fingerprints of the shards of
  `Dataset.to_iterable_dataset()`. The functions of `map` / `filter` are not compared.
"""

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

SAMPLED_ROWS = 8


def sequence_fingerprint(rows: Sequence) -> str:
    """Hex digest identifying a random-access source.

    >>> sequence_fingerprint([{"input_ids": [1, 2]}]) == sequence_fingerprint([{"input_ids": [1, 2]}])
    True
    >>> sequence_fingerprint([{"input_ids": [1, 2]}]) == sequence_fingerprint([{"input_ids": [2, 1]}])
    False
    """
    own = getattr(rows, "_fingerprint", None)
    if isinstance(own, str):
        return f"datasets:{own}"
    num_rows = len(rows)
    sampled = np.unique(np.linspace(0, num_rows - 1, num=min(num_rows, SAMPLED_ROWS)).round().astype(np.int64))
    return _digest([num_rows, *[[int(index), _stable(rows[int(index)])] for index in sampled]])


def iterable_dataset_fingerprint(dataset: Any) -> str:
    """Hex digest of a `datasets.IterableDataset`'s pipeline and data sources (see the module docstring)."""
    own = getattr(dataset, "_fingerprint", None)
    if isinstance(own, str):
        return f"datasets:{own}"
    description, nodes = [], [dataset._ex_iterable]
    while nodes:  # depth first over the wrapped example iterables
        node = nodes.pop()
        children = [node.ex_iterable] if hasattr(node, "ex_iterable") else list(getattr(node, "ex_iterables", []))
        description.append(type(node).__name__)
        if not children:
            description.append(_stable(getattr(node, "kwargs", None)))
        nodes += children[::-1]
    return _digest(description)


def has_shuffle_buffer(dataset: Any) -> bool:
    """Whether a `datasets.IterableDataset` draws rows through a shuffle buffer anywhere in its pipeline."""
    from datasets.iterable_dataset import BufferShuffledExamplesIterable

    nodes = [dataset._ex_iterable]
    while nodes:
        node = nodes.pop()
        if isinstance(node, BufferShuffledExamplesIterable):
            return True
        nodes += [node.ex_iterable] if hasattr(node, "ex_iterable") else list(getattr(node, "ex_iterables", []))
    return False


def _stable(value: Any) -> Any:
    """A plain structure that describes `value` the same way in every process (no memory addresses, no truncation).

    Objects that are neither plain values, containers, arrays nor datasets are described by their type name only.
    """
    if value is None or isinstance(value, bool | int | float | str | bytes):
        return value
    if isinstance(value, np.integer | np.floating):
        return value.item()
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    if isinstance(value, np.ndarray) and value.dtype == object:
        return ["list", *[_stable(item) for item in value.tolist()]]
    if isinstance(value, np.ndarray):
        return ["array", str(value.dtype), list(value.shape), hashlib.sha256(value.tobytes()).hexdigest()]
    if isinstance(getattr(value, "_fingerprint", None), str):
        return ["dataset", value._fingerprint]
    if isinstance(value, Mapping):
        return ["mapping", *[[str(key), _stable(item)] for key, item in value.items()]]
    if isinstance(value, list | tuple):
        return ["list", *[_stable(item) for item in value]]
    return ["object", type(value).__qualname__]


def _digest(description: Any) -> str:
    return hashlib.sha256(repr(description).encode()).hexdigest()[:32]
