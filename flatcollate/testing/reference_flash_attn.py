"""Slow references of flash-attn's varlen kernels, versions 2, 3 and 4, with their real signatures and refusals.

Built like `flatcollate.testing.reference_kernels` (whose `KernelContract`, input checks and `varlen_attention`
they share), each read from flash-attention's source:

- FA2 `flash_attn.flash_attn_varlen_func` (`flash_attn/flash_attn_interface.py`, `csrc/flash_attn/flash_api.cpp`);
- FA3 `flash_attn_interface.flash_attn_varlen_func` (`hopper/flash_attn_interface.py`, `hopper/flash_api.cpp`): no
  `dropout_p` (the 8th argument is `seqused_q`), returns the output, or `(out, lse)` with `return_attn_probs`;
- FA4 `flash_attn.cute.flash_attn_varlen_func` (`flash_attn/cute/interface.py`): `qv` 4th, windows as
  `(left, right)` where `None` is unlimited and negative numbers are taken literally (`_resolve_causal_local_window`),
  attention sinks as `learnable_sink` `(H,)`, no dropout; always returns `(out, lse)`.

>>> import torch
>>> from flatcollate.testing.reference_kernels import KernelContract
>>> contract = KernelContract(dtypes=(torch.float32,), device_type="cpu")
>>> q = k = v = torch.ones(5, 2, 8)
>>> cu = torch.tensor([0, 2, 5], dtype=torch.int32)
>>> out, lse = flash_attn_4_varlen_func(contract)(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=3,
...                                               max_seqlen_k=3, causal=True)
>>> out.shape, lse
(torch.Size([5, 2, 8]), None)
>>> flash_attn_3_varlen_func(contract)(q, k, v, cu, cu, 3, 3, 0.1)  # FA3's 8th argument is not dropout
Traceback (most recent call last):
NotImplementedError: the reference has no seqused, qv, descaling, attention chunks or splits
"""

import torch

from .reference_kernels import CUDA_CONTRACT, KernelContract, check, check_inputs, varlen_attention, window_pair


def flash_attn_varlen_func(contract: KernelContract = CUDA_CONTRACT):
    """A stand-in for FA2's `flash_attn.flash_attn_varlen_func` checking `contract` and the kernel's own rules."""

    def reference(
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        dropout_p=0.0,
        softmax_scale=None,
        causal=False,
        window_size=(-1, -1),
        softcap=0.0,
        alibi_slopes=None,
        deterministic=False,
        return_attn_probs=False,
        block_table=None,
    ):
        # flash_attn_interface.py: "If causal=True, the causal mask is aligned to the bottom right corner of the
        # attention matrix"; "Query at position i will only attend to keys between [i + seqlen_k - seqlen_q -
        # window_size[0], i + seqlen_k - seqlen_q + window_size[1]] inclusive"; "softcap: float. Anything > 0
        # activates softcapping attention"; "softmax_scale ... Default to 1 / sqrt(headdim)".
        bounds_q, bounds_k = check_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, contract)
        left, right = window_pair(window_size)
        if causal:  # flash_api.cpp: `if (is_causal) { window_size_right = 0; }`
            right = 0
        check(not (softcap > 0 and dropout_p > 0), "Softcapping does not support dropout for now")
        if dropout_p or alibi_slopes is not None or return_attn_probs or block_table is not None:
            raise NotImplementedError("the reference computes no dropout, ALiBi, attention probabilities or paging")
        scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
        return varlen_attention(
            q, k, v, bounds_q, bounds_k, scale=scale, left=left, right=right, softcap=softcap,
            compute_dtype=contract.compute_dtype,
        )  # fmt: skip

    return reference


class _WrongQueryGradient(torch.autograd.Function):
    """`out` (computed from a detached query) unchanged, and a zero gradient for `q`: what FA4's backward does at head
    dims that are not a multiple of 32 (measured on an H200 with 4.0.0b36: dq off by 2.4 at head dim 16), raising
    nothing."""

    @staticmethod
    def forward(ctx, out, q):
        ctx.query = (q.shape, q.dtype)
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad):
        shape, dtype = ctx.query
        return grad, torch.zeros(shape, dtype=dtype, device=grad.device)


def _architecture(contract: KernelContract) -> int | None:
    return None if contract.capability is None else contract.capability[0]


