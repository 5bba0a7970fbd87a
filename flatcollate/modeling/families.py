"""Which model families the `flatcollate` backend can make exact, and why the others cannot be.

A family is exact when its attention layers dispatch through transformers' attention interface and hand the forward's
keyword arguments (`cu_seq_lens_*`, `position_ids`) down to it: the backend then keeps sequences apart itself, whatever
the family's mask builder does. A family whose layers do not dispatch (falcon, bloom, mpt) keeps its own backend and
gets its mask builders patched (`mask_patch`). A family whose state-space, linear-attention or short-convolution
layers carry state along the row gets those layers run once per sequence (`stateful_layers.SEGMENTED_MIXERS`). The
families below break exactness for a reason none of these can fix.
"""

from transformers import PreTrainedModel

from .heads import head_reason

_ROW_WIDE_CONV_MASK = (
    "its short-convolution and attention layers share a `conv_mask` over the whole row; running the convolutions "
    "once per sequence is not enough (measured)"
)

UNSUPPORTED_FAMILIES: dict[str, str] = {
    "bamba": "its Mamba layers need the mamba-ssm kernels to honour `seq_idx`",
    "granitemoehybrid": "its Mamba layers need the mamba-ssm kernels to honour `seq_idx`",
    "zamba2": "its Mamba layers need the mamba-ssm kernels to honour `seq_idx`",
    "lfm2_moe": "its short-convolution layers mix neighbouring tokens across sequence boundaries",
    "recurrent_gemma": "its recurrent layers carry state across sequence boundaries",
    "rwkv": "its recurrent layers carry state across sequence boundaries",
    "xlstm": "its recurrent layers carry state across sequence boundaries",
    "inkling_text": _ROW_WIDE_CONV_MASK,
    "inkling2_text": _ROW_WIDE_CONV_MASK,
    "zaya": "its recurrent layers carry state across sequence boundaries",
    "openai-gpt": "its attention applies a fixed causal bias over the whole row, outside the attention interface",
    "xlm": "it builds its own masks from lengths over the whole row, outside the attention interface",
    "trocr": "it derives positions from `input_ids` (ignoring `position_ids`) and masks the whole row",
    "cpmant": "its attention adds a position bias and segment mask over the whole row",
    "deepseek_v4": (
        "its compressed-attention layers summarise every `compress_rate` tokens of the row into extra keys, across "
        "sequence boundaries (measured with a sequence longer than its sliding window)"
    ),
}
"""`model_type` -> why flattened batches cannot be exact for it."""


def unsupported_reason(model: PreTrainedModel) -> str | None:
    """Why `model` cannot run flattened batches exactly with the `flatcollate` backend, or None when it can.

    Args:
        model (`PreTrainedModel`): the model to inspect (its config and attention layers).
    """
    config = model.config
    model_type = getattr(config, "model_type", "")
    if model_type in UNSUPPORTED_FAMILIES:
        return UNSUPPORTED_FAMILIES[model_type]
    text_type = getattr(config.get_text_config(), "model_type", "") if hasattr(config, "get_text_config") else ""
    if text_type in UNSUPPORTED_FAMILIES:  # an image-text model built on a family that cannot be exact
        return f"its language model ({text_type}): {UNSUPPORTED_FAMILIES[text_type]}"
    if getattr(config, "is_encoder_decoder", False):
        return "it is an encoder-decoder model; flattening applies to decoder-only causal LMs"
    if not getattr(config, "is_causal", True):
        return "it is configured for bidirectional attention (`is_causal=False`)"
    return head_reason(model)


KEEP_OWN_BACKEND: dict[str, str] = {
    "doge": "its attention adds a learned dynamic mask, which the packed kernels cannot apply",
    "mistral_large4": "its sparse-attention indexer reads the attention mask, which the packed backend does not build",
}
"""`model_type` -> why it keeps transformers' backend (exact there with restarting `position_ids`)."""


def takes_packed_backend(model: PreTrainedModel) -> bool:
    """Whether `model`'s attention layers dispatch through transformers' attention interface (so `flatcollate` can
    be selected); the others stay on their own backend with `patch_mask_builders`."""
    return model.config.model_type not in KEEP_OWN_BACKEND and model._can_set_attn_implementation()


ROW_LENGTH_LIMITS: dict[str, tuple[str, str]] = {
    "mpt": ("max_seq_len", "its ALiBi attention bias"),
    "gpt_neo": ("max_position_embeddings", "its local-attention bias"),
    "big_bird": ("max_position_embeddings", "its token-type buffer"),
    "roformer": ("max_position_embeddings", "its sinusoidal position table, read by row position"),
}
"""`model_type` -> (config attribute, what it sizes): buffers built for at most that many tokens per ROW, not per
sequence. Restarting positions do not help them, so a flattened row must fit (measured: every other exact family
runs a row longer than its position limit)."""


def row_length_limit(model: PreTrainedModel) -> tuple[str, int, str] | None:
    """`(config attribute, tokens, what it sizes)` when `model` cannot run rows longer than a config value."""
    entry = ROW_LENGTH_LIMITS.get(getattr(model.config, "model_type", ""))
    if entry is None:
        return None
    key, what = entry
    limit = getattr(model.config, key, None)
    return (key, int(limit), what) if isinstance(limit, int) else None
