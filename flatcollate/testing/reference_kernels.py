"""Slow references of the CUDA varlen kernels flatcollate calls, refusing every input the real kernels refuse.

Each builder returns a drop-in stand-in for one kernel: the same signature, the semantics its docstring and source
state, computed by a readable loop over sequences in float64 (`varlen_attention`). Patched in as the function
`flatcollate.attention.capabilities` detected, a stand-in lets CPU tests check the arguments flatcollate passes by
what they *mean* (window, causal flag, scale, softcap, sinks, GQA), not only by name. Here: PyTorch's
`torch.nn.attention.varlen.varlen_attn` in each of its signatures (`varlen_attn` for 2.12+, `varlen_attn_2_11`,
`varlen_attn_2_10`); flash-attn 2, 3 and 4 are in `flatcollate.testing.reference_flash_attn`.

Before computing, each checks the preconditions of the real kernel and raises `RuntimeError` (the kernels'
`TORCH_CHECK`s raise it) on a violation: dtype fp16/bf16, one CUDA device for all tensors (including
`cu_seqlens`), `(T, H, D)` with a contiguous last dimension, `cu_seqlens` int32 and non-decreasing, head dim a
multiple of 8 and at most 256, query heads a multiple of key/value heads, `max_seqlen` a Python `int`. A test on
CPU in fp32 relaxes only what it must, through `KernelContract`:

>>> import torch
>>> contract = KernelContract(dtypes=(torch.float32,), device_type="cpu")
>>> q = k = v = torch.ones(5, 2, 8)
>>> cu = torch.tensor([0, 2, 5], dtype=torch.int32)
>>> varlen_attn(contract)(q, k, v, cu, cu, 3, 3, window_size=(-1, 0)).shape
torch.Size([5, 2, 8])
>>> varlen_attn(contract)(q, k, v, cu.long(), cu, 3, 3)
Traceback (most recent call last):
RuntimeError: cu_seqlens_q must have dtype int32, got torch.int64
"""

import inspect
import itertools
from collections.abc import Callable
from dataclasses import dataclass

import torch

HALF_DTYPES = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class KernelContract:
    """What the reference accepts besides the kernel's own rules: the real kernels take fp16/bf16 CUDA tensors.

    Args:
        dtypes (`tuple[torch.dtype, ...]`): allowed dtypes of `q`, `k`, `v` (all three must agree).
        device_type (`str`): device type every tensor, `cu_seqlens` included, must live on.
        compute_dtype (`torch.dtype`): dtype of the reference's arithmetic (float64: the exact answer; the inputs'
            dtype: the error a plain implementation makes, which sets the tolerance for the real kernels).
        capability (`tuple[int, int]`, *optional*): the simulated GPU's compute capability; where set, the flash-attn
            references also do what the real kernel does on that architecture (refuse, or train wrong), see
            `flatcollate.testing.reference_flash_attn`.
    """

    dtypes: tuple[torch.dtype, ...] = HALF_DTYPES
    device_type: str = "cuda"
    compute_dtype: torch.dtype = torch.float64
    capability: tuple[int, int] | None = None


CUDA_CONTRACT = KernelContract()


def check(condition: bool, message: str) -> None:
    """The kernels' `TORCH_CHECK`: a `RuntimeError` with the reason."""
    if not condition:
        raise RuntimeError(message)


