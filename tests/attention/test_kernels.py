"""Each CPU-runnable packed kernel against a dense reference: outputs and gradients, ragged lengths, GQA, windows."""

import itertools
import math

import numpy as np
import pytest
import torch

from flatcollate.attention import packed_attention_forward
from flatcollate.attention.kernels import flex_kernel, sdpa_kernel
from flatcollate.boundaries import Boundaries, lengths_to_cu_seqlens


def reference_attention(query, key, value, lengths, *, scale, window=None, softcap=None, sinks=None):
    """Slow, obviously correct packed attention: a loop over sequences, each a float64 softmax with an explicit mask.

    query `(T, Hq, D)`, key/value `(T, Hkv, D)`; returns `(T, Hq, D)` in the query's dtype.
    """
    groups = query.shape[1] // key.shape[1]
    outputs, start = [], 0
    for length in lengths:  # one sequence at a time: nothing can leak across boundaries
        q = query[start : start + length].double().transpose(0, 1)
        k = key[start : start + length].double().repeat_interleave(groups, dim=1).transpose(0, 1)
        v = value[start : start + length].double().repeat_interleave(groups, dim=1).transpose(0, 1)
        scores = q @ k.transpose(-1, -2) * scale
        if softcap is not None:
            scores = softcap * torch.tanh(scores / softcap)
        i = torch.arange(length)[:, None]
        j = torch.arange(length)[None, :]
        allowed = j <= i
        if window is not None:
            allowed &= i - j < window
        scores = scores.masked_fill(~allowed, float("-inf"))
        if sinks is not None:  # one extra logit per head that takes part in the softmax and carries no value
            scores = torch.cat([scores, sinks.double()[:, None, None].expand(-1, length, 1)], dim=-1)
        probs = torch.softmax(scores, dim=-1)[..., :length]
        outputs.append((probs @ v).transpose(0, 1))
        start += length
    return torch.cat(outputs).to(query.dtype)


def make_inputs(lengths, *, heads=4, kv_heads=2, head_dim=16, seed=0, requires_grad=False):
    generator = torch.Generator().manual_seed(seed)
    total = sum(lengths)
    tensors = [
        torch.randn(total, h, head_dim, generator=generator, requires_grad=requires_grad)
        for h in (heads, kv_heads, kv_heads)
    ]
    cu = torch.from_numpy(lengths_to_cu_seqlens(np.array(lengths)))
    return tensors, Boundaries(cu_seqlens=cu, max_length=max(lengths))


LENGTH_MIXES = {
    "ragged": [37, 1, 23, 16, 5],
    "length_one": [1],
    "one_sequence": [61],
    "many_tiny": [1, 2, 1, 3, 1, 1, 2, 1, 1, 4],
    "random": np.random.default_rng(7).integers(1, 60, size=12).tolist(),
}
CASES = [
    {"heads": 4, "kv_heads": 4},
    {"heads": 4, "kv_heads": 2},
    {"heads": 6, "kv_heads": 1},
    {"heads": 4, "kv_heads": 2, "window": 7},
    {"heads": 4, "kv_heads": 2, "softcap": 5.0},
    {"heads": 4, "kv_heads": 1, "softcap": 3.0, "window": 4},
]


def _run(kernel, case, lengths, *, requires_grad=False):
    (q, k, v), segments = make_inputs(
        lengths, heads=case["heads"], kv_heads=case["kv_heads"], head_dim=24, requires_grad=requires_grad
    )
    options = {"scale": 0.3, "window": case.get("window"), "softcap": case.get("softcap")}
    out = kernel(q, k, v, segments, dropout=0.0, **options)
    expected = reference_attention(q, k, v, lengths, **options)
    return (q, k, v), out, expected


@pytest.mark.parametrize(("mix", "case"), itertools.product(LENGTH_MIXES, range(len(CASES))))
def test_sdpa_kernel_matches_reference_outputs_and_gradients(mix, case):
    lengths = LENGTH_MIXES[mix]
    inputs, out, expected = _run(sdpa_kernel, CASES[case], lengths, requires_grad=True)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    grad_out = torch.randn_like(out)
    got = torch.autograd.grad(out, inputs, grad_out)
    want = torch.autograd.grad(expected, inputs, grad_out)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_kernel_forward_matches_reference_on_cpu(case):
    lengths = LENGTH_MIXES["ragged"]
    with torch.no_grad():
        _, out, expected = _run(flex_kernel, CASES[case], lengths)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_window_exactly_the_sequence_length_is_plain_causal():
    lengths = [16, 16]
    _, out, expected = _run(sdpa_kernel, {"heads": 2, "kv_heads": 2, "window": 16}, lengths)
    _, plain, _ = _run(sdpa_kernel, {"heads": 2, "kv_heads": 2}, lengths)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out, plain)


def test_boundaries_that_do_not_cover_the_row_raise():
    (q, k, v), _ = make_inputs([4, 4])
    short = Boundaries(cu_seqlens=torch.tensor([0, 4, 7], dtype=torch.int32), max_length=4)
    with pytest.raises(ValueError, match="covers 7 tokens but the row holds 8"):
        sdpa_kernel(q, k, v, short, scale=0.25, window=None, softcap=None, dropout=0.0)


def test_dropout_in_sdpa_kernel_is_applied_in_training():
    (q, k, v), segments = make_inputs([40, 24])
    torch.manual_seed(0)
    dropped = sdpa_kernel(q, k, v, segments, scale=0.25, window=None, softcap=None, dropout=0.5)
    plain = sdpa_kernel(q, k, v, segments, scale=0.25, window=None, softcap=None, dropout=0.0)
    assert not torch.allclose(dropped, plain)


