"""Packed-attention kernels on the varlen layout: all sequences of a batch back to back.

Every kernel takes `query` of shape `(T, Hq, D)` and `key`/`value` of shape `(T, Hkv, D)` (`Hq` a multiple of `Hkv`:
GQA/MQA), the row's `PackedSegments`, and returns `(T, Hq, D)`. Attention is causal inside each sequence, never
across; `window` keeps the last `window` keys of each query, itself included (transformers' `sliding_window`);
`softcap` applies `softcap * tanh(scores / softcap)` before the softmax (Gemma 2).
"""

import itertools

import torch
import torch.nn.functional as F

from . import capabilities
from .segments import PackedSegments, host_boundaries


def flash_attn_kernel(query, key, value, segments: PackedSegments, *, scale, window, softcap, dropout):
    """flash-attn's `flash_attn_varlen_func` (CUDA, fp16/bf16), called by keyword: positional orders differ."""
    return capabilities.flash_attn_varlen_func(
        q=query,
        k=key,
        v=value,
        cu_seqlens_q=segments.cu_seqlens,
        cu_seqlens_k=segments.cu_seqlens,
        max_seqlen_q=segments.max_length,
        max_seqlen_k=segments.max_length,
        dropout_p=dropout,
        softmax_scale=scale,
        causal=True,
        window_size=(-1, -1) if window is None else (window - 1, 0),
        softcap=0.0 if softcap is None else softcap,
    )


def torch_varlen_kernel(query, key, value, segments: PackedSegments, *, scale, window, softcap, dropout):
    """PyTorch's `varlen_attn` (CUDA, fp16/bf16); no soft-capping and no dropout."""
    if softcap is not None or dropout:
        raise ValueError("`varlen_attn` supports neither `softcap` nor dropout; use the flex or sdpa packed backend.")
    return capabilities.varlen_attn(
        query,
        key,
        value,
        segments.cu_seqlens,
        segments.cu_seqlens,
        segments.max_length,
        segments.max_length,
        scale=scale,
        window_size=(-1, 0) if window is None else (window - 1, 0),
        enable_gqa=query.shape[1] != key.shape[1],
    )


def _document_ids(segments: PackedSegments, total: int) -> torch.Tensor:
    """`(T,)` int32: index of the sequence each token belongs to, without a loop over tokens."""
    lengths = segments.cu_seqlens.diff()
    ids = torch.arange(lengths.numel(), device=lengths.device, dtype=torch.int32)
    return torch.repeat_interleave(ids, lengths, output_size=total)


_BLOCK_MASKS: dict[str, tuple] = {}
_COMPILED_FLEX: dict[str, object] = {}


def _document_block_mask(segments: PackedSegments, total: int, window: int | None, device):
    """Block mask of causal attention inside each document, built once per boundaries tensor and window.

    Layers of one forward share the collator's `cu_seq_lens` object, so only the first layer (per window size)
    builds the mask; the entry holds that tensor, so a hit needs the very same object, unmodified.
    """
    from torch.nn.attention.flex_attention import create_block_mask

    cu = segments.cu_seqlens
    entry = _BLOCK_MASKS.get(str(window))
    if entry is not None and entry[0] is cu and entry[1] == cu._version and entry[2] == total:
        return entry[3]
    docs = _document_ids(segments, total)

    def document_causal(b, h, q_idx, kv_idx):
        keep = (docs[q_idx] == docs[kv_idx]) & (q_idx >= kv_idx)
        return keep if window is None else keep & (q_idx - kv_idx < window)

    block_mask = create_block_mask(document_causal, B=None, H=None, Q_LEN=total, KV_LEN=total, device=device)
    _BLOCK_MASKS[str(window)] = (cu, cu._version, total, block_mask)
    return block_mask


