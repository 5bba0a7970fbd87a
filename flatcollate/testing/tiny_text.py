"""Tiny random-weight models built from configs, for proofs, checks and CPU benchmarks (no hub download)."""

import copy
import difflib
import json
import os

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

from .._paths import expand_path
from .tiny_hybrids import hybrid_layout

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


def load_config(model: str | os.PathLike) -> PretrainedConfig:
    """The config of a `model_type` registered in transformers (`"llama"`) or of a local folder with a `config.json`,
    with its own sizes.

    >>> load_config("llama").hidden_size
    4096
    """
    path = expand_path(model)
    return AutoConfig.from_pretrained(path) if path.is_dir() else AutoConfig.for_model(str(model))


def tiny_config(model: str | os.PathLike | PretrainedConfig, **overrides) -> PretrainedConfig:
    """A shrunken copy of a model's config.

    Args:
        model: a `model_type` registered in transformers (`"llama"`), a local folder with a `config.json`, or a config.
        **overrides: attributes to set after shrinking, e.g. `num_hidden_layers=4`. As a config's own keyword
            arguments, they may name attributes the config does not define (`is_decoder`, read by the model where
            set); sizes are checked (`check_sizes`, `check_heads`), and `check_overrides` also refuses unknown names.

    Returns:
        `PretrainedConfig` with the sizes of `TINY_SIZES` for the attributes the config defines; per-layer lists
        (`layer_types`, ...) as long as the new depth (see `apply_overrides`), so the model saves and loads back;
        hybrids as a state-carrying layer, attention, another (`tiny_hybrids`) unless `overrides` set their layout.

    >>> cfg = tiny_config("llama", num_hidden_layers=3)
    >>> cfg.hidden_size, cfg.num_hidden_layers, cfg.num_key_value_heads
    (64, 3, 2)
    """
    if isinstance(model, PretrainedConfig):
        # A depth set on the object after it was built is fitted first: from_dict re-runs the config's own checks.
        config = model.__class__.from_dict(apply_overrides(copy.deepcopy(model)).to_dict())
    else:
        config = load_config(model)
    hidden, heads = ({**TINY_SIZES, **overrides}[key] for key in ("hidden_size", "num_attention_heads"))
    overrides = {**hybrid_layout(config.model_type, overrides, hidden_size=hidden, heads=heads), **overrides}
    check_sizes(config, overrides)
    depth = _per_layer_length(config)
    for name, value in {**TINY_SIZES, **TINY_FAMILY_SIZES, **overrides}.items():
        if name in overrides or (_defines(config, name) and _settable(config, name)):
            setattr(config, name, value)
    _fit_state_space_heads(config, overrides)
    _fit_per_layer_lists(config, depth, keep=set(overrides))
    _fit_nested(config)
    if isinstance(getattr(config, "pad_token_id", None), int) and config.pad_token_id >= config.vocab_size:
        config.pad_token_id = config.vocab_size - 1  # an id outside the shrunk vocabulary cannot index the embedding
    if getattr(config, "is_decoder", None) is False and "is_decoder" not in overrides:
        config.is_decoder = True  # encoder families (bert, roberta, ...) serve as causal LMs only as decoders
    check_heads(config, overrides)
    return config


def apply_overrides(config: PretrainedConfig, **overrides) -> PretrainedConfig:
    """Set config attributes in place, keeping per-layer lists as long as `num_hidden_layers`; returns `config`.

    The lists written for the config's depth (`layer_types`, `mlp_layer_types`, `no_rope_layers`, ... : every list
    attribute of that length) are cut to a smaller depth, or repeated from their start up to a larger one; lists of
    layer indices (`mlp_only_layers`, ...) drop the layers that are gone. Lists given in `overrides` are kept as given.

    >>> from transformers import Qwen2Config
    >>> config = Qwen2Config(num_hidden_layers=3, layer_types=["full_attention", "sliding_attention", "full_attention"])
    >>> apply_overrides(config, num_hidden_layers=2).layer_types
    ['full_attention', 'sliding_attention']
    """
    check_sizes(config, overrides)
    depth = _per_layer_length(config)
    for name, value in overrides.items():
        setattr(config, name, value)
    _fit_per_layer_lists(config, depth, keep=set(overrides))
    check_heads(config, overrides)
    return config


def check_overrides(config: PretrainedConfig, overrides: dict) -> None:
    """Raise `ValueError`, starting with the attribute, unless every key of `overrides` names an attribute of `config`
    (its own, its attribute map's or a property), then as `check_sizes`: for overrides a person typed, where a
    misspelt size must not pass as a new attribute.

    >>> check_overrides(load_config("llama"), {"hidden_sise": 64})
    Traceback (most recent call last):
    ...
    ValueError: hidden_sise: the llama config has no attribute 'hidden_sise'; did you mean hidden_size?
    """
    known = set(config.to_dict()) | set(config.attribute_map)
    for key in overrides:
        if key not in known and not hasattr(config, key):
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise ValueError(f"{key}: the {config.model_type} config has no attribute {key!r}{hint}")
    check_sizes(config, overrides)


def check_sizes(config: PretrainedConfig, overrides: dict) -> None:
    """Raise `ValueError`, starting with the attribute, where `overrides` would make an attribute that is a positive
    integer in `config` (a size) anything else."""
    for key, value in overrides.items():
        current = getattr(config, key, None)
        if _is_size(current) and not _is_size(value):
            raise ValueError(f"{key}={json.dumps(value)}: {key} is a positive integer (the config has {current}).")