def test_forward_function_layout_and_default_scale():
    lengths = [9, 1, 14]
    (q, k, v), segments = make_inputs(lengths, heads=4, kv_heads=2, head_dim=16)
    module = torch.nn.Module()
    out, weights = packed_attention_forward(
        module,
        q.transpose(0, 1).unsqueeze(0),
        k.transpose(0, 1).unsqueeze(0),
        v.transpose(0, 1).unsqueeze(0),
        None,
        cu_seq_lens_q=segments.cu_seqlens,
        cu_seq_lens_k=segments.cu_seqlens,
        max_length_q=14,
        max_length_k=14,
    )
    assert weights is None
    assert out.shape == (1, 24, 4, 16)
    expected = reference_attention(q, k, v, lengths, scale=1 / math.sqrt(16))
    torch.testing.assert_close(out[0], expected, atol=1e-5, rtol=1e-5)


def test_group_plan_batches_similar_lengths_and_covers_every_token_once():
    from flatcollate.attention.length_batches import group_plan

    lengths = [8, 8, 3, 7, 1, 4]
    cu = torch.from_numpy(lengths_to_cu_seqlens(np.array(lengths)))
    plan = group_plan(Boundaries(cu, int(cu.diff().max())))
    assert plan.batches == [(0, 3, 8), (24, 2, 4), (32, 1, 1)]
    real = plan.real.reshape(-1).bool()
    assert sorted(plan.slot_token[real].tolist()) == list(range(sum(lengths)))  # every token in exactly one slot
    assert torch.equal(plan.slot_token[plan.token_slot], torch.arange(sum(lengths)))


@pytest.mark.parametrize("window", [None, 5])
def test_sdpa_kernel_attention_sinks_match_reference_with_gradients(window):
    lengths = [13, 1, 8]
    (q, k, v), segments = make_inputs(lengths, heads=4, kv_heads=2, requires_grad=True)
    sinks = torch.randn(4, requires_grad=True)
    options = {"scale": 0.3, "window": window, "softcap": None}
    out = sdpa_kernel(q, k, v, segments, dropout=0.0, sinks=sinks, **options)
    expected = reference_attention(q, k, v, lengths, sinks=sinks, **options)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    grad_out = torch.randn_like(out)
    for got, want in zip(
        torch.autograd.grad(out, (q, k, v, sinks), grad_out),
        torch.autograd.grad(expected, (q, k, v, sinks), grad_out),
        strict=True,
    ):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_kernels_without_sinks_refuse_them():
    (q, k, v), segments = make_inputs([4])
    with pytest.raises(ValueError, match="`flex` packed kernel has no attention sinks"):
        flex_kernel(q, k, v, segments, scale=0.3, window=None, softcap=None, dropout=0.0, sinks=torch.zeros(4))


def test_the_block_mask_cache_is_keyed_by_device():
    """One boundaries tensor, two devices (a model moved between calls): each gets a block mask on its own device."""
    from flatcollate.attention.kernels import _document_block_mask

    segments = Boundaries(torch.tensor([0, 3, 8], dtype=torch.int32), 5)
    on_cpu = _document_block_mask(segments, 8, None, torch.device("cpu"))
    on_meta = _document_block_mask(segments, 8, None, torch.device("meta"))
    assert on_cpu.kv_num_blocks.device.type == "cpu" and on_meta.kv_num_blocks.device.type == "meta"
    assert _document_block_mask(segments, 8, None, torch.device("cpu")).kv_num_blocks.device.type == "cpu"


def test_flex_runs_on_fa4s_cute_kernels_where_torch_offers_them(monkeypatch):
    from flatcollate.attention import capabilities, kernels

    monkeypatch.setattr(capabilities, "HAS_FLEX_FLASH", True)
    half, plain = torch.zeros(6, 2, 64, dtype=torch.bfloat16), {"softcap": None, "window": None}
    assert kernels.flex_kernel_options(half, **plain) is None  # eager CPU flex has no such backend
    monkeypatch.setattr(capabilities, "is_cuda_tensor", lambda tensor: True)
    monkeypatch.setattr(capabilities, "compute_capability", lambda tensor: (9, 0))
    assert kernels.flex_kernel_options(half, **plain) == {"BACKEND": "FLASH"}
    # The FLASH lowering calls FA4: half precision, a backward on sm 90+, no captured soft-cap or window
    assert kernels.flex_kernel_options(half.float(), **plain) is None
    assert kernels.flex_kernel_options(half, softcap=30.0, window=None) is None
    assert kernels.flex_kernel_options(half, softcap=None, window=64) is None
    monkeypatch.setattr(capabilities, "compute_capability", lambda tensor: (8, 0))
    assert kernels.flex_kernel_options(half, **plain) is None
    monkeypatch.setattr(capabilities, "compute_capability", lambda tensor: (9, 0))
    monkeypatch.setattr(capabilities, "HAS_FLEX_FLASH", False)
    assert kernels.flex_kernel_options(half, **plain) is None
    monkeypatch.setattr(capabilities, "is_cuda_tensor", lambda tensor: False)
    seen = []

    def recording(*args, kernel_options=None, **kwargs):
        seen.append(kernel_options)
        return torch.zeros_like(args[0])

    monkeypatch.setattr(kernels, "_flex_attention", lambda device_type: recording)
    q = torch.zeros(6, 2, 8)
    flex_kernel(
        q,
        q,
        q,
        Boundaries(torch.tensor([0, 2, 6], dtype=torch.int32), 4),
        scale=1.0,
        window=None,
        softcap=None,
        dropout=0.0,
    )
    assert seen == [None]
