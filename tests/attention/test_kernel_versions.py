"""Older builds of the varlen libraries and the Hub kernels, on CPU through the references: flatcollate calls each
with what its signature has and reads what it returns, routes around an argument a build lacks, and trains through a
Hub kernel only where its backward checks out.

Each stand-in is the reference kernel with the older build's signature or return value (flash-attention's history:
FA3 returns `(out, lse)` before 2025-07-11 and has no `softcap` before 2025-01; FA4 has no `max_seqlen_q/k` from
2025-08 to 2026-01-07 and reads a window of -1 literally before 2026-02-23; vLLM's FA3 on the Hub returns 23
gradients for 25 inputs).
"""

import warnings

import pytest
import torch

from flatcollate.attention import capabilities, features, select_kernel
from flatcollate.testing.reference_flash_attn import flash_attn_3_varlen_func, flash_attn_4_varlen_func

from . import test_cuda_paths_model as paths

reference_cuda = paths.reference_cuda  # the fixture: a Hopper GPU in fp32 with one kernel installed
EXACT = 1e-5


def fa3_before_2025_01():
    """FA3 without `softcap`, returning `(out, lse)` as builds before 2025-07-11 do."""
    reference = flash_attn_3_varlen_func(paths.CPU_FP32)

    def flash_attn_varlen_func(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale=None, causal=False,
        window_size=(-1, -1),
    ):  # fmt: skip
        bounds = (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
        return reference(q, k, v, *bounds, softmax_scale=softmax_scale, causal=causal, window_size=window_size), None

    return flash_attn_varlen_func


def fa4_without_max_seqlen():
    """FA4 as built from 2025-08 to 2026-01-07: no `max_seqlen_q/k` (a TypeError if passed)."""
    reference = flash_attn_4_varlen_func(paths.CPU_FP32)

    def flash_attn_varlen_func(
        q, k, v, cu_seqlens_q=None, cu_seqlens_k=None, softmax_scale=None, causal=False, window_size=(None, None),
        learnable_sink=None, softcap=0.0,
    ):  # fmt: skip
        longest = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max())
        return reference(
            q, k, v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=longest,
            max_seqlen_k=longest, softmax_scale=softmax_scale, causal=causal, window_size=window_size,
            learnable_sink=learnable_sink, softcap=softcap,
        )  # fmt: skip

    return flash_attn_varlen_func


def fa4_reading_minus_one_literally():
    """FA4 as built before 2026-02-23: a window of -1 keys is taken literally, so `(-1, -1)` attends to nothing."""
    reference = flash_attn_4_varlen_func(paths.CPU_FP32)

    def flash_attn_varlen_func(q, k, v, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
                               softmax_scale=None, causal=False, window_size=(None, None), learnable_sink=None,
                               softcap=0.0):  # fmt: skip
        out, lse = reference(q, k, v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                             max_seqlen_k=max_seqlen_k, softmax_scale=softmax_scale, causal=causal,
                             window_size=window_size, learnable_sink=learnable_sink, softcap=softcap)  # fmt: skip
        return (torch.zeros_like(out) if window_size[0] == -1 else out), lse

    return flash_attn_varlen_func


class _TooFewGradients(torch.autograd.Function):
    """The output of a varlen call whose backward returns one gradient fewer than its inputs, as vLLM's FA3 does."""

    @staticmethod
    def forward(ctx, out, q, k, v):
        return out.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


def vllm_fa3_on_the_hub():
    reference = flash_attn_3_varlen_func(paths.CPU_FP32)

    def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale=None,
                               causal=False, window_size=(-1, -1), softcap=0.0, s_aux=None):  # fmt: skip
        out = reference(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale=softmax_scale,
                        causal=causal, window_size=window_size, softcap=softcap)  # fmt: skip
        return _TooFewGradients.apply(out, q, k, v), None

    return flash_attn_varlen_func


def install(monkeypatch, attribute, function):
    counted = paths.Counted(function)
    if attribute is None:
        monkeypatch.setattr(capabilities, "transformers_varlen", lambda: ("kernels-community/test", counted))
    else:
        monkeypatch.setattr(capabilities, attribute, counted)
    real_parameters = capabilities.parameters
    monkeypatch.setattr(capabilities, "parameters", lambda f: real_parameters(function if f is counted else f))
    takes = capabilities.takes
    monkeypatch.setattr(capabilities, "takes", lambda f, name: takes(function if f is counted else f, name))
    return counted


def test_an_fa3_build_returning_out_and_lse_is_exact(reference_cuda, monkeypatch):
    kernel = install(monkeypatch, "flash_attn_3_varlen_func", fa3_before_2025_01())
    gaps = paths.flat_vs_alone("llama")
    assert kernel.calls == 2 and max(gaps.values()) <= EXACT, gaps


def test_a_soft_capped_layer_goes_around_an_fa3_build_without_softcap_with_one_warning(reference_cuda, monkeypatch):
    kernel = install(monkeypatch, "flash_attn_3_varlen_func", fa3_before_2025_01())
    features._warn_older_build.cache_clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gaps = paths.flat_vs_alone("gemma2_window_softcap")
    assert kernel.calls == 0 and max(gaps.values()) <= EXACT, gaps
    named = ("`flash_attn_3` (", "version unknown) has no soft-capping")  # a module no distribution lists
    older = [str(w.message) for w in caught if all(part in str(w.message) for part in named)]
    assert len(older) == 1, [str(w.message) for w in caught]
    gaps = paths.flat_vs_alone("gemma2_window")  # no soft-cap: the same build takes it
    assert kernel.calls == 2 and max(gaps.values()) <= EXACT, gaps


def test_an_fa4_build_without_max_seqlen_is_exact(reference_cuda, monkeypatch):
    kernel = install(monkeypatch, "flash_attn_4_varlen_func", fa4_without_max_seqlen())
    gaps = paths.flat_vs_alone("gpt_oss_sinks")
    assert kernel.calls == 2 and max(gaps.values()) <= EXACT, gaps


def test_an_fa4_build_on_the_hub_gets_no_window_in_its_own_spelling(reference_cuda, monkeypatch):
    kernel = install(monkeypatch, None, fa4_reading_minus_one_literally())
    gaps = paths.flat_vs_alone("llama")
    assert kernel.calls >= 2 and max(gaps.values()) <= EXACT, gaps


def test_a_hub_kernel_whose_backward_fails_is_not_trained_through(reference_cuda, monkeypatch):
    kernel = install(monkeypatch, None, vllm_fa3_on_the_hub())
    query = torch.zeros(8, 2, 32, requires_grad=True)
    assert select_kernel(query, softcap=None, dropout=0.0) == "sdpa"  # the backward check ran the kernel once
    assert kernel.calls == 1
    with torch.no_grad():
        assert select_kernel(query, softcap=None, dropout=0.0) == "hub"  # inference: its forward is right
    gaps = paths.flat_vs_alone("llama")  # trains through sdpa
    assert max(gaps.values()) <= EXACT, gaps
    with pytest.raises(ValueError, match=r"kernels-community/test\) cannot train: its backward raises .*flash-attn"):
        from flatcollate.attention.selection import forced_kernel

        forced_kernel("hub", query, softcap=None, dropout=0.0, sinks=False, window=None, scale=None)


def test_a_hub_kernel_whose_backward_checks_out_is_trained_through(reference_cuda, monkeypatch):
    kernel = install(monkeypatch, None, flash_attn_3_varlen_func(paths.CPU_FP32))
    gaps = paths.flat_vs_alone("llama")
    assert kernel.calls == 1 + 2 and max(gaps.values()) <= EXACT, gaps  # the check, then two layers
