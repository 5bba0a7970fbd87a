"""The one slot scoped to a forward, for layers that take no keyword arguments.

A prepared model's forward hands its `Boundaries` to attention layers in its keyword arguments. State-carrying mixers
and mask builders take none, so the guard also puts `(model, boundaries)` in this slot on entry and gives the slot back
its previous value on exit (a `ContextVar`: nested forwards and threads each see their own). A checkpointed layer's
recompute runs after the forward has ended; it restores the value its forward saw (`saved_slot`, `run_with_slot`)::

    guard entry   enter_forward(model, boundaries)   ->  layers: forward_slot(model) is boundaries
    guard exit    leave_forward(token)               ->  forward_slot() is None
    backward      run_with_slot(saved, recompute)    ->  the recompute sees its own forward's boundaries
"""

from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from .boundaries import Boundaries

_FORWARD: ContextVar[tuple[Any, Boundaries] | None] = ContextVar("flatcollate_forward", default=None)
"""The one slot scoped to a forward: `(model, its Boundaries)` while a prepared model runs a flattened batch."""


def forward_slot(model: Any = None) -> Boundaries | None:
    """The `Boundaries` of the flattened forward in flight (of `model` when given), or None: for layers that take no
    keyword arguments. The guard sets it on entry and clears it on exit (`enter_forward`, `leave_forward`); a
    checkpointed layer's recompute restores the value its forward saw."""
    entry = _FORWARD.get()
    if entry is None or (model is not None and entry[0] is not model):
        return None
    return entry[1]


def enter_forward(model: Any, boundaries: Boundaries | None):
    """Set the slot for one forward of `model` (None for an ordinary batch); returns the token `leave_forward` takes."""
    return _FORWARD.set(None if boundaries is None else (model, boundaries))


def leave_forward(token) -> None:
    """Give the slot back the value it had before `enter_forward`."""
    _FORWARD.reset(token)


def saved_slot():
    """The slot's value now, for a recompute to restore (`run_with_slot`)."""
    return _FORWARD.get()


def run_with_slot(saved, function: Callable, *args, **kwargs):
    """`function(*args, **kwargs)` with the slot as it was when `saved` was read (a checkpointed layer's recompute)."""
    token = _FORWARD.set(saved)
    try:
        return function(*args, **kwargs)
    finally:
        _FORWARD.reset(token)
