"""Which model families the `flatcollate` backend can make exact, and why the others cannot be.

A family is exact when its attention layers dispatch through transformers' attention interface and hand the forward's
keyword arguments (`cu_seq_lens_*`, `position_ids`) down to it: the backend then keeps sequences apart itself, whatever
the family's mask builder does. A family whose layers do not dispatch (falcon, bloom, mpt) keeps its own backend and
gets its mask builders patched (`mask_patch`). The families below break exactness for a reason neither can fix.
"""

from transformers import PreTrainedModel

UNSUPPORTED_FAMILIES: dict[str, str] = {
    "mamba": "its state-space layers carry state from one token to the next and take no sequence boundaries",
    "mamba2": "its state-space layers ignore `seq_idx`, so state flows from one sequence into the next",
    "falcon_mamba": "its state-space layers carry state across sequence boundaries",
    "bamba": "its Mamba layers need the mamba-ssm kernels to honour `seq_idx`",
    "falcon_h1": "its Mamba layers need the mamba-ssm kernels to honour `seq_idx`",
    "granitemoehybrid": "its Mamba layers need the mamba-ssm kernels to honour `seq_idx`",
    "nemotron_h": "its Mamba layers need the mamba-ssm kernels to honour `seq_idx`",
    "zamba": "its Mamba layers carry state across sequence boundaries",
    "zamba2": "its Mamba layers need the mamba-ssm kernels to honour `seq_idx`",
    "jamba": "its Mamba layers carry state across sequence boundaries",
    "qwen3_next": "its linear-attention layers need the fla kernels to honour `cu_seq_lens`",
    "qwen3_5": "its linear-attention layers need the fla kernels to honour `cu_seq_lens`",
    "qwen3_5_moe": "its linear-attention layers need the fla kernels to honour `cu_seq_lens`",
    "lfm2_moe": "its short-convolution layers mix neighbouring tokens across sequence boundaries",
    "recurrent_gemma": "its recurrent layers carry state across sequence boundaries",
    "rwkv": "its recurrent layers carry state across sequence boundaries",
    "xlstm": "its recurrent layers carry state across sequence boundaries",
    "qwen3_5_text": "its linear-attention layers need the fla kernels to honour `cu_seq_lens`",
    "qwen3_5_moe_text": "its linear-attention layers need the fla kernels to honour `cu_seq_lens`",
    "qwen4_exp_text": "its linear-attention layers need the fla kernels to honour `cu_seq_lens`",
    "olmo_hybrid": "its linear-attention layers need the fla kernels to honour `cu_seq_lens`",
    "kimi_linear": "its linear-attention layers carry state across sequence boundaries",
    "minimax": "its lightning (linear) attention layers carry state across sequence boundaries",
    "zaya": "its recurrent layers carry state across sequence boundaries",
    "lfm3": "its recurrent layers carry state across sequence boundaries",
    "inkling_text": "its recurrent layers carry state across sequence boundaries",
    "inkling2_text": "its recurrent layers carry state across sequence boundaries",
    "bailing_hybrid": "its linear-attention layers carry state across sequence boundaries (measured)",
    "openai-gpt": "its attention applies a fixed causal bias over the whole row, outside the attention interface",
    "xlm": "it builds its own masks from lengths over the whole row, outside the attention interface",
    "trocr": "it derives positions from `input_ids` (ignoring `position_ids`) and masks the whole row",
    "cpmant": "its attention adds a position bias and segment mask over the whole row",
    "qwen2_vl": "it takes 3-D rotary position ids of shape (3 or 4, B, T), not restarting 1-D positions",
    "qwen2_5_vl": "it takes 3-D rotary position ids of shape (3 or 4, B, T), not restarting 1-D positions",
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
    if getattr(config, "is_encoder_decoder", False):
        return "it is an encoder-decoder model; flattening applies to decoder-only causal LMs"
    if not getattr(config, "is_causal", True):
        return "it is configured for bidirectional attention (`is_causal=False`)"
    return None


KEEP_OWN_BACKEND: dict[str, str] = {
    "doge": "its attention adds a learned dynamic mask, which the packed kernels cannot apply",
}
"""`model_type` -> why it keeps transformers' backend (exact there with restarting `position_ids`)."""


def takes_packed_backend(model: PreTrainedModel) -> bool:
    """Whether `model`'s attention layers dispatch through transformers' attention interface (so `flatcollate` can
    be selected); the others stay on their own backend with `patch_mask_builders`."""
    return model.config.model_type not in KEEP_OWN_BACKEND and model._can_set_attn_implementation()