def check_inputs(q, k, v, cu_q, cu_k, max_q, max_k, contract: KernelContract) -> tuple[list[int], list[int]]:
    """Preconditions shared by both kernels (FA2's `mha_varlen_fwd` in `csrc/flash_attn/flash_api.cpp`, which the
    ATen flash kernel behind `varlen_attn` also runs); returns the boundaries on the host."""
    check(q.dtype in contract.dtypes, f"FlashAttention only supports {contract.dtypes}, got {q.dtype}")
    check(k.dtype == q.dtype and v.dtype == q.dtype, "query, key and value must have the same dtype")
    for name, tensor in {"q": q, "k": k, "v": v, "cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k}.items():
        check(tensor.device.type == contract.device_type, f"{name} must be on {contract.device_type}: {tensor.device}")
        check(tensor.device == q.device, f"{name} is on {tensor.device} but q is on {q.device}")
    for name, tensor in {"q": q, "k": k, "v": v}.items():
        check(tensor.dim() == 3, f"{name} must be (total, heads, head_dim), got {tuple(tensor.shape)}")
        check(tensor.stride(-1) == 1, f"{name} must have contiguous last dimension")
    total_q, heads, head_dim = q.shape
    check(k.shape[0] == v.shape[0] and k.shape[1:] == v.shape[1:], "key and value must have the same shape")
    check(k.shape[2] == head_dim, f"key head dim {k.shape[2]} != query head dim {head_dim}")
    check(head_dim <= 256, f"FlashAttention forward only supports head dimension at most 256, got {head_dim}")
    check(head_dim % 8 == 0, f"head_size must be a multiple of 8, got {head_dim}")
    check(heads % k.shape[1] == 0, "Number of heads in key/value must divide number of heads in query")
    bounds = []
    for name, cu, total, longest in (("q", cu_q, total_q, max_q), ("k", cu_k, k.shape[0], max_k)):
        check(cu.dtype == torch.int32, f"cu_seqlens_{name} must have dtype int32, got {cu.dtype}")
        check(cu.dim() == 1 and cu.is_contiguous(), f"cu_seqlens_{name} must be a contiguous (batch + 1,) tensor")
        check(cu.numel() >= 2, "batch size must be positive")
        check(type(longest) is int, f"max_seqlen_{name} must be a Python int, got {type(longest).__name__}")
        host = cu.tolist()
        lengths = [end - start for start, end in itertools.pairwise(host)]
        # Stricter than the kernel, which reads whatever the offsets say: a row that is not fully covered, or
        # offsets that go back, are bugs of the caller here.
        check(host[0] == 0 and host[-1] == total, f"cu_seqlens_{name} {host} must run from 0 to {total}")
        check(min(lengths) >= 0, f"cu_seqlens_{name} must be non-decreasing, got {host}")
        # The kernel launches ceil(max_seqlen / block) tiles per sequence: a too small max_seqlen drops tokens.
        check(longest >= max(lengths), f"max_seqlen_{name}={longest} is below the longest sequence {max(lengths)}")
        bounds.append(host)
    check(len(bounds[0]) == len(bounds[1]), "cu_seqlens_q and cu_seqlens_k must have the same batch size")
    return bounds[0], bounds[1]


def varlen_attention(
    q,
    k,
    v,
    bounds_q,
    bounds_k,
    *,
    scale,
    left,
    right,
    softcap,
    sinks=None,
    negative_is_unlimited=True,
    compute_dtype=torch.float64,
):
    """Softmax attention per sequence with flash-attn's local-window rule, in `compute_dtype`, autograd-friendly.

    Query `i` of a sequence sees key `j` iff `i + sk - sq - left <= j <= i + sk - sq + right` (a bound given as
    None is infinite, and so is a negative one in FA2/FA3/PyTorch's convention; with `negative_is_unlimited=False`,
    FA4's, it is a literal offset): the mask is aligned to the bottom
    right corner, so causal is `right = 0`. A query that sees no key gets a zero output. `softcap > 0` applies
    `softcap * tanh(s / softcap)` to the scaled scores `s`. `sinks` `(Hq,)`: one logit per head that joins every
    softmax's denominator and takes no value (gpt-oss, FA4's `learnable_sink`).

    q `(Tq, Hq, D)`, k/v `(Tk, Hkv, D)`, `bounds_*` the host lists of cumulative lengths; returns `(Tq, Hq, D)` in
    q's dtype.
    """
    groups = q.shape[1] // k.shape[1]
    outputs = []
    # One sequence at a time: nothing can cross a boundary, and the mask is the docstring's rule verbatim.
    for (q0, q1), (k0, k1) in zip(itertools.pairwise(bounds_q), itertools.pairwise(bounds_k), strict=True):
        qs = q[q0:q1].to(compute_dtype).transpose(0, 1)
        ks = k[k0:k1].to(compute_dtype).repeat_interleave(groups, dim=1).transpose(0, 1)
        vs = v[k0:k1].to(compute_dtype).repeat_interleave(groups, dim=1).transpose(0, 1)
        scores = qs @ ks.transpose(-1, -2) * scale
        if softcap > 0:
            scores = softcap * torch.tanh(scores / softcap)
        i = torch.arange(q1 - q0, device=q.device)[:, None] + (k1 - k0) - (q1 - q0)
        j = torch.arange(k1 - k0, device=q.device)[None, :]
        allowed = torch.ones(i.shape[0], j.shape[1], dtype=torch.bool, device=q.device)
        if left is not None and (left >= 0 or not negative_is_unlimited):
            allowed &= j >= i - left
        if right is not None and (right >= 0 or not negative_is_unlimited):
            allowed &= j <= i + right
        seen = allowed.any(dim=-1, keepdim=True)
        scores = scores.masked_fill(~allowed, float("-inf")).masked_fill(~seen, 0.0)
        if sinks is not None:  # a column that joins the softmax and is dropped before the values
            column = sinks.to(compute_dtype).reshape(-1, 1, 1).expand(*scores.shape[:-1], 1)
            probs = torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)[..., :-1]
        else:
            probs = torch.softmax(scores, dim=-1)
        outputs.append(((probs * seen) @ vs).transpose(0, 1))
    return torch.cat(outputs).to(q.dtype)


