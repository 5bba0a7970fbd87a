"""Loading a `StatefulDataLoader.state_dict()` back, refusing another DataLoader worker count with a clear error.

Each DataLoader worker is a reader of its own part of the stream (`flatcollate.streaming.sharding`): its position,
buffered sequences and pending packs are in its own state, so a loader state only resumes under the worker count it
was saved with. The two layouts of a saved loader state (torchdata's)::

    num_workers=0    {"_num_yielded": ..., "dataset_state": <packer state>, ...}
    num_workers=N    {"_snapshot": {"_main_snapshot": {"_num_workers": N, ...},
                                    "_worker_snapshots": {"worker_0": {"dataset_state": <packer state>, ...},
                                                          ...}}, ...}

`StatefulDataLoader.load_state_dict()` accepts either and fails later, at the first `iter(loader)`, with a bare
`AssertionError` ("State doesn't contain key '_num_yielded' ...") when the layouts differ. `load_loader_state` checks
first and names both worker counts and the fix.
"""

from typing import Any

_SNAPSHOT, _MAIN_SNAPSHOT, _NUM_WORKERS = "_snapshot", "_main_snapshot", "_num_workers"
_NUM_YIELDED = "_num_yielded"  # only in the state of a loader without workers


def saved_num_workers(state: Any) -> int:
    """The `num_workers` of the `StatefulDataLoader` whose `state_dict()` is `state`.

    Raises `TypeError` / `ValueError` when `state` is not a `StatefulDataLoader.state_dict()`.
    """
    if not isinstance(state, dict):
        raise TypeError(
            f"Expected a state from `StatefulDataLoader.state_dict()` (a dict), got {type(state).__name__}."
        )
    if _SNAPSHOT in state:
        main = state[_SNAPSHOT].get(_MAIN_SNAPSHOT) if isinstance(state[_SNAPSHOT], dict) else None
        num_workers = main.get(_NUM_WORKERS) if isinstance(main, dict) else None
        if isinstance(num_workers, int) and num_workers > 0:
            return num_workers
        raise ValueError(
            f"The state has a `{_SNAPSHOT}` without a positive `{_MAIN_SNAPSHOT}.{_NUM_WORKERS}`: it is not a "
            "`StatefulDataLoader.state_dict()` of a loader with workers, or it is corrupted. Start from scratch "
            "without loading it."
        )
    if _NUM_YIELDED in state:
        return 0
    raise ValueError(
        f"The state has neither `{_SNAPSHOT}` (a loader with workers) nor `{_NUM_YIELDED}` (a loader without): it is "
        f"not a `StatefulDataLoader.state_dict()` (keys: {sorted(state)[:6]}). A `StreamingPacker.state_dict()` is "
        "loaded with `packer.load_state_dict()`, and only without DataLoader workers."
    )


def load_loader_state(loader: Any, state: Any) -> None:
    """`loader.load_state_dict(state)` after checking that `state` was saved with `loader.num_workers` workers.

    Args:
        loader (`torchdata.stateful_dataloader.StatefulDataLoader`): the loader to resume, built like the saved one.
        state (`dict`): what `StatefulDataLoader.state_dict()` returned, possibly through `torch.save` / `torch.load`.

    Raises `ValueError` naming both worker counts when they differ (torchdata would fail at the next `iter(loader)`
    with a bare `AssertionError`, or a worker with the packer's own refusal). Everything else (the packer's
    configuration, its data, a corrupted state) is checked by `StreamingPacker.load_state_dict` in every worker.
    """
    if not callable(getattr(loader, "load_state_dict", None)) or not hasattr(loader, "num_workers"):
        raise TypeError(
            f"Expected a `torchdata.stateful_dataloader.StatefulDataLoader`, got {type(loader).__name__}: a plain "
            "`torch.utils.data.DataLoader` has no state to resume; build a `StatefulDataLoader` with the same "
            "arguments."
        )
    saved = saved_num_workers(state)
    if saved != loader.num_workers:
        raise ValueError(
            f"Cannot resume: the DataLoader state was saved with num_workers={saved} but this StatefulDataLoader has "
            f"num_workers={loader.num_workers}. Each DataLoader worker reads its own part of the stream and keeps its "
            "own position and buffered sequences, so the state cannot move to another worker count. Build the "
            f"StatefulDataLoader with num_workers={saved} to resume it, or start from scratch without loading it."
        )
    loader.load_state_dict(state)
