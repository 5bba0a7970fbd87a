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
    for name, value in {**TINY_SIZES, **overrides}.items():
        if name in overrides or (_defines(config, name) and _settable(config, name)):
            setattr(config, name, value)
    _fit_state_space_heads(config, overrides)
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
