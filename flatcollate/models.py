"""Tiny random-weight models built from configs, for proofs, checks and CPU benchmarks (no hub download)."""

import os

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

# Sizes small enough for CPU tests while keeping GQA (4 query heads over 2 key/value heads) and several layers.
TINY_SIZES = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 256,
    "max_position_embeddings": 2048,
}

# Family-specific sizes, set only where a config defines them: mixture of experts, multi-head latent attention,
# partial rotary embeddings. They keep the tiny model small and consistent (experts per token <= experts).
TINY_FAMILY_SIZES = {
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 64,
    "num_experts": 4,
    "num_local_experts": 4,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "n_group": 1,
    "topk_group": 1,
    "kv_lora_rank": 16,
    "q_lora_rank": 16,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "v_head_dim": 16,
    "rotary_dim": 8,
}


def tiny_config(model: str | os.PathLike | PretrainedConfig, **overrides) -> PretrainedConfig:
    """A shrunken copy of a model's config.

    Args:
        model: a `model_type` registered in transformers (`"llama"`), a local folder with a `config.json`, or a config.
        **overrides: attributes to set after shrinking, e.g. `num_hidden_layers=4`.

    Returns:
        `PretrainedConfig` with the sizes of `TINY_SIZES` for the attributes the config defines.

    >>> cfg = tiny_config("llama", num_hidden_layers=3)
    >>> cfg.hidden_size, cfg.num_hidden_layers, cfg.num_key_value_heads
    (64, 3, 2)
    """
    if isinstance(model, PretrainedConfig):
        config = model.__class__.from_dict(model.to_dict())
    elif os.path.isdir(model):
        config = AutoConfig.from_pretrained(model)
    else:
        config = AutoConfig.for_model(str(model))
    layers = getattr(config, "num_hidden_layers", None)
    for name, value in {**TINY_SIZES, **TINY_FAMILY_SIZES, **overrides}.items():
        if name in overrides or (_defines(config, name) and _settable(config, name)):
            setattr(config, name, value)
    _fit_state_space_heads(config, overrides)
    _fit_per_layer_lists(config, layers)
    _fit_nested(config)
    if isinstance(getattr(config, "pad_token_id", None), int) and config.pad_token_id >= config.vocab_size:
        config.pad_token_id = config.vocab_size - 1  # an id outside the shrunk vocabulary cannot index the embedding
    if getattr(config, "is_decoder", None) is False and "is_decoder" not in overrides:
        config.is_decoder = True  # encoder families (bert, roberta, ...) serve as causal LMs only as decoders
    return config


def tiny_causal_lm(
    model: str | os.PathLike | PretrainedConfig,
    *,
    attn_implementation: str = "sdpa",
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    **overrides,
) -> PreTrainedModel:
    """A causal LM with random weights from `tiny_config(model, **overrides)`, in eval mode and fp32 by default.

    A family without an SDPA path gets `eager` when `sdpa` (the default) is asked for.

    >>> m = tiny_causal_lm("qwen2")
    >>> m.config.model_type, m.config._attn_implementation
    ('qwen2', 'sdpa')
    """
    config = tiny_config(model, **overrides)
    model_class = AutoModelForCausalLM._model_mapping[type(config)]
    if attn_implementation == "sdpa" and not model_class._supports_sdpa:
        attn_implementation = "eager"  # families without an SDPA path (e.g. Gemma 2's soft-capping) run eager
    torch.manual_seed(seed)
    built = AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation, dtype=dtype)
    return built.eval()


def _defines(config: PretrainedConfig, name: str) -> bool:
    """Whether the config (or its attribute map) has a non-None value for `name`."""
    return getattr(config, name, None) is not None


def _settable(config: PretrainedConfig, name: str) -> bool:
    """False for read-only properties (e.g. a `head_dim` computed from other sizes)."""
    attribute = getattr(type(config), config.attribute_map.get(name, name), None)
    return not (isinstance(attribute, property) and attribute.fset is None)


def _fit_state_space_heads(config: PretrainedConfig, overrides: dict) -> None:
    """Mamba-2 style configs tie `num_heads * head_dim` to `expand * hidden_size`; keep that true after shrinking."""
    if "num_heads" in overrides or not all(_defines(config, n) for n in ("expand", "head_dim", "num_heads")):
        return
    if config.model_type in ("mamba2",):
        config.num_heads = config.expand * config.hidden_size // config.head_dim
        if _defines(config, "n_groups"):
            config.n_groups = 1


def _fit_per_layer_lists(config: PretrainedConfig, original_layers: int | None) -> None:
    """Per-layer lists (`layer_types`, ...) sized for the original depth are cut to the shrunk one."""
    layers = getattr(config, "num_hidden_layers", None)
    if not isinstance(original_layers, int) or not isinstance(layers, int) or layers >= original_layers:
        return
    for name, value in list(vars(config).items()):
        if isinstance(value, list) and len(value) == original_layers:
            setattr(config, name, value[:layers])


def _fit_nested(config: PretrainedConfig) -> None:
    """Sizes kept in nested configs or tied across attributes (multi-head latent attention, DBRX), or left None."""
    if "head_dim" in vars(config) and config.head_dim is None:
        config.head_dim = TINY_SIZES["head_dim"]  # hidden_size / num_attention_heads of the tiny sizes
    if _defines(config, "n_routed_experts") and getattr(config, "num_experts_per_tok", 0) is None:
        config.num_experts_per_tok = TINY_FAMILY_SIZES["num_experts_per_tok"]
    if _defines(config, "qk_rope_head_dim") and _defines(config, "head_dim") and _settable(config, "head_dim"):
        config.head_dim = config.qk_rope_head_dim  # rotary embeddings act on the rope part of each head only
    if _defines(config, "kv_lora_rank") and _defines(config, "num_key_value_heads"):
        config.num_key_value_heads = config.num_attention_heads  # latent attention expands keys to every head
    if config.model_type == "dbrx":
        config.ffn_config.hidden_size = config.d_model
        config.ffn_config.ffn_hidden_size = TINY_SIZES["intermediate_size"]
        # DbrxAttention reads `attn_config.rope_theta`, which DbrxAttentionConfig does not define.
        config.attn_config.rope_theta = config.rope_parameters["rope_theta"]
        if config.attn_config.clip_qkv is None:
            config.attn_config.clip_qkv = 8.0  # the DBRX checkpoints clip at 8; its forward cannot run with None
