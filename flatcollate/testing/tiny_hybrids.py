"""Layer layouts of tiny hybrid models: a state-carrying layer, an attention layer, then another, as released hybrids
interleave them (Zamba: two of each, its shared attention block being tied across its hybrid layers).

Shrunk to two layers, these families' default configs hold state-carrying layers only (their first layers), or none
(LFM2's default is all attention; LFM2-MoE's has no `layer_types`): a proof on such a model says nothing of what the
attention between two mixers does with the sequences. `tiny_config` lays them out as here.
"""

_BETWEEN = ("linear_attention", "full_attention", "linear_attention")
_CONVOLUTIONS_BETWEEN = ("conv", "full_attention", "conv")

TINY_HYBRID_LAYERS = {
    "bailing_hybrid": {"layer_types": _BETWEEN},
    "bamba": {"attn_layer_indices": (1,)},
    "granitemoehybrid": {"layer_types": _BETWEEN},
    "jamba": {"attn_layer_period": 3, "attn_layer_offset": 1},
    "kimi_linear": {"layer_types": _BETWEEN},
    "lfm2": {"layer_types": _CONVOLUTIONS_BETWEEN},
    "lfm2_moe": {"layer_types": _CONVOLUTIONS_BETWEEN},
    "lfm3": {"layer_types": _CONVOLUTIONS_BETWEEN},
    "olmo_hybrid": {"layer_types": _BETWEEN},
    "qwen3_5_moe_text": {"layer_types": _BETWEEN},
    "qwen3_5_text": {"layer_types": _BETWEEN},
    "qwen3_next": {"layer_types": _BETWEEN},
    "zamba": {  # two hybrid layers, their shared block tied across them (one alone does not build)
        "num_hidden_layers": 4,
        "layers_block_type": ("linear_attention", "hybrid", "linear_attention", "hybrid"),
    },
    "zamba2": {"layers_block_type": ("linear_attention", "hybrid", "linear_attention"), "hybrid_layer_ids": (1,)},
}
"""Per `model_type`, the config attributes that lay out three layers, or the depth given (`hybrid_layout`)."""

_SHARED_BLOCK_SIZES = {  # what the configs derive from the hidden size when built, and a shrunk copy keeps stale
    "zamba": lambda hidden, heads: {
        "attention_hidden_size": 2 * hidden,
        "attention_head_dim": 2 * hidden // heads,
        "mamba_dt_rank": -(-hidden // 16),
    },
    "zamba2": lambda hidden, heads: {
        "attention_hidden_size": 2 * hidden,
        "head_dim": 2 * hidden // heads,
        "num_query_groups": heads,
        "kv_channels": hidden // heads,
    },
}
"""Sizes of the attention block a hybrid shares across its layers, from the tiny model's hidden size and heads."""


def hybrid_layout(model_type: str, overrides: dict, *, hidden_size: int, heads: int) -> dict:
    """The attributes of a tiny hybrid for `model_type` (`num_hidden_layers`, 3 unless given, fresh lists, and the
    sizes of a shared attention block for `hidden_size` and `heads`), or `{}` where the family has no layout here or
    the caller sets the depth or any of its attributes (the caller's layout then).

    >>> hybrid_layout("qwen3_next", {}, hidden_size=64, heads=4)["layer_types"]
    ['linear_attention', 'full_attention', 'linear_attention']
    >>> hybrid_layout("zamba2", {}, hidden_size=128, heads=4)["attention_hidden_size"]
    256
    >>> hybrid_layout("qwen3_next", {"num_hidden_layers": 4}, hidden_size=64, heads=4)
    {}
    """
    layout = TINY_HYBRID_LAYERS.get(model_type, {})
    if not layout or {"num_hidden_layers", *layout} & set(overrides):
        return {}
    sizes = _SHARED_BLOCK_SIZES.get(model_type, lambda hidden, heads: {})(hidden_size, heads)
    return {"num_hidden_layers": 3, **{k: list(v) if isinstance(v, tuple) else v for k, v in layout.items()}, **sizes}