def check_heads(config: PretrainedConfig, overrides: dict) -> None:
    """Raise `ValueError` when `overrides` leave head counts a model cannot be built with: query heads a multiple of
    the key/value heads, and `hidden_size` a multiple of the heads where the config derives the head size from it."""
    if not any("head" in key or key == "hidden_size" for key in overrides):
        return
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    if not (_is_size(heads) and _is_size(kv_heads)):
        return
    if heads % kv_heads:
        raise ValueError(
            f"num_attention_heads={heads} is not a multiple of num_key_value_heads={kv_heads}; pick heads that "
            f"divide (e.g. num_attention_heads={2 * kv_heads})."
        )
    hidden = getattr(config, "hidden_size", None)
    if getattr(config, "head_dim", None) is None and _is_size(hidden) and hidden % heads:
        raise ValueError(
            f"hidden_size={hidden} is not a multiple of num_attention_heads={heads}; pick a head count that divides "
            "it, or set head_dim."
        )


def _is_size(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


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
    torch.manual_seed(seed)
    attn_implementation = sdpa_or_eager(model_class) if attn_implementation == "sdpa" else attn_implementation
    built = AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation, dtype=dtype)
    return built.eval()


def sdpa_or_eager(model_class: type[PreTrainedModel]) -> str:
    """`"sdpa"`, or `"eager"` for a family without an SDPA path (Gemma 2's soft-capping, Mamba 2 with no attention).

    >>> from transformers import LlamaForCausalLM, Mamba2ForCausalLM
    >>> sdpa_or_eager(LlamaForCausalLM), sdpa_or_eager(Mamba2ForCausalLM)
    ('sdpa', 'eager')
    """
    return "sdpa" if model_class._supports_sdpa else "eager"


def _defines(config: PretrainedConfig, name: str) -> bool:
    """Whether the config (or its attribute map) has a non-None value for `name`."""
    return getattr(config, name, None) is not None


def _settable(config: PretrainedConfig, name: str) -> bool:
    """False for read-only properties (e.g. a `head_dim` computed from other sizes)."""
    attribute = getattr(type(config), config.attribute_map.get(name, name), None)
    return not (isinstance(attribute, property) and attribute.fset is None)


_STATE_SPACE_HEADS = {  # model_type: (heads, head size, expand, groups) of the config's Mamba-2 mixers
    "mamba2": ("num_heads", "head_dim", "expand", "n_groups"),
    "bamba": ("mamba_n_heads", "mamba_d_head", "mamba_expand", "mamba_n_groups"),
    "granitemoehybrid": ("mamba_n_heads", "mamba_d_head", "mamba_expand", "mamba_n_groups"),
    "zamba2": ("n_mamba_heads", "mamba_headdim", "mamba_expand", "mamba_ngroups"),
}


def _fit_state_space_heads(config: PretrainedConfig, overrides: dict) -> None:
    """Mamba-2 mixers tie `heads * head size` to `expand * hidden_size`; keep that true after shrinking (a head size
    that does not divide the new width becomes 16), with one group."""
    names = _STATE_SPACE_HEADS.get(config.model_type)
    if names is None or names[0] in overrides or not all(_defines(config, n) for n in names[:3]):
        return
    heads, size, expand, groups = names
    width = int(getattr(config, expand) * config.hidden_size)
    if getattr(config, size) > width or width % getattr(config, size):
        setattr(config, size, 16)
    setattr(config, heads, width // getattr(config, size))
    if _defines(config, groups):
        setattr(config, groups, 1)


def _per_layer_length(config: PretrainedConfig) -> int | None:
    """The depth the config's per-layer lists were written for: the length of `layer_types` where it is a list (a
    depth set on the config object after it was built leaves the lists behind), else `num_hidden_layers`."""
    layer_types = vars(config).get("layer_types")
    if isinstance(layer_types, list):
        return len(layer_types)
    layers = getattr(config, "num_hidden_layers", None)
    return layers if isinstance(layers, int) else None


NOT_PER_LAYER = ("architectures", "bos_token_id", "eos_token_id", "pad_token_id")
"""List attributes that may happen to be as long as the model is deep."""


def _fit_per_layer_lists(config: PretrainedConfig, depth: int | None, *, keep: set[str]) -> None:
    """Per-layer lists written for `depth` layers follow `num_hidden_layers`: cut, or repeated from their start;
    lists of layer indices drop the layers past the new depth. Attributes named in `keep` are left as they are."""
    layers = getattr(config, "num_hidden_layers", None)
    if not isinstance(depth, int) or not isinstance(layers, int) or layers == depth or depth < 1:
        return
    for name, value in list(vars(config).items()):
        if name in keep or name in NOT_PER_LAYER or not isinstance(value, list | tuple) or not _settable(config, name):
            continue
        if len(value) == depth:
            setattr(config, name, type(value)(value[i % depth] for i in range(layers)))
        elif _is_layer_index_list(name, value, depth):
            setattr(config, name, type(value)(index for index in value if index < layers))


def _is_layer_index_list(name: str, value: list | tuple, depth: int) -> bool:
    """`mlp_only_layers=[0, 3]`, `moe_layers`, `full_attn_idxs`, ...: a list of ints, each a layer of the model."""
    named = "layer" in name or name.endswith(("_idxs", "_indices"))
    return named and all(type(index) is int and 0 <= index < depth for index in value)


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
