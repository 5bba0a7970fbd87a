"""Family patch for mask builders that drop `position_ids`.

Many modeling files (falcon, bloom, mpt, opt, xglm, biogpt, ...) call `create_causal_mask(...)` without
`position_ids`, so transformers never sees that a row is flattened and builds one causal mask over all of it::

    position_ids   [0 1 2 | 0 1]        built mask      wanted mask
                                        x . . . .       x . . . .
                                        x x . . .       x x . . .
                                        x x x . .       x x x . .
                                        x x x x .       . . . x .
                                        x x x x x       . . . x x

The patch wraps the mask builders of that family's module (`PositionedMaskBuilder`): during a flattened forward of a
prepared model, a mask builder called for that model's config without `position_ids` gets positions restarting at the
forward's boundaries (read from the forward's slot, `flatcollate.boundaries.forward_slot`) and no model-made all-ones
mask, so transformers' own packed-sequence detection builds the wanted mask. Every other call is passed on untouched.
"""

import inspect
import sys
from collections.abc import Callable

from transformers import PreTrainedModel

from ..attention import ATTN_IMPLEMENTATION
from ..forward_slot import saved_slot

MASK_BUILDERS = ("create_causal_mask", "create_sliding_window_causal_mask", "create_chunked_causal_mask")


class PositionedMaskBuilder:
    """A mask builder of a modeling module, given the flattened forward's positions when its caller drops them.

    Args:
        original (`Callable`): the builder it wraps (`__wrapped__`).
    """

    def __init__(self, original: Callable):
        self.__wrapped__ = original
        self.__name__ = getattr(original, "__name__", type(self).__name__)
        self.signature = inspect.signature(original)

    def __call__(self, *args, **kwargs):
        config = kwargs.get("config", args[0] if args else None)
        if getattr(config, "_attn_implementation", None) == ATTN_IMPLEMENTATION:
            # The packed backend keeps sequences apart itself (and builds no mask): nothing to give, and nothing read
            # that `torch.compile` would have to trace (the slot is a `ContextVar`).
            return self.__wrapped__(*args, **kwargs)
        entry = saved_slot()
        if entry is None:  # not inside a flattened forward of a prepared model: untouched
            return self.__wrapped__(*args, **kwargs)
        model, boundaries = entry
        bound = self.signature.bind_partial(*args, **kwargs)
        given = bound.arguments
        config, embeds = given.get("config"), given.get("inputs_embeds")
        ours = config is model.config or config is model.config.get_text_config()
        dropped = given.get("position_ids") is None and given.get("past_key_values") is None
        if ours and dropped and embeds is not None and embeds.shape[0] * embeds.shape[1] == boundaries.total:
            # The guard refuses user masks on flattened rows, so a mask here was made by the model (all ones).
            given["position_ids"] = boundaries.position_ids().reshape(embeds.shape[0], embeds.shape[1])
            given["attention_mask"] = None
        return self.__wrapped__(*bound.args, **bound.kwargs)


def patch_mask_builders(model: PreTrainedModel) -> list[str]:
    """Wrap the mask builders of `model`'s modeling module (idempotent).

    Returns:
        Names of the mask builders wrapped in that module (empty when it uses none).
    """
    module = sys.modules[type(model).__module__]
    patched = []
    for name in MASK_BUILDERS:
        builder = getattr(module, name, None)
        if builder is None:
            continue
        if not isinstance(builder, PositionedMaskBuilder):
            setattr(module, name, PositionedMaskBuilder(builder))
        patched.append(name)
    return patched
