"""The `sdpa` packed kernel as one opaque operator, which is what a model under `torch.compile` calls.

The kernel reads the row's boundaries on the host (`Boundaries.host`, `group_plan`) and runs one SDPA call per group
of similar lengths: its code depends on the data. Traced by dynamo, every layer would break the graph at the host
copy and the first batch's plan would be baked into the graph. As a custom operator the whole kernel is one node whose
output has the query's shape, so the compiled model is one graph for every batch, and the kernel runs eagerly inside
it, where the layers of a forward share the guard's one host copy of the boundaries, which the graph hands every layer
as a CPU tensor (`HOST_BOUNDARIES_KEY`) beside `cu_seq_lens` (forward and recomputing backward alike)::

    eager     layer: q, k, v -> sdpa_kernel(q, k, v, boundaries)              (one Boundaries per forward)
    compiled  layer: q, k, v -> flatcollate::packed_sdpa(q, k, v, cu_seqlens, host, ...)   one node; runs sdpa_kernel

The backward recomputes the kernel's forward under autograd (as activation checkpointing does, for attention only):
an operator cannot hand the autograd graph of its eager inside to the compiled graph. Dropout would then draw other
random numbers in the recomputation, so the compiled path refuses it.

>>> q, k, v = torch.randn(5, 2, 4), torch.randn(5, 2, 4), torch.randn(5, 2, 4)
>>> cu = torch.tensor([0, 3, 5], dtype=torch.int32)  # two sequences: 3 and 2 tokens
>>> out = packed_sdpa(q, k, v, cu, None, None, 3, 0.5, None, None, None, None)
>>> alone = packed_sdpa(q[3:], k[3:], v[3:], torch.tensor([0, 2], dtype=torch.int32), None, None, 2, 0.5, None, None,
...                     None, None)
>>> torch.allclose(out[3:], alone)  # the second sequence never sees the first
True
"""

import numpy as np
import torch
from torch import Tensor

from .._conventions import HOST_BOUNDARIES_KEY
from ..boundaries import Boundaries
from ..boundaries import max_length as _max_length
from .kernels import sdpa_kernel


def _attention(
    query, key, value, cu_seqlens, cu_seqlens_host, position_ids, max_length, scale, window, softcap, sinks, chunk
):
    """`sdpa_kernel` on `(T, H, D)` inputs, with the boundaries the backend would have derived in eager mode (their
    host copy read from `cu_seqlens_host`, the guard's, where it is given: no copy from the device)."""
    if cu_seqlens is not None and cu_seqlens_host is not None:
        host = cu_seqlens_host.tolist()  # already on the host
        boundaries = Boundaries(cu_seqlens, max_length or _max_length(np.asarray(host)), host[-1]).with_host(host)
    else:
        kwargs = {"cu_seq_lens_q": cu_seqlens, "max_length_q": max_length, "position_ids": position_ids}
        length = query.shape[0] if position_ids is None else position_ids.shape[-1]
        boundaries = Boundaries.from_kwargs(kwargs, rows=query.shape[0] // max(length, 1), length=length)
    if chunk is not None:
        boundaries = boundaries.chunked(chunk)
    return sdpa_kernel(
        query, key, value, boundaries, scale=scale, window=window, softcap=softcap, dropout=0.0, sinks=sinks
    )


@torch.library.custom_op("flatcollate::packed_sdpa", mutates_args=())
def packed_sdpa(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    cu_seqlens: Tensor | None,
    cu_seqlens_host: Tensor | None,
    position_ids: Tensor | None,
    max_length: int | None,
    scale: float,
    window: int | None,
    softcap: float | None,
    sinks: Tensor | None,
    chunk: int | None,
) -> Tensor:
    """Causal attention inside each sequence of a flattened row, as one operator (`sdpa` kernel, no dropout).

    Args:
        query (`torch.Tensor` of shape `(T, Hq, D)`), key, value (`(T, Hkv, D)`): the varlen layout.
        cu_seqlens (`torch.Tensor` of shape `(N + 1,)`, integer, *optional*): the collator's boundaries; when None,
            they come from `position_ids` (`(B, T')` int64, `B * T' == T` or one row shared by all).
        max_length (`int`, *optional*): longest sequence of `cu_seqlens` (the collator's `max_length_q`).
        scale, window, softcap, sinks (`(Hq,)`), chunk: as `packed_attention_forward` passes them to the kernels.

    Returns:
        `torch.Tensor` of shape `(T, Hq, D)`.
    """
    return _attention(
        query, key, value, cu_seqlens, cu_seqlens_host, position_ids, max_length, scale, window, softcap, sinks, chunk
    )


@packed_sdpa.register_fake
def _(query, key, value, cu_seqlens, cu_seqlens_host, position_ids, max_length, scale, window, softcap, sinks, chunk):
    return query.new_empty(query.shape[0], query.shape[1], value.shape[-1])


def _autograd_inside_operator():
    """Record autograd again inside an operator's body, where the dispatcher has turned it off (the context
    `torch.compiler`'s own opaque leaf functions use to differentiate eager code at run time)."""
    exclude = torch._C._dispatch_tls_local_exclude_set().remove(torch._C.DispatchKey.AutogradFunctionality)
    return torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), exclude)


