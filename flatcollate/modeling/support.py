"""Which model families the `flatcollate` backend can make exact, read from their records (`flatcollate.families`).

A family is exact when its attention layers dispatch through transformers' attention interface and hand the forward's
keyword arguments (`cu_seq_lens_*`, `position_ids`) down to it: the backend then keeps sequences apart itself, whatever
the family's mask builder does. A family whose layers do not dispatch (falcon, bloom, mpt) keeps its own backend and
gets its mask builders patched (`mask_patch`). A family whose state-space, linear-attention or short-convolution
layers carry state along the row gets those layers run once per sequence (`Family.mixers`). The families refused here
(`Family.unsupported`) break exactness for a reason none of these can fix.
"""

from transformers import PreTrainedModel

from ..families import family_of
from .heads import head_reason


def unsupported_reason(model: PreTrainedModel) -> str | None:
    """Why `model` cannot run flattened batches exactly with the `flatcollate` backend, or None when it can.

    Args:
        model (`PreTrainedModel`): the model to inspect (its config and attention layers).
    """
    config = model.config
    reason = family_of(getattr(config, "model_type", "")).unsupported
    if reason is not None:
        return reason
    text_type = getattr(config.get_text_config(), "model_type", "") if hasattr(config, "get_text_config") else ""
    if (reason := family_of(text_type).unsupported) is not None:  # an image-text model built on such a family
        return f"its language model ({text_type}): {reason}"
    if getattr(config, "is_encoder_decoder", False):
        return "it is an encoder-decoder model; flattening applies to decoder-only causal LMs"
    if not getattr(config, "is_causal", True):
        return "it is configured for bidirectional attention (`is_causal=False`)"
    return head_reason(model)


def takes_packed_backend(model: PreTrainedModel) -> bool:
    """Whether `model`'s attention layers dispatch through transformers' attention interface (so `flatcollate` can
    be selected); the others (`Family.own_backend`, or layers that ignore the interface) stay on their own backend
    with `patch_mask_builders`."""
    return family_of(model.config.model_type).own_backend is None and model._can_set_attn_implementation()


def row_length_limit(model: PreTrainedModel) -> tuple[str, int, str] | None:
    """`(config attribute, tokens, what it sizes)` when `model` cannot run rows longer than a config value
    (`Family.row_length_limit`), else None."""
    entry = family_of(getattr(model.config, "model_type", "")).row_length_limit
    if entry is None:
        return None
    key, what = entry
    limit = getattr(model.config, key, None)
    return (key, int(limit), what) if isinstance(limit, int) else None
