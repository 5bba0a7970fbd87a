"""`prepare_model_for_flattening`: the one call that makes a model safe for flattened batches."""

import warnings

from transformers import PreTrainedModel

from ..attention.dispatch import ATTN_IMPLEMENTATION, register_packed_attention
from .composite import isolate_vision_towers, per_sub_config
from .family_positions import add_family_positions
from .fused_loss import check_fused_loss, install_fused_loss
from .guard import install_guard
from .heads import add_label_warning
from .image_text import add_image_text
from .loss_kwargs import accept_loss_kwargs
from .mask_patch import patch_mask_builders
from .own_config import own_config, own_layer_configs
from .prepared_state import mark_in_force
from .prompt_learning import watch_prompt_learning
from .stateful_layers import segment_mixers
from .support import takes_packed_backend, unsupported_reason


def prepare_model_for_flattening(
    model: PreTrainedModel,
    *,
    attn_implementation: str | None = ATTN_IMPLEMENTATION,
    strict: bool = True,
    fused_loss: bool | str = False,
) -> PreTrainedModel:
    """Make `model` exact on flattened batches: no token attends across a sequence boundary.

    It selects the packed attention backend, runs layers that carry state along the row (Mamba, gated delta rule,
    short convolutions) once per sequence (`flatcollate.modeling.stateful_layers.segment_mixers`), refuses families
    that cannot be exact, and installs a guard on the model's forward. The guard raises when a flattened batch arrives
    with an `attention_mask`, `use_cache=True` or `past_key_values` (each silently makes sequences attend to each other
    in transformers' own backends), runs flattened batches without a cache when the config's default would build one,
    checks `position_ids` against `cu_seq_lens` (deriving them when missing), and lets every other call through.

    Every module that reads the backend from a config of its own (a decoder layer taken from another model) gets a
    copy of that config on the selected backend. PEFT's prompt-learning adapters (prompt tuning, P-tuning, prefix
    tuning) put their virtual tokens once per row, so a PEFT model of one around the prepared model refuses flattened
    batches (`flatcollate.modeling.prompt_learning`); LoRA is exact on them. A model whose class refuses loss
    arguments while its forward hands them to its loss (Qwen2-VL/2.5-VL/3-VL, GLM-4V) takes `num_items_in_batch`, so
    `Trainer`'s gradient accumulation weighs tokens, not micro-batches (`flatcollate.modeling.loss_kwargs`).

    The configuration is left as it was (`use_cache`, generation config), so a saved checkpoint is the unprepared
    model's: ordinary and padded batches, evaluation and cached `generate()` run as before.

    Args:
        model (`PreTrainedModel`): a decoder-only causal LM, or a PEFT model wrapping one (`get_peft_model(...)`,
            before or after this call); modified in place. The guard sits in the wrapped model's `forward`, which
            PEFT calls directly, so both orders are guarded.
        attn_implementation (`str`, *optional*): attention backend to select; `"flatcollate"` (default) is the packed
            backend of `flatcollate.attention`; `None` keeps the model's current one (e.g. `flash_attention_2`).
            A family whose layers do not dispatch through transformers' attention interface (falcon, bloom, mpt)
            keeps its own backend; on any backend other than `flatcollate`, mask builders that drop `position_ids`
            are patched to receive them, so transformers builds the block-diagonal mask.
        strict (`bool`): raise `ValueError` for a family that cannot be exact; with `False`, warn instead (the model
            then takes padded batches, and the guard refuses every flattened one).
        fused_loss (`bool` or `str`): compute the loss of a forward with labels from the final hidden states without
            `(T, V)` logits (`flatcollate.modeling.fused_loss`; it returns `logits=None`, and `return_logits=True`
            runs the full forward): True takes Cut Cross-Entropy or Liger on CUDA where installed and the chunked
            PyTorch path elsewhere; `"chunked"`, `"cce"` or `"liger"` names one.

    Returns:
        The same model (the PEFT wrapper where one was given), prepared.

    >>> from flatcollate.testing import tiny_causal_lm
    >>> model = prepare_model_for_flattening(tiny_causal_lm("llama"))
    >>> model.config.use_cache, model.config._attn_implementation
    (True, 'flatcollate')
    """
    wrapper = None
    if not isinstance(model, PreTrainedModel) and callable(getattr(model, "get_base_model", None)):
        wrapper, model = model, model.get_base_model()  # PEFT (LoRA, QLoRA): prepare the model it wraps
    if not isinstance(model, PreTrainedModel):
        raise TypeError(
            "Expected a transformers `PreTrainedModel` (or a PEFT model wrapping one), got "
            f"{type(wrapper or model).__name__}."
        )
    if fused_loss:
        check_fused_loss(model, fused_loss)  # refused before anything changes
    reason = unsupported_reason(model)
    if reason is not None:
        message = (
            f"Model family {model.config.model_type!r} ({type(model).__name__}) cannot run flattened batches exactly: "
            f"{reason}. Train it on padded batches instead."
        )
        if strict:
            raise ValueError(message + " Pass `strict=False` to prepare it anyway.")
        warnings.warn(message, stacklevel=2)
    if attn_implementation == ATTN_IMPLEMENTATION and not takes_packed_backend(model):
        attn_implementation = None  # its layers ignore the attention interface: keep its backend, patch its masks
    if attn_implementation is not None and reason is None:
        own_config(model, *([wrapper] if wrapper is not None else []))  # a model sharing the config stays as it was
        if attn_implementation == ATTN_IMPLEMENTATION:
            register_packed_attention()
        try:  # first, so that a backend that cannot be selected leaves the model as it was
            model.set_attn_implementation(per_sub_config(model, attn_implementation))
        except (ImportError, ValueError) as error:
            raise ValueError(
                f"Cannot select attn_implementation={attn_implementation!r} for {type(model).__name__}: "
                f"{str(error).splitlines()[0]} The model was left unchanged; pass the default "
                f"{ATTN_IMPLEMENTATION!r} (it uses flash-attn by itself where it is installed) or `None` to keep "
                "the current backend."
            ) from error
    backend = model.config.get_text_config()._attn_implementation
    if reason is None:
        own_layer_configs(model, backend)  # attention layers read their own config: all of them on `backend`
    patched = patch_mask_builders(model) if backend != ATTN_IMPLEMENTATION else []
    isolate_vision_towers(model)
    if fused_loss:
        install_fused_loss(model, fused_loss)  # before the guard, which then sits in front of it
    install_guard(model, unsupported=reason)  # then the features that add their checks and changes to it
    add_family_positions(model)
    add_label_warning(model)
    add_image_text(model)
    accept_loss_kwargs(model)  # gradient accumulation weighs tokens, not micro-batches (Qwen2-VL, GLM-4V, ...)
    watch_prompt_learning(wrapper)  # PEFT prompt learning, wrapped before or after, refuses flattened batches
    mark_in_force(model, tuple(patched))  # the guard checks both at every flattened forward
    if reason is None:
        segment_mixers(model)
    return model if wrapper is None else wrapper
