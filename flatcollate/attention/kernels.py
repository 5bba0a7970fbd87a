"""Packed-attention kernels of PyTorch on the varlen layout: all sequences of a batch back to back (`flex`, `sdpa`;
the varlen libraries are in `flatcollate.attention.varlen_kernels`).

Every kernel takes `query` of shape `(T, Hq, D)` and `key`/`value` of shape `(T, Hkv, D)` (`Hq` a multiple of `Hkv`:
GQA/MQA), the row's `Boundaries`, and returns `(T, Hq, D)`. Attention is causal inside each sequence, never
across; `window` keeps the last `window` keys of each query, itself included (transformers' `sliding_window`);
`softcap` applies `softcap * tanh(scores / softcap)` before the softmax (Gemma 2); `sinks` `(Hq,)` adds one learned
logit per head to every softmax (gpt-oss; `sdpa` kernel only).
"""

import torch
import torch.nn.functional as F

from ..boundaries import Boundaries
from . import capabilities
from .features import refuse_unless_computed
from .length_batches import FromSlots, ToSlots, group_plan

_COMPILED_FLEX: dict[str, object] = {}


def _document_block_mask(boundaries: Boundaries, total: int, window: int | None, device):
    """Block mask of causal attention inside each document, built once per boundaries, window and device (the
    layers of one forward share one `Boundaries`, so only the first layer per window size builds it)."""
    from torch.nn.attention.flex_attention import create_block_mask

    def build(boundaries: Boundaries):
        docs = boundaries.seq_idx.to(device)

        def document_causal(b, h, q_idx, kv_idx):
            keep = (docs[q_idx] == docs[kv_idx]) & (q_idx >= kv_idx)
            return keep if window is None else keep & (q_idx - kv_idx < window)

        return create_block_mask(document_causal, B=None, H=None, Q_LEN=total, KV_LEN=total, device=device)

    return boundaries.view(f"flex block mask {window} {total} @{torch.device(device)}", build)


def _flex_attention(device_type: str):
    """`flex_attention`, compiled on CUDA (the unfused eager version materializes all scores)."""
    from torch.nn.attention.flex_attention import flex_attention

    if device_type != "cuda":
        return flex_attention
    if "cuda" not in _COMPILED_FLEX:
        _COMPILED_FLEX["cuda"] = torch.compile(flex_attention, dynamic=True)
    return _COMPILED_FLEX["cuda"]


def flex_kernel_options(query: torch.Tensor, *, softcap: float | None, window: int | None) -> dict | None:
    """`kernel_options` of the flex call: FA4's CuTe kernels (`BACKEND="FLASH"`) where torch offers them and
    flash-attn-4 imports (`capabilities.HAS_FLEX_FLASH`) and they can train the layer, else torch's default (Triton).
    The FLASH lowering calls FA4: fp16/bf16, a backward on sm 90+ only, and no scalar captured by the compiled
    (`dynamic=True`) score or mask function, so no soft-cap and no window.

    >>> flex_kernel_options(torch.zeros(4, 2, 64), softcap=None, window=None) is None  # CPU
    True
    """
    if not (capabilities.HAS_FLEX_FLASH and capabilities.is_cuda_tensor(query)) or softcap or window is not None:
        return None
    half = query.dtype in (torch.float16, torch.bfloat16)
    return {"BACKEND": "FLASH"} if half and capabilities.compute_capability(query)[0] >= 9 else None


def flex_kernel(query, key, value, boundaries: Boundaries, *, scale, window, softcap, dropout, sinks=None):
    """`flex_attention` with a document block mask (trains on CUDA; on CPU only without grad)."""
    refuse_unless_computed("flex", dropout=dropout, softcap=softcap, sinks=sinks)
    if query.device.type == "cpu" and torch.is_grad_enabled() and query.requires_grad:
        raise ValueError("`flex_attention` cannot train on CPU; use the `sdpa` packed kernel (the CPU default).")

    def soft_cap(score, b, h, q_idx, kv_idx):
        return softcap * torch.tanh(score / softcap)

    block_mask = _document_block_mask(boundaries, query.shape[0], window, query.device)
    out = _flex_attention(query.device.type)(
        query.transpose(0, 1).unsqueeze(0),
        key.transpose(0, 1).unsqueeze(0),
        value.transpose(0, 1).unsqueeze(0),
        score_mod=None if softcap is None else soft_cap,
        block_mask=block_mask,
        scale=scale,
        enable_gqa=query.shape[1] != key.shape[1],
        kernel_options=flex_kernel_options(query, softcap=softcap, window=window),
    )
    return out.squeeze(0).transpose(0, 1)


