"""The references of flash-attn 3 and 4 and of torch 2.10/2.11's `varlen_attn`: their masks as the upstream sources
define them, the calls that differ between versions, and what each refuses."""

import numpy as np
import pytest
import torch

from flatcollate.testing.reference_flash_attn import (
    flash_attn_3_varlen_func,
    flash_attn_4_varlen_func,
    flash_attn_varlen_func,
)
from flatcollate.testing.reference_kernels import KernelContract, varlen_attn_2_10, varlen_attn_2_11

CPU_FP32 = KernelContract(dtypes=(torch.float32,), device_type="cpu")
CAUSAL = np.tril(np.ones((5, 5), int)).tolist()
BAND = [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [0, 1, 1, 1, 0], [0, 0, 1, 1, 1]]


def _inputs(length: int, heads: int = 1, kv_heads: int = 1):
    """Zero queries (uniform weights over kept keys) and one-hot values: output row i is kept[i] / kept[i].sum()."""
    q = torch.zeros(length, heads, 8)
    k = torch.zeros(length, kv_heads, 8)
    v = torch.eye(length, 8)[:, None, :].expand(length, kv_heads, 8).contiguous()
    return q, k, v, torch.tensor([0, length], dtype=torch.int32)


def _mask(out: torch.Tensor, length: int) -> list[list[int]]:
    out = out[0] if isinstance(out, tuple) else out
    return (out[:, 0, :length] > 0).int().tolist()


def fa4_mask(length=5, **options):
    q, k, v, cu = _inputs(length)
    call = {"cu_seqlens_q": cu, "cu_seqlens_k": cu, "max_seqlen_q": length, "max_seqlen_k": length}
    return _mask(flash_attn_4_varlen_func(CPU_FP32)(q, k, v, **call, **options), length)


def test_fa4_windows_are_none_for_unlimited_and_negative_numbers_are_literal():
    assert fa4_mask(causal=True) == CAUSAL  # window (None, None)
    assert fa4_mask(causal=True, window_size=(None, 0)) == CAUSAL
    assert fa4_mask(causal=True, window_size=(2, 0)) == BAND
    assert fa4_mask(causal=True, window_size=(-1, 0)) == CAUSAL  # sums below zero: no window, still causal
    assert fa4_mask(window_size=(-1, 0)) == [[1] * 5] * 5  # FA2's "(-1, 0) is causal" is full attention in FA4
    assert fa4_mask(window_size=(2, -1))[2] == [1, 1, 0, 0, 0]  # right = -1 is literal: the diagonal is excluded


def test_fa4_returns_out_and_lse_and_computes_sinks():
    q, k, v, cu = _inputs(4, heads=2)
    call = {"cu_seqlens_q": cu, "cu_seqlens_k": cu, "max_seqlen_q": 4, "max_seqlen_k": 4, "causal": True}
    out, lse = flash_attn_4_varlen_func(CPU_FP32)(q, k, v, **call)
    sunk, _ = flash_attn_4_varlen_func(CPU_FP32)(q, k, v, **call, learnable_sink=torch.tensor([0.0, 30.0]))
    assert lse is None
    # zero scores: a sink of logit 0 takes one share of the softmax, one of 30 takes nearly all of it
    torch.testing.assert_close(sunk[:, 0], out[:, 0] * torch.tensor([1 / 2, 2 / 3, 3 / 4, 4 / 5])[:, None])
    assert sunk[:, 1].abs().max() < 1e-12
    with pytest.raises(RuntimeError, match="learnable_sink must be"):
        flash_attn_4_varlen_func(CPU_FP32)(q, k, v, **call, learnable_sink=torch.zeros(3))


def test_fa4_takes_qv_fourth_and_has_no_dropout():
    q, k, v, cu = _inputs(4)
    with pytest.raises(NotImplementedError, match="no qv"):
        flash_attn_4_varlen_func(CPU_FP32)(q, k, v, cu, cu_seqlens_k=cu, max_seqlen_q=4, max_seqlen_k=4)
    with pytest.raises(TypeError, match="dropout_p"):
        flash_attn_4_varlen_func(CPU_FP32)(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, dropout_p=0.1)


def test_fa3_windows_match_fa2_and_its_eighth_argument_is_seqused_q():
    q, k, v, cu = _inputs(5)
    fa2, fa3 = flash_attn_varlen_func(CPU_FP32), flash_attn_3_varlen_func(CPU_FP32)
    for options in ({"causal": True}, {"causal": True, "window_size": (2, 0)}, {"window_size": (2, 0)}):
        assert _mask(fa3(q, k, v, cu, cu, 5, 5, **options), 5) == _mask(fa2(q, k, v, cu, cu, 5, 5, **options), 5)
    assert _mask(fa3(q, k, v, cu, cu, 5, 5, causal=True, window_size=(2, 0)), 5) == BAND
    with pytest.raises(TypeError, match="dropout_p"):
        fa3(q, k, v, cu, cu, 5, 5, dropout_p=0.1)
    with pytest.raises(NotImplementedError, match="seqused"):
        fa3(q, k, v, cu, cu, 5, 5, 0.0)  # a dropout probability passed by position lands in seqused_q
    with pytest.raises(RuntimeError, match="head_size must be a multiple of 8"):
        fa3(torch.zeros(5, 1, 12), torch.zeros(5, 1, 12), torch.zeros(5, 1, 12), cu, cu, 5, 5)


def test_torch_2_10_has_is_causal_and_a_fixed_scale():
    q, k, v, cu = _inputs(5)
    assert _mask(varlen_attn_2_10(CPU_FP32)(q, k, v, cu, cu, 5, 5, True), 5) == CAUSAL
    assert _mask(varlen_attn_2_10(CPU_FP32)(q, k, v, cu, cu, 5, 5), 5) == [[1] * 5] * 5
    with pytest.raises(TypeError, match="window_size"):
        varlen_attn_2_10(CPU_FP32)(q, k, v, cu, cu, 5, 5, window_size=(-1, 0))
    with pytest.raises(TypeError, match="scale"):
        varlen_attn_2_10(CPU_FP32)(q, k, v, cu, cu, 5, 5, scale=0.1)


def test_torch_2_11_has_windows_and_scale_but_no_enable_gqa():
    q, k, v, cu = _inputs(5, heads=2)
    reference = varlen_attn_2_11(CPU_FP32)
    assert _mask(reference(q, k, v, cu, cu, 5, 5, window_size=(2, 0)), 5) == BAND
    assert _mask(reference(q, k, v, cu, cu, 5, 5, window_size=(-1, 0)), 5) == CAUSAL
    with pytest.raises(TypeError, match="enable_gqa"):
        reference(q, k, v, cu, cu, 5, 5, enable_gqa=False)
    with pytest.raises(TypeError, match="positional"):
        reference(q, k, v, cu, cu, 5, 5, None, 0.1)  # scale and window_size are keyword-only