def window_pair(window_size) -> tuple[int, int]:
    check(
        isinstance(window_size, tuple | list) and len(window_size) == 2,
        f"window_size must have length 2, got {window_size!r}",
    )
    left, right = window_size
    check(type(left) is int and type(right) is int, f"window_size must hold two ints, got {window_size!r}")
    return left, right


def varlen_attn(contract: KernelContract = CUDA_CONTRACT):
    """A stand-in for `torch.nn.attention.varlen.varlen_attn` (torch 2.12 and later) checking `contract` and its
    rules."""

    def reference(
        query,
        key,
        value,
        cu_seq_q,
        cu_seq_k,
        max_q,
        max_k,
        *,
        return_aux=None,
        scale=None,
        window_size=(-1, -1),
        enable_gqa=False,
        seqused_k=None,
        block_table=None,
        num_splits=None,
    ):
        # Upstream docstring (torch/nn/attention/varlen.py): "window_size ... as (left, right). Use (-1, -1) for
        # full attention (default), (-1, 0) for causal attention, or (W, 0) for causal attention with sliding
        # window of size W"; "enable_gqa ... allows key/value to have fewer heads than query". There is no
        # softcap and no dropout argument; dropout is fixed at 0 and the scale defaults to 1 / sqrt(D).
        if not enable_gqa and query.shape[1] != key.shape[1]:
            raise ValueError(
                f"Expect query and key/value to have the same number of heads but got "
                f"Hq={query.shape[1]} and Hkv={key.shape[1]}. Try setting enable_gqa=True for GQA."
            )
        if enable_gqa and query.shape[1] % key.shape[1]:
            raise ValueError(
                f"Expect number of query heads to be a multiple of kv heads for GQA but got Hq={query.shape[1]} "
                f"and Hkv={key.shape[1]}."
            )
        bounds_q, bounds_k = check_inputs(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, contract)
        left, right = window_pair(window_size)
        if return_aux is not None or seqused_k is not None or block_table is not None:
            raise NotImplementedError("the reference returns no log-sum-exp and has no paged or partial KV")
        scale = query.shape[-1] ** -0.5 if scale is None else scale
        return varlen_attention(
            query,
            key,
            value,
            bounds_q,
            bounds_k,
            scale=scale,
            left=left,
            right=right,
            softcap=0,
            compute_dtype=contract.compute_dtype,
        )

    return reference


def varlen_attn_2_11(contract: KernelContract = CUDA_CONTRACT):
    """A stand-in for `varlen_attn` of torch 2.11: keyword-only `scale` and `window_size`, no `enable_gqa` (fewer
    key/value heads reach the kernel, which takes them when they divide the query heads)."""

    def reference(
        query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None, window_size=(-1, -1)
    ):
        # torch 2.11 torch/nn/attention/varlen.py: `is_causal = window_size == (-1, 0)`, both sides passed to the
        # kernel as `window_size_left/right`.
        if return_aux is not None:
            raise NotImplementedError("the reference returns no log-sum-exp")
        bounds_q, bounds_k = check_inputs(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, contract)
        left, right = window_pair(window_size)
        scale = query.shape[-1] ** -0.5 if scale is None else scale
        return varlen_attention(
            query, key, value, bounds_q, bounds_k, scale=scale, left=left, right=right, softcap=0,
            compute_dtype=contract.compute_dtype,
        )  # fmt: skip

    return reference


def varlen_attn_2_10(contract: KernelContract = CUDA_CONTRACT):
    """A stand-in for `varlen_attn` of torch 2.10: `is_causal` (positional or keyword), the scale fixed at
    `1 / sqrt(D)`, no windows, no `enable_gqa`."""

    def reference(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, return_aux=None):
        if return_aux is not None:
            raise NotImplementedError("the reference returns no log-sum-exp")
        bounds_q, bounds_k = check_inputs(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, contract)
        return varlen_attention(
            query, key, value, bounds_q, bounds_k, scale=query.shape[-1] ** -0.5, left=-1,
            right=0 if is_causal else -1, softcap=0, compute_dtype=contract.compute_dtype,
        )  # fmt: skip

    return reference


def varlen_attn_like(function: Callable) -> Callable[[KernelContract], Callable]:
    """The stand-in builder whose signature is that of `function`, an installed `varlen_attn` (2.10, 2.11 or 2.12+).

    >>> varlen_attn_like(varlen_attn_2_11()) is varlen_attn_2_11
    True
    """
    accepted = inspect.signature(function).parameters
    if "enable_gqa" in accepted:
        return varlen_attn
    return varlen_attn_2_11 if "window_size" in accepted else varlen_attn_2_10
