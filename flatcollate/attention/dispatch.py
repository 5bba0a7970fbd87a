"""The `flatcollate` attention backend: packed attention selected by `attn_implementation="flatcollate"`.

It reads the boundaries a flattening collator emits (`cu_seq_lens_q/k`, `max_length_q/k`), or derives them once from
`position_ids`, and runs the fastest kernel that is installed and computes the layer, chosen per call
(`flatcollate.attention.selection`: flash-attn 4, 3, 2, a Hub kernel transformers loaded, PyTorch's `varlen_attn`,
`flex_attention`, SDPA, by device, dtype, head size, window, soft-cap, sinks and dropout).

For flattened (and ordinary unpadded) rows its mask function builds no mask: boundaries travel as `cu_seq_lens`,
never as a dense `T x T` tensor. Rows that are not flattened (padded batches, cached decoding in `generate()`) take
`padded_attention_forward`: what the unprepared model runs, with the padding mask transformers builds for SDPA.
"""

import sys

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from ..boundaries import Boundaries
from .bidirectional_blocks import BLOCKS_KEY, block_kernel
from .compiled_sdpa import compiled_sdpa_kernel
from .selection import KERNELS, forced_kernel, select_kernel

ATTN_IMPLEMENTATION = "flatcollate"
"""Name to pass as `attn_implementation=` (or to `model.set_attn_implementation`)."""