def _flex_attention(device_type: str):
    """`flex_attention`, compiled on CUDA (the unfused eager version materializes all scores)."""
    from torch.nn.attention.flex_attention import flex_attention

    if device_type != "cuda":
        return flex_attention
    if "cuda" not in _COMPILED_FLEX:
        _COMPILED_FLEX["cuda"] = torch.compile(flex_attention, dynamic=True)
    return _COMPILED_FLEX["cuda"]


def flex_kernel(query, key, value, segments: PackedSegments, *, scale, window, softcap, dropout):
    """`flex_attention` with a document block mask (trains on CUDA; on CPU only without grad)."""
    if dropout:
        raise ValueError("`flex_attention` has no dropout; set the model's attention dropout to 0 or use sdpa.")
    if query.device.type == "cpu" and torch.is_grad_enabled() and query.requires_grad:
        raise ValueError("`flex_attention` cannot train on CPU; use the `sdpa` packed kernel (the CPU default).")

    def soft_cap(score, b, h, q_idx, kv_idx):
        return softcap * torch.tanh(score / softcap)

    block_mask = _document_block_mask(segments, query.shape[0], window, query.device)
    out = _flex_attention(query.device.type)(
        query.transpose(0, 1).unsqueeze(0),
        key.transpose(0, 1).unsqueeze(0),
        value.transpose(0, 1).unsqueeze(0),
        score_mod=None if softcap is None else soft_cap,
        block_mask=block_mask,
        scale=scale,
        enable_gqa=query.shape[1] != key.shape[1],
    )
    return out.squeeze(0).transpose(0, 1)


def _band(length: int, window: int | None, device) -> torch.Tensor | None:
    """`(L, L)` bool: causal keys, limited to the last `window`; None where plain `is_causal` is the same mask."""
    if window is None or window >= length:
        return None
    rows = torch.arange(length, device=device)
    distance = rows[:, None] - rows[None, :]
    return (distance >= 0) & (distance < window)


def _math_attention(q, k, v, *, scale, window, softcap, dropout):
    """Plain softmax attention on one sequence, `(1, H, L, D)`, for what SDPA cannot do (soft-capping)."""
    scores = (q @ k.transpose(-1, -2)) * scale
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    length = q.shape[2]
    allowed = _band(length, window, q.device)
    if allowed is None:
        allowed = torch.ones(length, length, dtype=torch.bool, device=q.device).tril()
    scores = scores.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return F.dropout(probs, p=dropout, training=dropout > 0) @ v


def sdpa_kernel(query, key, value, segments: PackedSegments, *, scale, window, softcap, dropout):
    """SDPA on each sequence alone (`is_causal=True` on a slice): runs everywhere, trains, costs sum(L_i^2)."""
    groups = query.shape[1] // key.shape[1]
    if groups > 1 and softcap is not None:
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    bounds = host_boundaries(segments.cu_seqlens)
    if bounds[-1] != query.shape[0]:
        raise ValueError(
            f"`cu_seq_lens` covers {bounds[-1]} tokens but the row holds {query.shape[0]}; boundaries must come from "
            "the same batch (use the collator's `cu_seq_lens_q/k` unchanged)."
        )
    outputs = []
    # One attention call per sequence: slicing is what keeps sequences apart without a T x T mask.
    for start, end in itertools.pairwise(bounds):
        if end == start:
            continue
        q, k, v = (t[start:end].transpose(0, 1).unsqueeze(0) for t in (query, key, value))
        if softcap is not None:
            out = _math_attention(q, k, v, scale=scale, window=window, softcap=softcap, dropout=dropout)
        else:
            band = _band(end - start, window, q.device)
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=band, dropout_p=dropout, is_causal=band is None, scale=scale, enable_gqa=groups > 1
            )
        outputs.append(out.squeeze(0).transpose(0, 1))
    return torch.cat(outputs, dim=0)


KERNELS = {
    "flash_attn": flash_attn_kernel,
    "torch_varlen": torch_varlen_kernel,
    "flex": flex_kernel,
    "sdpa": sdpa_kernel,
}
"""Packed kernels by name, in the order `auto` prefers them."""
