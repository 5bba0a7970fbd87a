"""What `prepare_model_for_flattening` leaves on a model, in one object, and the extension point features use.

A prepared model holds one `PreparedState` under `STATE_ATTRIBUTE`: the guard's handle and the facts it reads at
every forward (the forward's signature, the family's row-length limit, the backend and mask builders in force), and
the `Feature`s that add their checks and per-forward changes to a flattened batch. The guard knows only the core
(boundaries, positions, masks, caches); image-text positions and blocks, sequence parallelism, state-carrying layers
and family numberings register here, as transformers' `AttentionInterface` takes backends::

    guard:  arguments -> text positions (a feature may read them, e.g. the text row of 3-D positions)
                      -> Boundaries, built once (or by a feature: a sequence-parallel slice)
                      -> each feature's changes (3-D positions, image blocks, renumbered positions, mixers' rows)

No other object carries that attribute: per-forward data travels in the forward's keyword arguments and its slot
(`flatcollate.boundaries.forward_slot`), never on tensors, layers or functions.
"""

import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from .._conventions import STATE_ATTRIBUTE
from ..boundaries import Boundaries
from .mask_patch import PositionedMaskBuilder


@dataclass(frozen=True)
class FlatBatch:
    """A flattened batch as the guard hands it to features.

    Args:
        boundaries (`Boundaries`): where the batch's sequences start, built once for this forward.
        positions (`torch.Tensor` of shape `(B, T)`, int64): its text positions, checked against the boundaries (or
            derived from them).
        derived (`bool`): the positions were derived from the boundaries (numbered from 0), not given.
        sliced (`bool`): the batch is one rank's slice of a sequence-parallel row (the boundaries are the row's).
    """

    boundaries: Boundaries
    positions: torch.Tensor | None
    derived: bool = False
    sliced: bool = False


@dataclass(frozen=True)
class Feature:
    """What a part of flatcollate adds to the guard of a prepared model (`add_feature`).

    Args:
        name (`str`): what it is, for messages and to register it once.
        changes (`Callable`, *optional*): `(model, arguments, flat: FlatBatch | None) -> dict` of arguments to
            change; runs at every guarded forward, `flat` None for an ordinary batch. Raise to refuse a batch.
        text_positions (`Callable`, *optional*): `(model, arguments) -> (B, T) positions or None`, where a family's
            positions are not `position_ids` as given (the text row of 3-D rotary positions).
        boundaries (`Callable`, *optional*): `(model, arguments) -> FlatBatch`, in place of the core's check, where a
            batch's boundaries describe more than its tokens (a sequence-parallel slice).
    """

    name: str
    changes: Callable[[torch.nn.Module, dict, FlatBatch | None], dict] | None = None
    text_positions: Callable[[torch.nn.Module, dict], torch.Tensor | None] | None = None
    boundaries: Callable[[torch.nn.Module, dict], FlatBatch] | None = None


@dataclass(eq=False)
class PreparedState:
    """Everything `prepare_model_for_flattening` keeps on a model (`state_of(model)`).

    Args:
        guard: the `GuardHandle` (`handle.remove()` uninstalls the guard); None until it is installed.
        signature (`inspect.Signature`): the model's forward signature, to read arguments given by position.
        takes_kwargs, takes_use_cache (`bool`): whether its forward takes `**kwargs` / `use_cache`.
        unsupported (`str`, *optional*): why the family cannot be exact; every flattened batch is then refused.
        row_limit (`tuple`, *optional*): `(config key, tokens, what)` of a row-length buffer the family sizes.
        in_force (`tuple`, *optional*): `(backend, patched mask builders)`, checked at every flattened forward.
        features (`list[Feature]`): what the parts of flatcollate add to the guard.
        checked (`bool`): the current call was checked by the guard's pre-hook.
        tokens (`list`): one per forward in flight, to give the forward slot back its value when each ends.
        fused_loss (`FusedLoss`, *optional*): the fused-loss settings (`flatcollate.modeling.fused_loss`).
        warned_labels (`bool`): the warning on masked first labels was given.
    """

    guard: Any = None
    signature: inspect.Signature | None = None
    takes_kwargs: bool = False
    takes_use_cache: bool = False
    unsupported: str | None = None
    row_limit: tuple | None = None
    in_force: tuple | None = None
    features: list[Feature] = field(default_factory=list)
    checked: bool = False
    tokens: list = field(default_factory=list)
    fused_loss: Any = None
    warned_labels: bool = False