def packed_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    *,
    backend: str = "auto",
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Causal attention inside each sequence of a flattened batch, never across sequences.

    Args:
        module (`torch.nn.Module`): the attention layer (read for `is_causal`).
        query (`torch.Tensor` of shape `(B, Hq, T, D)`): usually `B == 1`; rows of a larger batch are read back to
            back, so the boundaries must cover all `B * T` tokens.
        key, value (`torch.Tensor` of shape `(B, Hkv, T, D)`): `Hq` a multiple of `Hkv`.
        attention_mask: must be `None` (the backend's mask function builds none); a mask means padding or a cache,
            which flattened rows do not have.
        scaling (`float`, *optional*): softmax scale, `D ** -0.5` by default.
        dropout (`float`): attention dropout probability.
        backend (`str`): `"auto"` or one of `flatcollate.attention.selection.KERNELS` (`flash_attn_4`,
            `flash_attn_3`, `flash_attn_2`, `hub`, `torch_varlen`, `flex`, `sdpa`).
        kwargs: `cu_seq_lens_q/k` (`(N + 1,)` int32), `max_length_q/k` (`int`) or `position_ids` (`(B, T)` int64),
            `sliding_window` (`int`), `softcap` (`float`), `s_aux` (`(Hq,)` attention sinks).

    Returns:
        `(torch.Tensor of shape (B, T, Hq, D), None)`, as transformers' attention functions return.
    """
    batch, heads, length, head_dim = query.shape
    if attention_mask is not None or key.shape[2] != length:
        return padded_attention_forward(module, query, key, value, attention_mask, scaling, dropout, **kwargs)
    blocks = kwargs.get(BLOCKS_KEY)
    if blocks is None and not kwargs.get("is_causal", getattr(module, "is_causal", True)):
        raise ValueError("The flatcollate attention backend is causal only; this layer asks for full attention.")
    chunk = attention_chunk(module)
    softcap, sinks = kwargs.get("softcap"), kwargs.get("s_aux")
    window = kwargs.get("sliding_window")
    scale = head_dim**-0.5 if scaling is None else scaling
    q, k, v = (t.transpose(1, 2).reshape(batch * length, t.shape[1], t.shape[3]) for t in (query, key, value))
    if blocks is not None:  # image tokens attend to their own image both ways (Gemma 3): masked, per sequence
        boundaries = Boundaries.from_kwargs(kwargs, rows=batch, length=length, device=query.device)
        out = block_kernel(q, k, v, boundaries, blocks, scale=scale, window=window, softcap=softcap, dropout=dropout)
        return out.reshape(batch, length, heads, value.shape[-1]), None
    if backend != "auto" and backend not in KERNELS:
        raise ValueError(f"Unknown packed attention backend {backend!r}; choose `auto` or one of {sorted(KERNELS)}.")
    options = {"softcap": softcap, "dropout": dropout, "sinks": sinks is not None, "window": window, "scale": scale}
    options["value_head_dim"] = v.shape[-1]
    name = select_kernel(q, **options) if backend == "auto" else forced_kernel(backend, q, **options)
    if name == "sdpa" and torch.compiler.is_compiling():  # one opaque node: no graph break, no plan baked in
        options = {"scale": scale, "window": window, "softcap": softcap, "dropout": dropout, "sinks": sinks}
        if kwargs.get("position_ids") is None and kwargs.get("cu_seq_lens_q") is None:
            kwargs = {**kwargs, **Boundaries.from_kwargs(kwargs, rows=batch, length=length, device=q.device).kwargs()}
        out = compiled_sdpa_kernel(q, k, v, kwargs, chunk=chunk, **options)
        return out.reshape(batch, length, heads, value.shape[-1]), None
    boundaries = Boundaries.from_kwargs(kwargs, rows=batch, length=length, device=query.device)
    if chunk is not None:
        boundaries = boundaries.chunked(chunk)
    out = KERNELS[name](q, k, v, boundaries, scale=scale, window=window, softcap=softcap, dropout=dropout, sinks=sinks)
    return out.reshape(batch, length, heads, value.shape[-1]), None


def attention_chunk(module: torch.nn.Module) -> int | None:
    """Chunk size of a chunked-attention layer (`config.layer_types[layer_idx] == "chunked_attention"`, Llama 4);
    None for every other layer. transformers expresses chunking only through its masks, which this backend does not
    build for flattened rows, so the layer's type is read here."""
    config, index = getattr(module, "config", None), getattr(module, "layer_idx", None)
    layer_types = getattr(config, "layer_types", None)
    if index is None or not layer_types or index >= len(layer_types) or layer_types[index] != "chunked_attention":
        return None
    return getattr(config, "attention_chunk_size", None)


def padded_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Attention for rows that are not flattened: padded batches, and cached decoding (`generate()`).

    Runs what the unprepared model would: transformers' `sdpa` with the padding mask `packed_or_padded_mask` built,
    or, where SDPA cannot compute the layer (soft-capping, attention sinks), the family's own eager attention.

    Raises:
        `ValueError` for a flattened batch (`cu_seq_lens_*`) that also has a mask or a cache: its sequences would
        attend to each other.
    """
    if any(kwargs.get(name) is not None for name in ("cu_seq_lens_q", "cu_seq_lens_k")):
        raise ValueError(
            "The flatcollate attention backend got a flattened batch (`cu_seq_lens`) together with an attention mask "
            "or a cache; its sequences would attend to each other. Call the model with `use_cache=False` and no "
            "`attention_mask` (the flattening collators emit none)."
        )
    if kwargs.get("softcap") is None and kwargs.get("s_aux") is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    eager = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    if eager is None:
        raise ValueError(
            f"{type(module).__name__} uses soft-capping or attention sinks, which SDPA cannot compute, and its module "
            "has no `eager_attention_forward` to fall back to for padded batches; flatten the batch instead."
        )
    if attention_mask is not None and attention_mask.dtype == torch.bool:  # eager adds the mask to the scores
        additive = torch.zeros(attention_mask.shape, dtype=query.dtype, device=query.device)
        attention_mask = additive.masked_fill(~attention_mask, torch.finfo(query.dtype).min)
    return eager(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)


def packed_or_padded_mask(*, attention_mask: torch.Tensor | None = None, q_length: int, kv_length: int, **kwargs):
    """Mask function of the `flatcollate` backend: no mask for flattened or ordinary rows, SDPA's mask otherwise.

    A row without padding and without cached keys needs no mask: the backend keeps sequences apart by
    `cu_seq_lens`/`position_ids` and applies sliding windows itself, so no dense `T x T` tensor is ever built for
    training. Padded batches and cached decoding get the boolean mask transformers builds for SDPA.
    """
    if attention_mask is None and q_length == kv_length:
        return None
    return sdpa_mask(attention_mask=attention_mask, q_length=q_length, kv_length=kv_length, **kwargs)


def register_packed_attention() -> str:
    """Register the `flatcollate` attention and mask functions with transformers (idempotent); returns the name."""
    AttentionInterface.register(ATTN_IMPLEMENTATION, packed_attention_forward)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, packed_or_padded_mask)
    return ATTN_IMPLEMENTATION


register_packed_attention()