def flash_attn_3_varlen_func(contract: KernelContract = CUDA_CONTRACT):
    """A stand-in for FA3's `flash_attn_interface.flash_attn_varlen_func`: FA2's window and causal rules, no dropout
    (there is no such parameter), head dim a multiple of 8 up to 256."""

    def reference(
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        seqused_q=None,
        seqused_k=None,
        softmax_scale=None,
        causal=False,
        qv=None,
        q_descale=None,
        k_descale=None,
        v_descale=None,
        window_size=(-1, -1),
        attention_chunk=0,
        softcap=0.0,
        num_splits=1,
        pack_gqa=None,
        deterministic=False,
        sm_margin=0,
        return_attn_probs=False,
    ):
        extras = (seqused_q, seqused_k, qv, q_descale, k_descale, v_descale)
        if any(x is not None for x in extras) or attention_chunk or num_splits != 1:
            raise NotImplementedError("the reference has no seqused, qv, descaling, attention chunks or splits")
        bounds_q, bounds_k = check_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, contract)
        major = _architecture(contract)
        check(major in (None, 8, 9), f"no kernel image is available for execution on the device (sm {major})")
        left, right = window_pair(window_size)
        if causal:  # hopper/flash_api.cpp: `if (is_causal) { window_size_right = 0; }`
            right = 0
        scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
        out = varlen_attention(
            q, k, v, bounds_q, bounds_k, scale=scale, left=left, right=right, softcap=softcap,
            compute_dtype=contract.compute_dtype,
        )  # fmt: skip
        if return_attn_probs:
            raise NotImplementedError("the reference returns no log-sum-exp")
        return out

    return reference


def _fa4_window(causal: bool, left: int | None, right: int | None) -> tuple[int | None, int | None]:
    """FA4's `_resolve_causal_local_window` (no `mask_mod`): causal forces `right = 0`; a pair summing below zero means
    no window; `None` is unlimited, a negative number is a literal offset.

    >>> _fa4_window(True, None, None), _fa4_window(True, -1, 0), _fa4_window(True, 3, 0), _fa4_window(False, -1, 0)
    ((None, 0), (None, 0), (3, 0), (None, None))
    """
    if causal:
        right = 0
    if left is not None and right is not None and left + right < 0:
        left = right = None
    if causal and (left, right) == (None, None):
        right = 0  # FA4 keeps `causal` set: still causal, with no window
    return left, right


def flash_attn_4_varlen_func(contract: KernelContract = CUDA_CONTRACT):
    """A stand-in for FA4's `flash_attn.cute.flash_attn_varlen_func`: windows as FA4 resolves them (`_fa4_window`),
    `learnable_sink` `(H,)` fp16/bf16/fp32, no dropout, `(out, lse)` returned (`lse` None: the reference computes
    none, as FA4 when nothing needs it)."""

    def reference(
        q,
        k,
        v,
        qv=None,
        cu_seqlens_q=None,
        cu_seqlens_k=None,
        max_seqlen_q=None,
        max_seqlen_k=None,
        min_seqlen_k=None,
        seqused_q=None,
        seqused_k=None,
        gather_kv_indices=None,
        page_table=None,
        softmax_scale=None,
        causal=False,
        window_size=(None, None),
        learnable_sink=None,
        softcap=0.0,
        num_splits=1,
        pack_gqa=None,
        deterministic=False,
        score_mod=None,
        score_mod_bwd=None,
        mask_mod=None,
        block_sparse_tensors=None,
        aux_tensors=None,
        aux_scalars=None,
        return_lse=False,
        scheduler_metadata=None,
        seqlen_k_per_split=None,
        disable_scheduler_metadata=False,
    ):
        extras = (qv, min_seqlen_k, seqused_q, seqused_k, gather_kv_indices, page_table, score_mod, mask_mod)
        if any(x is not None for x in extras) or block_sparse_tensors is not None or return_lse:
            raise NotImplementedError("the reference has no qv, seqused, paging, score/mask mods or log-sum-exp")
        check(cu_seqlens_q is not None and cu_seqlens_k is not None, "the reference needs cu_seqlens_q and _k")
        bounds_q, bounds_k = check_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, contract)
        check(isinstance(window_size, tuple | list) and len(window_size) == 2, f"window_size {window_size!r}")
        check(all(w is None or type(w) is int for w in window_size), "window_size must hold ints or None")
        if learnable_sink is not None:
            check(learnable_sink.shape == (q.shape[1],), f"learnable_sink must be ({q.shape[1]},)")
            check(learnable_sink.dtype in (torch.float16, torch.bfloat16, torch.float32), "learnable_sink dtype")
        left, right = _fa4_window(causal, *window_size)
        major, head_dim = _architecture(contract), q.shape[-1]
        if major in (10, 11) and head_dim == 256:  # the dedicated hd256 kernel
            check(not softcap, "SM100 forward with head_dim=256 does not support softcap")
            check(learnable_sink is None, "SM100 forward with head_dim=256 does not support learnable_sink")
            check(left is None, "SM100 forward with head_dim=256 does not support local attention")
        if major is not None and major >= 12:
            check(learnable_sink is None, "the SM 12.0 kernel takes no learnable_sink")
        wrong_dq = major is not None and head_dim % 32 != 0
        scale = head_dim**-0.5 if softmax_scale is None else softmax_scale
        out = varlen_attention(
            q.detach() if wrong_dq else q, k, v, bounds_q, bounds_k, scale=scale, left=left, right=right,
            softcap=softcap, sinks=learnable_sink, negative_is_unlimited=False, compute_dtype=contract.compute_dtype,
        )  # fmt: skip
        return (_WrongQueryGradient.apply(out, q) if wrong_dq else out), None

    return reference
