"""Which packed kernel runs a layer: the kernels by name, the order `auto` tries them in, and why each is passed over.

`auto` runs the first kernel of the order that is installed and computes the layer as asked; every kernel is exact,
so the order is about speed only. The order by device (`capabilities.compute_capability`)::

    Blackwell (sm 10+)   flash_attn_4  flash_attn_3  flash_attn_2  hub  torch_varlen  flex  sdpa
    Hopper (sm 9)        flash_attn_3  flash_attn_4  flash_attn_2  hub  torch_varlen  flex  sdpa
    Ampere, Ada (sm 8)   flash_attn_3  flash_attn_2                hub  torch_varlen  flex  sdpa
    older GPUs                                                                        flex  sdpa
    CPU                                                                                     sdpa

What a kernel needs besides being installed (`refusal` says it in words; D is the query's head dim, Dv the value's):

    kernel         dtype       head dim D                     dropout  soft-cap  sinks  window
    flash_attn_4   fp16/bf16   32-256, multiple of 32         no       yes       yes    yes
                               (sm 10+: <= 128 or 256)
    flash_attn_3   fp16/bf16   8-256, multiple of 8           no       yes       no     yes
    flash_attn_2   fp16/bf16   <= 256                         yes      yes       no     yes
    hub            fp16/bf16   <= 256                         as its signature says (dropout_p, softcap, sinks)
    torch_varlen   fp16/bf16   8-256, multiple of 8           no       no        no     torch >= 2.11 (and a
                                                                                        custom scale too)
    flex           any (CUDA)  any                            no       yes       no     yes
    sdpa           any         any                            yes      yes       yes    yes

and the limits of the real kernels that their signatures do not show (`_LIMITS`), each read from its source
(flash-attention at 0251105a) or measured:

    flash_attn_2   soft-capping with dropout refused ("Softcapping does not support dropout", `flash_api.cpp`); no
                   backward kernel for dropout at D 193-256 under 144 KB of shared memory per block (sm86, sm89,
                   sm120: `run_mha_bwd_hdim256`, nothing raised); Dv == D (`flash_api.cpp`)
    flash_attn_3   sm 8 and sm 9 only (`hopper/setup.py` builds sm_80 and sm_90a code); Dv != D on sm 9 only
    flash_attn_4   D a multiple of 32 (measured: the query gradient is wrong at other head dims); sm 10+:
                   (D, Dv) both <= 128, (192, 128) or (256, 256) (`flash_attn/cute/interface.py`); sm 10/11 at 256:
                   no soft-capping, sinks or window (the dedicated hd256 kernel); sm 12: no sinks (its kernel
                   refuses `learnable_sink`, and the sink backward covers sm90-sm110)
    hub            Dv == D; trains only where its backward matches SDPA on a tiny row, checked once
                   (`varlen_kernels.hub_backward_fault`: vLLM's FA3 build returns too few gradients)
    torch_varlen   Dv == D

`hub` is the varlen function transformers loaded from the Hub for `attn_implementation="kernels-community/..."`.
`flex` compiles `flex_attention` on CUDA and runs it on FA4's CuTe kernels (`BACKEND="FLASH"`) where torch offers
them and flash-attn-4 imports.
"""

import dataclasses

import torch

from . import capabilities
from .features import is_default_scale, lacking, wrong_gradients
from .kernels import flex_kernel, sdpa_kernel
from .varlen_kernels import (
    flash_attn_2_kernel,
    flash_attn_3_kernel,
    flash_attn_4_kernel,
    hub_backward_fault,
    hub_kernel,
    torch_varlen_kernel,
)

KERNELS = {
    "flash_attn_4": flash_attn_4_kernel,
    "flash_attn_3": flash_attn_3_kernel,
    "flash_attn_2": flash_attn_2_kernel,
    "hub": hub_kernel,
    "torch_varlen": torch_varlen_kernel,
    "flex": flex_kernel,
    "sdpa": sdpa_kernel,
}
"""Packed kernels by name (`packed_attention_forward(..., backend=name)` forces one)."""

HALF = (torch.float16, torch.bfloat16)
"""The dtypes of the varlen libraries."""

