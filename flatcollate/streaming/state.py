"""Checking a saved `StreamingPacker` state as a whole before resuming from it.

A state is accepted only if it was saved under this packer's configuration (same data, pack length, buffer, strategy,
readers) and describes a point this stream can reach. What is checked::

    config    every key present and equal (version first; the source by kind, size and content fingerprint; the
              sharding mode, so a state saved reading by shards is refused reading by row index and the other way)
    source    the source's own check (the reader's shards by shards): position an int in [0, row count] for sized
              sources, >= 0 otherwise
    bins      a packs state (below) of at most buffer_size sequences
    pending   a packs state
    skipped   rows `encode_fn` skipped (see `flatcollate.streaming.skips`): a count >= 1 per reason, at most as
              many in all as this reader read before the saved position, and the first origins and message per reason

    packs state   pack_sizes (P,)  example_ids (N,)  lengths (N,)  input_ids (T,)  labels (T,)   1-D int64 tensors
                  every pack non-empty, sum(pack_sizes) = N, 1 <= lengths <= pack_len, sum(lengths) = T,
                  every pack's tokens <= pack_len, ids >= 0,
                  example ids of rows read before the saved position and owned by this reader (congruent to it
                  modulo the readers; see `Readers.example_id`), non-decreasing inside a pack

Anything else raises `ValueError` that names what is wrong and says to start from scratch without loading it. A state
of version 2 (saved before skipped rows were counted, when no row could be skipped) is read as one with no skips;
states of versions 2 and 3 (saved before readers could read by shards) as states read by row index.
"""

from typing import Any

import numpy as np
import torch

from .sharding import Readers
from .skips import empty_skips, skips_problem
from .sources import RowSource

STATE_KEYS = ("config", "source", "bins", "pending", "skipped")
PACK_KEYS = ("pack_sizes", "example_ids", "lengths", "input_ids", "labels")


def check_state(state: Any, *, config: dict, source: RowSource) -> None:
    """Raise unless `state` can be resumed by a packer whose `_config()` is `config` and whose source is `source`.

    Args:
        state: what `StreamingPacker.state_dict()` returned, possibly through `torch.save` / `torch.load`.
        config (`dict`): the resuming packer's configuration (`pack_len`, `buffer_size`, reader layout...).
        source (`RowSource`): the resuming packer's source, which checks its own part of the state.
    """
    if not isinstance(state, dict) or "config" not in state:
        raise TypeError(f"Expected a state from `StreamingPacker.state_dict()`, got {type(state).__name__}.")
    for key in STATE_KEYS:
        if key not in state:
            raise _corrupt(f"the state has no `{key}`")
    for key in state:
        if key not in STATE_KEYS:
            raise _corrupt(f"the state has an unexpected key `{key}`")
    saved = state["config"]
    if not isinstance(saved, dict):
        raise _corrupt(f"its `config` is a {type(saved).__name__}, not a dict")
    for key in config:  # "version" first
        if key not in saved:
            raise _corrupt(f"its config has no `{key}`")
        if saved[key] != config[key]:
            raise _mismatch(key, saved[key], config[key])
    problem = None if state["source"] is None else source.check_state(state["source"])
    if problem is not None:
        raise _corrupt(problem)
    position = 0 if state["source"] is None else int(state["source"]["position"])
    readers = Readers.from_config(config)
    for name in ("bins", "pending"):
        problem = _packs_problem(state[name], pack_len=config["pack_len"], position=position, readers=readers)
        if problem is not None:
            raise _corrupt(f"`{name}`: {problem}")
    buffered = state["bins"]["lengths"].numel()
    if buffered > config["buffer_size"]:
        raise _corrupt(f"`bins` holds {buffered} sequences, more than buffer_size={config['buffer_size']}")
    problem = skips_problem(state["skipped"], num_rows=readers.rows_owned(position))
    if problem is not None:
        raise _corrupt(f"`skipped`: {problem}")


def upgrade_state(state: Any, *, version: int) -> Any:
    """An older state as the current `version`.

    Version 2 has no `skipped` (no row could be skipped then), so none were; versions 2 and 3 have no `sharding`
    (readers always split the stream by row index then), so it is `"rows"`. Anything else comes back unchanged, for
    `check_state` to judge.
    """
    config = state.get("config") if isinstance(state, dict) else None
    if not isinstance(config, dict) or config.get("version") not in (2, 3) or "sharding" in config:
        return state
    if config["version"] == 2:
        if "skipped" in state:
            return state
        state = {**state, "skipped": empty_skips()}
    return {**state, "config": {**config, "version": version, "sharding": "rows"}}