@torch.library.custom_op("flatcollate::packed_sdpa_backward", mutates_args=())
def packed_sdpa_backward(
    grad: Tensor,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    cu_seqlens: Tensor | None,
    cu_seqlens_host: Tensor | None,
    position_ids: Tensor | None,
    max_length: int | None,
    scale: float,
    window: int | None,
    softcap: float | None,
    sinks: Tensor | None,
    chunk: int | None,
) -> list[Tensor]:
    """Gradients of `packed_sdpa` for query, key, value and sinks (an empty tensor without sinks), by recomputing it.

    Args:
        grad (`torch.Tensor` of shape `(T, Hq, D)`): gradient of the output; the other arguments as `packed_sdpa`.
    """
    inputs = [t.detach().requires_grad_() for t in (query, key, value)]
    if sinks is not None:
        inputs.append(sinks.detach().requires_grad_())
    with _autograd_inside_operator(), torch.enable_grad():
        sinks = inputs[3] if sinks is not None else None
        out = _attention(
            *inputs[:3], cu_seqlens, cu_seqlens_host, position_ids, max_length, scale, window, softcap, sinks, chunk
        )
    grads = list(torch.autograd.grad(out, inputs, grad))
    return grads if sinks is not None else [*grads, query.new_empty(0)]


@packed_sdpa_backward.register_fake
def _(grad, query, key, value, cu_seqlens, cu_seqlens_host, position_ids, max_length, scale, window, softcap, sinks,
      chunk):
    return [
        torch.empty_like(query),
        torch.empty_like(key),
        torch.empty_like(value),
        query.new_empty(0) if sinks is None else torch.empty_like(sinks),
    ]


def _setup_context(ctx, inputs, output):
    query, key, value, cu_seqlens, cu_seqlens_host, position_ids, max_length, scale, window, softcap, sinks, chunk = (
        inputs
    )
    ctx.save_for_backward(query, key, value, cu_seqlens, cu_seqlens_host, position_ids, sinks)
    ctx.options = (max_length, scale, window, softcap, chunk)


def _backward(ctx, grad):
    query, key, value, cu_seqlens, cu_seqlens_host, position_ids, sinks = ctx.saved_tensors
    max_length, scale, window, softcap, chunk = ctx.options
    d_query, d_key, d_value, d_sinks = packed_sdpa_backward(
        grad, query, key, value, cu_seqlens, cu_seqlens_host, position_ids, max_length, scale, window, softcap, sinks,
        chunk,
    )
    return d_query, d_key, d_value, *[None] * 7, d_sinks if sinks is not None else None, None


packed_sdpa.register_autograd(_backward, setup_context=_setup_context)


def compiled_sdpa_kernel(query, key, value, kwargs: dict, *, scale, window, softcap, dropout, sinks, chunk):
    """What `packed_attention_forward` runs for the `sdpa` kernel while dynamo traces: `packed_sdpa` on the
    collator's `cu_seq_lens_q` / `max_length_q` (or `position_ids`) from the attention `kwargs`.

    Raises:
        `ValueError` for attention dropout, which the recomputing backward cannot reproduce.
    """
    if dropout:
        raise ValueError(
            f"Attention dropout ({dropout}) is not supported by the packed `sdpa` kernel under `torch.compile`: its "
            "backward recomputes attention and would draw other random numbers. Set the config's "
            "`attention_dropout=0.0`, or train this model without `torch.compile`."
        )
    cu_seqlens = kwargs.get("cu_seq_lens_q")
    host = kwargs.get(HOST_BOUNDARIES_KEY) if cu_seqlens is not None else None
    max_length = kwargs.get("max_length_q") if cu_seqlens is not None else None
    position_ids = kwargs.get("position_ids") if cu_seqlens is None else None
    return packed_sdpa(
        query, key, value, cu_seqlens, host, position_ids, max_length, scale, window, softcap, sinks, chunk
    )
