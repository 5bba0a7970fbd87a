"""The `flatcollate` attention backend: packed attention selected by `attn_implementation="flatcollate"`.

It reads the boundaries a flattening collator emits (`cu_seq_lens_q/k`, `max_length_q/k`), or derives them once from
`position_ids`, and runs the best kernel available, chosen per call from capabilities detected at import:

    kernel          needs                                          trains
    flash_attn      flash-attn installed, CUDA, fp16/bf16, D <= 256  yes
    torch_varlen    torch varlen_attn, CUDA, fp16/bf16, no softcap   yes (no dropout)
    flex            flex_attention, CUDA, no dropout                 yes (CPU: forward only)
    sdpa            anything (the only one with attention sinks)     yes

Its mask function builds no mask: boundaries travel as `cu_seq_lens`, never as a dense `T x T` tensor.
"""

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from . import capabilities
from .kernels import KERNELS
from .packed_segments import segments_from_kwargs

ATTN_IMPLEMENTATION = "flatcollate"
"""Name to pass as `attn_implementation=` (or to `model.set_attn_implementation`)."""

_HALF = (torch.float16, torch.bfloat16)


def select_kernel(query: torch.Tensor, *, softcap: float | None, dropout: float, sinks: bool = False) -> str:
    """Name of the kernel `auto` runs for these inputs (see the table in this module's docstring).

    Args:
        query (`torch.Tensor` of shape `(T, Hq, D)`): the query in varlen layout; its device, dtype and head size
            decide.
        softcap (`float`, *optional*): attention logit soft-capping.
        dropout (`float`): attention dropout probability.
        sinks (`bool`): the layer has attention sinks (only the `sdpa` kernel computes them).
    """
    if sinks:
        return "sdpa"
    on_cuda = capabilities.HAS_CUDA and capabilities.is_cuda_tensor(query)
    if on_cuda and query.dtype in _HALF:
        if capabilities.HAS_FLASH_ATTN and query.shape[-1] <= 256:
            return "flash_attn"
        if capabilities.HAS_TORCH_VARLEN and softcap is None and not dropout:
            return "torch_varlen"
    if on_cuda and capabilities.HAS_FLEX_ATTENTION and not dropout:
        return "flex"
    return "sdpa"


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
        backend (`str`): `"auto"` or one of `flash_attn`, `torch_varlen`, `flex`, `sdpa`.
        kwargs: `cu_seq_lens_q/k` (`(N + 1,)` int32), `max_length_q/k` (`int`) or `position_ids` (`(B, T)` int64),
            `sliding_window` (`int`), `softcap` (`float`), `s_aux` (`(Hq,)` attention sinks).

    Returns:
        `(torch.Tensor of shape (B, T, Hq, D), None)`, as transformers' attention functions return.
    """
    if attention_mask is not None:
        raise ValueError(
            "The flatcollate attention backend takes no `attention_mask`: a flattened batch has no padding and its "
            "boundaries come from `cu_seq_lens_q/k` or `position_ids`. Drop `attention_mask` from the batch."
        )
    if not kwargs.get("is_causal", getattr(module, "is_causal", True)):
        raise ValueError("The flatcollate attention backend is causal only; this layer asks for full attention.")
    batch, heads, length, head_dim = query.shape
    if key.shape[2] != length:
        raise ValueError(
            f"Query length {length} differs from key length {key.shape[2]}: the flatcollate backend runs training "
            "forwards without a cache. Call the model with `use_cache=False` and no `past_key_values`."
        )
    segments = segments_from_kwargs(kwargs, total_tokens=batch * length)
    softcap, sinks = kwargs.get("softcap"), kwargs.get("s_aux")
    window = kwargs.get("sliding_window")
    scale = head_dim**-0.5 if scaling is None else scaling
    q, k, v = (t.transpose(1, 2).reshape(batch * length, t.shape[1], t.shape[3]) for t in (query, key, value))
    name = select_kernel(q, softcap=softcap, dropout=dropout, sinks=sinks is not None) if backend == "auto" else backend
    if name not in KERNELS:
        raise ValueError(f"Unknown packed attention backend {name!r}; choose `auto` or one of {sorted(KERNELS)}.")
    out = KERNELS[name](q, k, v, segments, scale=scale, window=window, softcap=softcap, dropout=dropout, sinks=sinks)
    return out.reshape(batch, length, heads, value.shape[-1]), None


def no_mask(*, attention_mask: torch.Tensor | None = None, **kwargs) -> None:
    """Mask function of the `flatcollate` backend: no dense mask is ever built.

    A 2-D padding mask would be dropped here, so one with any zero raises instead (one check, only when a mask is
    passed).
    """
    if attention_mask is not None and attention_mask.ndim == 2 and not bool(attention_mask.all()):
        raise ValueError(
            "The flatcollate attention backend got an `attention_mask` with padding; it keeps sequences apart by "
            "`cu_seq_lens`/`position_ids`, not by masks. Flatten the batch (`flatcollate.DataCollatorWithFlattening`) "
            "and drop `attention_mask`, or use `attn_implementation='sdpa'` for padded batches."
        )
    return None


def register_packed_attention() -> str:
    """Register the `flatcollate` attention and mask functions with transformers (idempotent); returns the name."""
    AttentionInterface.register(ATTN_IMPLEMENTATION, packed_attention_forward)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, no_mask)
    return ATTN_IMPLEMENTATION


register_packed_attention()