def state_of(model: torch.nn.Module, *, create: bool = False) -> PreparedState | None:
    """The `PreparedState` of `model` (made when `create`), or None when it has none."""
    state = vars(model).get(STATE_ATTRIBUTE)
    if not isinstance(state, PreparedState):
        if not create:
            return None
        state = PreparedState()
        vars(model)[STATE_ATTRIBUTE] = state
    return state


def add_feature(model: torch.nn.Module, feature: Feature) -> None:
    """Register `feature` with the guard of `model` (once per name; a second registration replaces the first)."""
    features = state_of(model, create=True).features
    features[:] = [known for known in features if known.name != feature.name] + [feature]


def mark_in_force(model: torch.nn.Module, patched: tuple[str, ...] = ()) -> None:
    """Record the attention backend now selected and the mask builders patched, for `check_in_force`; called at the
    end of preparing (and after a deliberate switch, such as the sequence-parallel backend)."""
    state_of(model, create=True).in_force = (model.config.get_text_config()._attn_implementation, tuple(patched))


def check_in_force(model: torch.nn.Module) -> None:
    """Raise unless what `prepare_model_for_flattening` set up still holds: the attention backend it selected (a later
    `set_attn_implementation` would un-prepare the model silently) and the mask builders it patched."""
    state = state_of(model)
    in_force = None if state is None else state.in_force
    if in_force is None:
        return
    backend, patched = in_force
    now = model.config.get_text_config()._attn_implementation
    if now != backend:
        raise ValueError(
            f"{type(model).__name__} was prepared with attn_implementation={backend!r} but now runs {now!r} "
            "(`set_attn_implementation` after preparing), which lets a flattened batch's sequences attend to each "
            "other. Call `prepare_model_for_flattening(model)` again after changing the backend."
        )
    elsewhere = layers_on_other_backends(model, backend)
    if elsewhere:
        named = ", ".join(f"{name} ({own!r})" for name, own in elsewhere[:4])
        raise ValueError(
            f"{type(model).__name__} was prepared with attn_implementation={backend!r}, but {len(elsewhere)} of its "
            f"modules read another backend from a config of their own: {named}. A layer taken from another model "
            "(depth up-scaling) or given another config after preparing would let a flattened batch's sequences "
            "attend to each other. Call `prepare_model_for_flattening(model)` again after changing layers: it gives "
            f"each such module a copy of its config on {backend!r}."
        )
    module = sys.modules[type(model).__module__]
    lost = [name for name in patched if not isinstance(getattr(module, name, None), PositionedMaskBuilder)]
    if lost:
        raise ValueError(
            f"{module.__name__}.{', '.join(lost)} is no longer the mask builder `prepare_model_for_flattening` patched "
            "(it was replaced afterwards), so a flattened batch would get one causal mask over all its sequences. "
            "Call `prepare_model_for_flattening(model)` again."
        )


def layers_on_other_backends(model: torch.nn.Module, backend: str) -> list[tuple[str, str]]:
    """`(module name, backend)` of every module whose own config is a language-model config (the class of
    `model.config.get_text_config()`) on another backend than `backend`: attention layers read the backend from
    their own config, not the top-level one. Vision towers hold configs of other classes and are left out."""
    text_config = type(model.config.get_text_config())

    def elsewhere(module: torch.nn.Module) -> bool:
        config = vars(module).get("config")
        return isinstance(config, text_config) and config._attn_implementation != backend

    if not any(elsewhere(module) for module in model.modules()):  # every flattened forward: no names built
        return []
    return [(name, module.config._attn_implementation) for name, module in model.named_modules() if elsewhere(module)]


def is_prepared(model: torch.nn.Module) -> bool:
    """Whether `model`, or the model a PEFT, DDP/FSDP (`.module`) or `torch.compile` (`._orig_mod`) wrapper holds,
    carries the guard `prepare_model_for_flattening` installs.

    >>> from flatcollate.testing import tiny_causal_lm
    >>> is_prepared(tiny_causal_lm("llama"))
    False
    """
    for _ in range(8):  # wrappers nest a few levels at most (compile of DDP of PEFT)
        state = state_of(model)
        if state is not None and state.guard is not None:
            return True
        if callable(getattr(model, "get_base_model", None)):
            inner = model.get_base_model()
        else:  # DDP/FSDP register the model as submodule `module`, torch.compile as `_orig_mod`
            submodules = vars(model).get("_modules", {})
            inner = submodules.get("module", submodules.get("_orig_mod"))
        if not isinstance(inner, torch.nn.Module) or inner is model:
            return False
        model = inner
    return False