def _packs_problem(packs: Any, *, pack_len: int, position: int, readers: Readers) -> str | None:
    """What is wrong with a packs state (see the module docstring), or `None`."""
    if not isinstance(packs, dict):
        return f"expected a dict of tensors, got {type(packs).__name__}"
    for key in PACK_KEYS:
        if key not in packs:
            return f"no `{key}`"
        value = packs[key]
        if not isinstance(value, torch.Tensor):
            return f"`{key}` is a {type(value).__name__}, not a tensor"
        if value.dtype != torch.int64 or value.dim() != 1:
            return f"`{key}` must be a 1-D int64 tensor, got {value.dtype} of shape {tuple(value.shape)}"
    extra = sorted(set(packs) - set(PACK_KEYS))
    if extra:
        return f"unexpected key `{extra[0]}`"
    sizes, example_ids, lengths, input_ids, labels = (packs[key].numpy() for key in PACK_KEYS)
    if sizes.size and sizes.min() < 1:
        return f"`pack_sizes` holds {int(sizes.min())}; every pack holds at least one sequence"
    if int(sizes.sum()) != example_ids.size:
        return f"`pack_sizes` add up to {int(sizes.sum())} sequences but there are {example_ids.size} example ids"
    if lengths.size != example_ids.size:
        return f"{lengths.size} `lengths` for {example_ids.size} sequences"
    if lengths.size and lengths.min() < 1:
        return f"a sequence of {int(lengths.min())} tokens; every sequence holds at least one"
    if lengths.size and lengths.max() > pack_len:
        return f"a sequence of {int(lengths.max())} tokens is longer than pack_len={pack_len}"
    if input_ids.size != int(lengths.sum()):
        return f"`input_ids` holds {input_ids.size} tokens but `lengths` add up to {int(lengths.sum())}"
    if labels.size != input_ids.size:
        return f"`labels` holds {labels.size} entries but `input_ids` holds {input_ids.size}"
    if input_ids.size and input_ids.min() < 0:
        return f"`input_ids` holds a negative id ({int(input_ids.min())})"
    if sizes.size == 0:
        return None
    starts = np.cumsum(sizes) - sizes
    fills = np.add.reduceat(lengths, starts)
    if fills.max() > pack_len:
        index = int(np.argmax(fills > pack_len))
        return f"pack {index} holds {int(fills[index])} tokens, more than pack_len={pack_len}"
    # Ids of the reader's rows `0 .. position - 1`: below the id of its row `position`, congruent to it (sharding.py).
    unread = (example_ids < 0) | (example_ids >= readers.example_id(position))
    if unread.any():
        bad = int(example_ids[unread][0])
        return f"example id {bad} is not a row read before the saved source position {position}"
    reader, num_readers = readers.reader, readers.num_readers
    foreign = example_ids % num_readers != reader
    if foreign.any():
        bad = int(example_ids[foreign][0])
        return f"example id {bad} is not a row of this reader (reader {reader} of {num_readers})"
    inside = np.ones(max(example_ids.size - 1, 0), dtype=bool)
    inside[(starts[1:] - 1)] = False  # a step from one pack to the next may go down
    if (np.diff(example_ids)[inside] < 0).any():
        return "example ids decrease inside a pack; sequences enter a pack in stream order"
    return None


def _mismatch(key: str, saved: Any, current: Any) -> ValueError:
    hint = ""
    if key == "source":
        hint = (
            " The sources differ in kind, size or content fingerprint, so the state belongs to other data (a "
            "`datasets.Dataset` whose transforms `datasets` could not hash gets a new random fingerprint each run; "
            "save it with `save_to_disk` and load it back to keep one)."
        )
    if key == "sharding":
        hint = (
            f" Readers split the stream by {'source shards' if saved == 'shards' else 'row index'} when it was saved; "
            f'pass sharding="{saved}" to resume it.'
        )
    return ValueError(
        f"Cannot resume: the state was saved with {key}={saved!r} but this packer has {key}={current!r}.{hint} "
        "Resume with the configuration the state was saved with (same sources, pack_len, buffer_size, strategy, "
        "overlong, rank, world_size, DataLoader num_workers and sharding), or start from scratch without loading it."
    )


def _corrupt(problem: str) -> ValueError:
    return ValueError(
        f"Cannot resume: {problem}. The state is corrupted or was not saved by this packer; start from scratch "
        "without loading it."
    )
