"""Which packed kernel runs a layer: the kernels by name, the order `auto` tries them in, and why each is passed over.

`auto` runs the first kernel of the order that is installed and computes the layer as asked; every kernel is exact,
so the order is about speed only. The order by device (`capabilities.compute_capability`)::

    Blackwell (sm 10+)   flash_attn_4  flash_attn_3  flash_attn_2  hub  torch_varlen  flex  sdpa
    Hopper (sm 9)        flash_attn_3  flash_attn_4  flash_attn_2  hub  torch_varlen  flex  sdpa
    Ampere, Ada (sm 8)   flash_attn_3  flash_attn_2                hub  torch_varlen  flex  sdpa
    older GPUs                                                                        flex  sdpa
    CPU                                                                                     sdpa

What a kernel needs besides being installed (`refusal` says it in words):

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

`hub` is the varlen function transformers loaded from the Hub for `attn_implementation="kernels-community/..."`.
`flex` compiles `flex_attention` on CUDA and runs it on FA4's CuTe kernels (`BACKEND="FLASH"`) where torch offers
them and flash-attn-4 imports.
"""

import torch

from . import capabilities
from .features import is_default_scale, lacking, wrong_gradients
from .kernels import flex_kernel, sdpa_kernel
from .varlen_kernels import (
    flash_attn_2_kernel,
    flash_attn_3_kernel,
    flash_attn_4_kernel,
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
) -> str | None:
    """Why kernel `name` cannot compute this layer on this device, or None (see the table in the module docstring)."""
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
    if name == "flash_attn_4" and major >= 10 and head_dim > 128 and head_dim != 256:
        return f"cannot take head dim {head_dim} on sm {major}"
    wrong = wrong_gradients(name, head_dim)
    if wrong is not None:
        return wrong
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

    >>> select_kernel(torch.zeros(4, 2, 8), softcap=None, dropout=0.0)  # CPU tensors
    'sdpa'
    """
    on_cuda = capabilities.HAS_CUDA and capabilities.is_cuda_tensor(query)
    major = capabilities.compute_capability(query)[0] if on_cuda else None
    options = {"softcap": softcap, "dropout": dropout, "sinks": sinks, "window": window, "scale": scale}
    return next(name for name in kernel_order(major) if refusal(name, query, major=major, **options) is None)