def _band(length: int, window: int | None, device) -> torch.Tensor | None:
    """`(L, L)` bool: causal keys, limited to the last `window`; None where plain `is_causal` is the same mask."""
    if window is None or window >= length:
        return None
    rows = torch.arange(length, device=device)
    distance = rows[:, None] - rows[None, :]
    return (distance >= 0) & (distance < window)


def _math_attention(q, k, v, *, scale, window, softcap, dropout, sinks=None):
    """Plain softmax attention on `(G, H, L, D)` sequences, for what SDPA cannot do (soft-capping, sinks).

    `sinks` (`(H,)`): a learned logit per head that joins every softmax and takes no value (gpt-oss).
    """
    scores = (q @ k.transpose(-1, -2)) * scale
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    length = q.shape[2]
    allowed = _band(length, window, q.device)
    if allowed is None:
        allowed = torch.ones(length, length, dtype=torch.bool, device=q.device).tril()
    scores = scores.masked_fill(~allowed, float("-inf"))
    if sinks is not None:
        sink_column = sinks.to(scores.dtype).reshape(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        scores = torch.cat([scores, sink_column], dim=-1)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    if sinks is not None:
        probs = probs[..., :-1]
    return F.dropout(probs, p=dropout, training=dropout > 0) @ v


def sdpa_kernel(query, key, value, boundaries: Boundaries, *, scale, window, softcap, dropout, sinks=None):
    """SDPA on batches of similar-length sequences, each right-padded: runs everywhere and trains.

    Right padding needs no mask under causal attention: a real query only sees keys at or before itself, all real;
    padded rows are computed and dropped. So each batch is one `is_causal=True` call (a band mask for windows)::

        sequences [a a a a | b b b | c]   ->  batch 1: a a a a      batch 2: c
                                                      b b b .
    """
    total = query.shape[0]
    bounds = boundaries.host
    if bounds[-1] != total:
        raise ValueError(
            f"`cu_seq_lens` covers {bounds[-1]} tokens but the row holds {total}; boundaries must come from "
            "the same batch (use the collator's `cu_seq_lens_q/k` unchanged)."
        )
    groups = query.shape[1] // key.shape[1]
    math_path = softcap is not None or sinks is not None
    if groups > 1 and math_path:
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    plan = group_plan(boundaries)
    # A row already in batch order (equal lengths, one sequence) is read in place: gathers would only copy it.
    slots = [t if plan.in_place else ToSlots.apply(t, plan) for t in (query, key, value)]
    # Split, not sliced: the backward of a split is one concatenation, that of each slice a zero-filled row.
    sizes = [size * length for _, size, length in plan.batches]
    pieces = [t.split(sizes) if len(sizes) > 1 else (t,) for t in slots]
    outputs = []
    for (_, size, length), *qkv in zip(plan.batches, *pieces, strict=True):  # one call per group of similar lengths
        q, k, v = (t.view(size, length, *t.shape[1:]).transpose(1, 2) for t in qkv)
        if math_path:
            out = _math_attention(q, k, v, scale=scale, window=window, softcap=softcap, dropout=dropout, sinks=sinks)
        else:
            band = _band(length, window, q.device)
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=band, dropout_p=dropout, is_causal=band is None, scale=scale, enable_gqa=groups > 1
            )
        outputs.append(out.transpose(1, 2).reshape(size * length, out.shape[1], out.shape[-1]))
    out = torch.cat(outputs) if len(outputs) > 1 else outputs[0]
    return out if plan.in_place else FromSlots.apply(out, plan)
