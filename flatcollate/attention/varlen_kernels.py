"""Packed kernels that call a varlen attention library: flash-attn 2, 3 and 4, the Hub kernel transformers loaded,
and PyTorch's `varlen_attn`.

Each takes what every packed kernel takes (`flatcollate.attention.kernels`): `query` `(T, Hq, D)`, `key`/`value`
`(T, Hkv, D)`, the row's `Boundaries`, and returns `(T, Hq, D)`, causal inside each sequence. The libraries are
called by keyword (their positional orders differ: FA3's 8th argument is `seqused_q`, FA4's 4th is `qv`), with
`cu_seqlens` int32 and `max_seqlen` a Python int (a tensor costs FA4 a host sync per call). A kernel that cannot
compute a layer (dropout, soft-capping, sinks, a window its version lacks) raises `ValueError` naming the one that
can; `auto` never picks it for such a layer (`flatcollate.attention.selection`).

Windows: transformers' `sliding_window=w` keeps the query and the `w - 1` keys before it. FA2, FA3 and PyTorch spell
it `window_size=(w - 1, 0)` and "no window" `(-1, -1)`; FA4 spells "no window" `None` and reads `-1` literally.
"""

import functools

import torch

from ..boundaries import Boundaries
from . import capabilities
from .features import is_default_scale, refuse_unless_computed


def keys_before(window: int) -> int:
    """The kernels' `window_size[0]` for transformers' `sliding_window`: keys kept before the query, itself excluded.

    >>> keys_before(4)  # a window of 4 keeps the query and the 3 keys before it: window_size=(3, 0)
    3
    """
    return window - 1


def flash_window(window: int | None) -> tuple[int, int]:
    """`window_size` of FA2, FA3 and PyTorch's `varlen_attn` (with `causal=True` the right side is 0 anyway).

    >>> flash_window(None), flash_window(4)
    ((-1, -1), (3, 0))
    """
    return (-1, -1) if window is None else (keys_before(window), 0)


def _varlen_call(function, query, key, value, boundaries: Boundaries, scale: float) -> dict:
    """The keyword arguments FA2, FA3, FA4 and Hub kernels share, less `max_seqlen_q/k` where `function` has none
    (FA4 builds from 2025-08 to 2026-01-07)."""
    call = {
        "q": query,
        "k": key,
        "v": value,
        "cu_seqlens_q": boundaries.cu_seqlens,
        "cu_seqlens_k": boundaries.cu_seqlens,
        "max_seqlen_q": boundaries.max_length,
        "max_seqlen_k": boundaries.max_length,
        "softmax_scale": scale,
        "causal": True,
    }
    if capabilities.takes(function, "max_seqlen_q"):
        return call
    return {name: value for name, value in call.items() if not name.startswith("max_seqlen")}


def _output(result):
    """The attention output of a varlen call: FA4, vLLM's FA3 and FA3 builds before 2025-07-11 return `(out, lse)`."""
    return result[0] if isinstance(result, tuple) else result


def flash_attn_2_kernel(query, key, value, boundaries: Boundaries, *, scale, window, softcap, dropout, sinks=None):
    """flash-attn 2's `flash_attn_varlen_func` (CUDA, fp16/bf16, D <= 256): dropout and soft-capping, no sinks."""
    refuse_unless_computed("flash_attn_2", dropout=dropout, softcap=softcap, sinks=sinks)
    return capabilities.flash_attn_varlen_func(
        **_varlen_call(capabilities.flash_attn_varlen_func, query, key, value, boundaries, scale),
        dropout_p=dropout,
        window_size=flash_window(window),
        softcap=0.0 if softcap is None else softcap,
    )


def flash_attn_3_kernel(query, key, value, boundaries: Boundaries, *, scale, window, softcap, dropout, sinks=None):
    """flash-attn 3's `flash_attn_interface.flash_attn_varlen_func` (Hopper first; fp16/bf16, D <= 256, a multiple of
    8): soft-capping, no dropout, no sinks."""
    refuse_unless_computed("flash_attn_3", dropout=dropout, softcap=softcap, sinks=sinks)
    function = capabilities.flash_attn_3_varlen_func
    call = {**_varlen_call(function, query, key, value, boundaries, scale), "window_size": flash_window(window)}
    if softcap is not None:  # builds before 2025-01 have no `softcap` (and take no layer with one)
        call["softcap"] = softcap
    return _output(function(**call))


def flash_attn_4_kernel(query, key, value, boundaries: Boundaries, *, scale, window, softcap, dropout, sinks=None):
    """flash-attn 4's `flash_attn.cute.flash_attn_varlen_func` (Hopper and Blackwell, fp16/bf16): soft-capping and
    attention sinks (`learnable_sink`), no dropout. It returns `(out, lse)`; the output is kept."""
    refuse_unless_computed("flash_attn_4", dropout=dropout, softcap=softcap, sinks=sinks)
    out, _ = capabilities.flash_attn_4_varlen_func(
        **_varlen_call(capabilities.flash_attn_4_varlen_func, query, key, value, boundaries, scale),
        window_size=(None, 0) if window is None else (keys_before(window), 0),
        learnable_sink=sinks,
        softcap=0.0 if softcap is None else softcap,
    )
    return out