_INSTALLED = {
    "flash_attn_4": lambda: capabilities.flash_attn_4_varlen_func is not None,
    "flash_attn_3": lambda: capabilities.flash_attn_3_varlen_func is not None,
    "flash_attn_2": lambda: capabilities.flash_attn_varlen_func is not None,
    "hub": lambda: capabilities.transformers_varlen() is not None,
    "torch_varlen": lambda: capabilities.varlen_attn is not None,
    "flex": lambda: capabilities.HAS_FLEX_ATTENTION,
    "sdpa": lambda: True,
}


_FLASH_ORDER = {
    10: ("flash_attn_4", "flash_attn_3", "flash_attn_2"),
    9: ("flash_attn_3", "flash_attn_4", "flash_attn_2"),
    8: ("flash_attn_3", "flash_attn_2"),  # FA4 has no sm 8 backward
}


def kernel_order(major: int | None) -> tuple[str, ...]:
    """Kernels `auto` tries, fastest first, for a CUDA device of compute capability `major` (None: the CPU).

    >>> kernel_order(9)[:3], kernel_order(None)
    (('flash_attn_3', 'flash_attn_4', 'flash_attn_2'), ('sdpa',))
    """
    if major is None:
        return ("sdpa",)
    if major < 8:
        return ("flex", "sdpa")
    return (*_FLASH_ORDER[min(major, 10)], "hub", "torch_varlen", "flex", "sdpa")


@dataclasses.dataclass(frozen=True)
class _Layer:
    """What the limits of `_LIMITS` read of a layer: `query` `(T, H, D)` on its device, head dims of query and value,
    the device's compute capability major, and the features it asks for."""

    query: torch.Tensor
    head_dim: int
    value_head_dim: int
    major: int
    softcap: bool
    dropout: bool
    sinks: bool
    window: int | None


def _flash_attn_2_limit(layer: _Layer) -> str | None:
    if layer.softcap and layer.dropout:  # flash_api.cpp: "Softcapping does not support dropout for now"
        return "has no soft-capping together with dropout"
    if layer.value_head_dim != layer.head_dim:
        return f"needs the value's head dim ({layer.value_head_dim}) equal to the query's ({layer.head_dim})"
    if layer.dropout and layer.head_dim > 192:  # run_mha_bwd_hdim256: no kernel with dropout below 144 KB
        shared = capabilities.shared_memory_per_block(layer.query)
        if shared < 144 * 1024:
            return (
                f"launches no backward kernel for dropout at head dim {layer.head_dim} with {shared // 1024} KB of "
                "shared memory per block (it needs 144 KB): the gradients would not be written"
            )
    return None


def _flash_attn_3_limit(layer: _Layer) -> str | None:
    if layer.major not in (8, 9):  # hopper/setup.py builds sm_80 and sm_90a code only
        return f"has no kernel for sm {layer.major} (built for sm 80 and sm 90)"
    if layer.value_head_dim != layer.head_dim and layer.major != 9:
        return "takes a value head dim other than the query's on sm 90 only"
    return None


def _flash_attn_4_limit(layer: _Layer) -> str | None:
    dims = (layer.head_dim, layer.value_head_dim)
    if layer.major >= 10 and not (max(dims) <= 128 or dims in ((192, 128), (256, 256))):
        return f"cannot take head dims {dims} on sm {layer.major}"  # flash_attn/cute/interface.py, _validate_head_dims
    hd256_features = layer.softcap or layer.sinks or layer.window is not None
    if layer.major in (10, 11) and dims == (256, 256) and hd256_features:  # the dedicated hd256 kernel
        return f"has no soft-capping, attention sinks or sliding window at head dim 256 on sm {layer.major}"
    if layer.major >= 12 and layer.sinks:  # the sm120 kernel refuses learnable_sink; the sink backward is sm90-sm110
        return f"has no attention sinks on sm {layer.major}"
    return None


def _equal_head_dims(layer: _Layer) -> str | None:
    if layer.value_head_dim != layer.head_dim:
        return f"needs the value's head dim ({layer.value_head_dim}) equal to the query's ({layer.head_dim})"
    return None


def _hub_limit(layer: _Layer) -> str | None:
    if layer.value_head_dim != layer.head_dim:
        return _equal_head_dims(layer)
    if not (torch.is_grad_enabled() and layer.query.requires_grad):
        return None
    name, function = capabilities.transformers_varlen()
    fault = hub_backward_fault(function, layer.query.device, layer.query.dtype, layer.head_dim)
    if fault is None:
        return None
    return (
        f"({name}) cannot train: its backward {fault} on a tiny input. Install flash-attn 2, 3 or 4 locally "
        "(`pip install flash-attn`, or build `hopper/` for FA3) so that `auto` trains on it"
    )


