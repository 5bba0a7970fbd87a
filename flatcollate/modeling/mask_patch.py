"""Family patch for mask builders that drop `position_ids`.

Many modeling files (falcon, bloom, mpt, opt, xglm, biogpt, ...) call `create_causal_mask(...)` without
`position_ids`, so transformers never sees that a row is flattened and builds one causal mask over all of it::

    position_ids   [0 1 2 | 0 1]        built mask      wanted mask
                                        x . . . .       x . . . .
                                        x x . . .       x x . . .
                                        x x x . .       x x x . .
                                        x x x x .       . . . x .
                                        x x x x x       . . . x x

The patch wraps the mask builders of that family's module: during a forward of a prepared model, a mask builder
called without `position_ids` gets the forward's `position_ids` (and no model-made all-ones mask), so transformers'
own packed-sequence detection builds the wanted mask. Models that were not prepared are untouched: the wrapper
only acts for a config whose forward is in flight.
"""

import functools
import sys

import torch
from transformers import PreTrainedModel

from .prepared_state import STATE_ATTRIBUTE, state_of

MASK_BUILDERS = ("create_causal_mask", "create_sliding_window_causal_mask", "create_chunked_causal_mask")

# id(config) -> position_ids of the forward in flight for a prepared model with that config.
_IN_FLIGHT: dict[int, torch.Tensor] = {}


def _wrap(original):
    @functools.wraps(original)
    def with_positions(*args, **kwargs):
        config = kwargs.get("config", args[0] if args else None)
        position_ids = _IN_FLIGHT.get(id(config))
        if position_ids is not None and kwargs.get("position_ids") is None and kwargs.get("past_key_values") is None:
            # The guard refuses user masks on flattened rows, so a mask here was made by the model (all ones).
            kwargs = {**kwargs, "position_ids": position_ids, "attention_mask": None}
        return original(*args, **kwargs)

    setattr(with_positions, STATE_ATTRIBUTE, original)  # the builder it wraps
    return with_positions


def patch_mask_builders(model: PreTrainedModel) -> list[str]:
    """Wrap the mask builders of `model`'s modeling module and track its forwards (idempotent).

    Returns:
        Names of the mask builders wrapped in that module (empty when it uses none).
    """
    module = sys.modules[type(model).__module__]
    patched = []
    for name in MASK_BUILDERS:
        builder = getattr(module, name, None)
        if builder is None:
            continue
        if not hasattr(builder, STATE_ATTRIBUTE):
            setattr(module, name, _wrap(builder))
        patched.append(name)
    state = state_of(model, create=True)
    if patched and not state.mask_hooks:
        state.mask_hooks = (
            model.register_forward_pre_hook(_remember_positions, with_kwargs=True),
            model.register_forward_hook(_forget_positions, always_call=True),
        )
    return patched


def _remember_positions(model, args: tuple, kwargs: dict):
    position_ids = kwargs.get("position_ids")
    if kwargs.get("attention_mask") is not None or kwargs.get("past_key_values") is not None:
        position_ids = None  # a caller's own mask or cache wins; the guard has already refused flattened rows
    _IN_FLIGHT[id(model.config)] = position_ids
    return None


def _forget_positions(model, args, output):
    _IN_FLIGHT.pop(id(model.config), None)
    return None