def hub_kernel(query, key, value, boundaries: Boundaries, *, scale, window, softcap, dropout, sinks=None):
    """The varlen function transformers loaded from the Hub (`capabilities.transformers_varlen`), called with the
    arguments its signature has: `dropout_p` (FA2 builds), `learnable_sink` (FA4 builds) or `s_aux` (vLLM's FA3) for
    sinks. Windows are passed as `(w - 1, 0)`, which every build reads alike under `causal=True`; no window as FA4's
    `(None, 0)` to an FA4 build (older ones read `-1` literally), else `(-1, -1)`."""
    resolved = capabilities.transformers_varlen()
    if resolved is None:
        raise ValueError("transformers has loaded no Hub attention kernel; use `backend='auto'`.")
    _, function = resolved
    refuse_unless_computed("hub", dropout=dropout, softcap=softcap, sinks=sinks)
    accepted = capabilities.parameters(function)
    call = {**_varlen_call(function, query, key, value, boundaries, scale), "window_size": flash_window(window)}
    if "learnable_sink" in accepted and window is None:  # FA4 builds before 2026-02-23 read -1 literally
        call["window_size"] = (None, 0)
    sink_name = next((n for n in ("learnable_sink", "s_aux") if n in accepted), None)
    if dropout:
        call["dropout_p"] = dropout
    if softcap is not None:
        call["softcap"] = softcap
    if sinks is not None:
        call[sink_name] = sinks
    return _output(function(**call))


@functools.lru_cache(maxsize=8)
def hub_backward_fault(function, device: torch.device, dtype: torch.dtype, head_dim: int) -> str | None:
    """Why the Hub kernel `function` cannot train, or None: its gradients on a tiny packed row (lengths 3 and 5, two
    heads) against SDPA run on each sequence alone in fp32, once per kernel, device, dtype and head dim. vLLM's FA3
    build (what transformers loads for `flash_attention_3` without a local FA3) returns 23 gradients for 25 inputs,
    so its first backward raises."""
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(8, 2, head_dim, generator=generator).to(device, dtype).requires_grad_() for _ in range(3))
    boundaries = Boundaries.from_lengths([3, 5], device=device)
    options = {"scale": head_dim**-0.5, "window": None, "softcap": None, "dropout": 0.0}
    try:
        out = hub_kernel(q, k, v, boundaries, **options)
        got = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    except RuntimeError as error:  # autograd refuses a backward that returns the wrong number of gradients
        return f"raises ({(str(error).splitlines() or [''])[0]})"
    fq, fk, fv = (t.detach().float().cpu().requires_grad_() for t in (q, k, v))  # the reference, on the host
    alone = [
        torch.nn.functional.scaled_dot_product_attention(
            *(t[a:b].transpose(0, 1) for t in (fq, fk, fv)), is_causal=True
        ).transpose(0, 1)
        for a, b in ((0, 3), (3, 8))
    ]
    expected = torch.autograd.grad(torch.cat(alone), (fq, fk, fv), torch.ones(8, 2, head_dim))
    tolerance = 1e-4 if dtype == torch.float32 else 5e-2
    gap = max(
        (g.float().cpu() - e).abs().max().item() / (1 + e.abs().max().item())
        for g, e in zip(got, expected, strict=True)
    )
    return None if gap <= tolerance else f"computes gradients off by {gap:.2g} (relative)"


def torch_varlen_kernel(query, key, value, boundaries: Boundaries, *, scale, window, softcap, dropout, sinks=None):
    """PyTorch's `varlen_attn` (CUDA, fp16/bf16), called as the installed version expects: 2.10 `is_causal=True`
    with the default scale and no windows; 2.11 `scale`, `window_size`; 2.12+ also `enable_gqa`. No soft-capping,
    dropout or sinks in any version."""
    refuse_unless_computed("torch_varlen", dropout=dropout, softcap=softcap, sinks=sinks)
    accepted = capabilities.parameters(capabilities.varlen_attn)
    options = {}
    if "window_size" in accepted:
        options["window_size"] = (-1, 0) if window is None else (keys_before(window), 0)
    elif window is not None:
        raise ValueError("This torch's `varlen_attn` has no `window_size` (torch >= 2.11); use `backend='auto'`.")
    else:
        options["is_causal"] = True
    if "scale" in accepted:
        options["scale"] = scale
    elif not is_default_scale(scale, query.shape[-1]):
        raise ValueError(f"This torch's `varlen_attn` has no `scale` (torch >= 2.11); the layer scales by {scale}.")
    if "enable_gqa" in accepted:
        options["enable_gqa"] = query.shape[1] != key.shape[1]
    cu = boundaries.cu_seqlens
    return capabilities.varlen_attn(query, key, value, cu, cu, boundaries.max_length, boundaries.max_length, **options)