_LIMITS = {
    "flash_attn_2": _flash_attn_2_limit,
    "flash_attn_3": _flash_attn_3_limit,
    "flash_attn_4": _flash_attn_4_limit,
    "hub": _hub_limit,
    "torch_varlen": _equal_head_dims,
}
"""Limits of the real kernels that their signatures do not show (the second table of the module docstring)."""


def refusal(
    name: str,
    query: torch.Tensor,
    *,
    major: int | None,
    softcap: float | None,
    dropout: float,
    sinks: bool,
    window: int | None,
    scale: float | None,
    value_head_dim: int | None = None,
) -> str | None:
    """Why kernel `name` cannot compute this layer on this device, or None (see the tables in the module docstring)."""
    if not _INSTALLED[name]():
        return "not installed"
    head_dim = query.shape[-1]
    if name == "sdpa":
        return None
    if major is None:
        return "needs CUDA tensors"
    missing = lacking(name, dropout=dropout, softcap=softcap, sinks=sinks)
    if missing:
        return f"has no {' or '.join(missing)}"
    if name == "flex":
        return None
    if query.dtype not in HALF:
        return f"needs fp16/bf16, got {query.dtype}"
    if head_dim > 256 or (name != "flash_attn_2" and head_dim % 8):
        return f"cannot take head dim {head_dim}"
    wrong = wrong_gradients(name, head_dim)
    if wrong is not None:
        return wrong
    if name in _LIMITS:
        value_head_dim = head_dim if value_head_dim is None else value_head_dim
        layer = _Layer(query, head_dim, value_head_dim, major, softcap is not None, bool(dropout), sinks, window)
        limit = _LIMITS[name](layer)
        if limit is not None:
            return limit
    if name == "torch_varlen":
        accepted = capabilities.parameters(capabilities.varlen_attn)
        if window is not None and "window_size" not in accepted:
            return "this torch's varlen_attn has no window_size"
        if not is_default_scale(scale, head_dim) and "scale" not in accepted:
            return "this torch's varlen_attn has no scale"
    return None


def select_kernel(
    query: torch.Tensor,
    *,
    softcap: float | None,
    dropout: float,
    sinks: bool = False,
    window: int | None = None,
    scale: float | None = None,
    value_head_dim: int | None = None,
) -> str:
    """Name of the kernel `auto` runs for this layer: the first of `kernel_order` without a `refusal`.

    Args:
        query (`torch.Tensor` of shape `(T, Hq, D)`): the query in varlen layout; its device, dtype and head size
            decide.
        softcap (`float`, *optional*): attention logit soft-capping.
        dropout (`float`): attention dropout probability.
        sinks (`bool`): the layer has attention sinks (`s_aux`).
        window (`int`, *optional*): transformers' `sliding_window`.
        scale (`float`, *optional*): the softmax scale, `D ** -0.5` when None.
        value_head_dim (`int`, *optional*): the value's head size, the query's when None (multi-head latent
            attention has a smaller one).

    >>> select_kernel(torch.zeros(4, 2, 8), softcap=None, dropout=0.0)  # CPU tensors
    'sdpa'
    """
    options = {"softcap": softcap, "dropout": dropout, "sinks": sinks, "window": window, "scale": scale}
    return _takers(query, value_head_dim=value_head_dim, **options)[0]


def forced_kernel(name: str, query: torch.Tensor, **options) -> str:
    """`name`, forced with `backend=name`, when it computes this layer on this device (`options` as `select_kernel`
    takes them); else `ValueError` naming the rule and the kernels that would take the layer."""
    reason = refusal(name, query, major=_major(query), **options)
    if reason is not None:
        raise ValueError(
            f"backend={name!r} cannot run this layer: `{name}` {reason}. Kernels that can, fastest first: "
            f"{', '.join(_takers(query, **options))}; `backend='auto'` takes the first."
        )
    return name


def _major(query: torch.Tensor) -> int | None:
    on_cuda = capabilities.HAS_CUDA and capabilities.is_cuda_tensor(query)
    return capabilities.compute_capability(query)[0] if on_cuda else None


def _takers(query: torch.Tensor, **options) -> list[str]:
    major = _major(query)
    return [name for name in kernel_order(major) if refusal(name, query, major=major, **options) is None]
