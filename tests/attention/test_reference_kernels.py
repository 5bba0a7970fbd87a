"""The references of the CUDA varlen kernels: their masks as the upstream docstrings draw them, the preconditions they
refuse, and (on a CUDA machine with the kernels installed) the real kernels against them."""

import numpy as np
import pytest
import torch

from flatcollate.attention import capabilities
from flatcollate.attention.features import wrong_gradients
from flatcollate.attention.kernels import sdpa_kernel
from flatcollate.boundaries import Boundaries, lengths_to_cu_seqlens
from flatcollate.testing.reference_flash_attn import flash_attn_4_varlen_func, flash_attn_varlen_func
from flatcollate.testing.reference_kernels import KernelContract, varlen_attn, varlen_attn_like

CPU_FP32 = KernelContract(dtypes=(torch.float32,), device_type="cpu")


def _cu(lengths, device="cpu"):
    return torch.from_numpy(lengths_to_cu_seqlens(np.array(lengths))).to(device)


def _mask_of(kernel, seqlen_q, seqlen_k, **options):
    """The keep-mask a kernel applies, read off its output: zero queries give uniform weights over the kept keys,
    and one-hot values make row `i` of the output `kept[i] / kept[i].sum()` (all zero where nothing is kept)."""
    q = torch.zeros(seqlen_q, 1, 8)
    k = torch.zeros(seqlen_k, 1, 8)
    v = torch.eye(seqlen_k, 8)[:, None, :]
    cu_q = torch.tensor([0, seqlen_q], dtype=torch.int32)
    cu_k = torch.tensor([0, seqlen_k], dtype=torch.int32)
    out = kernel(q, k, v, cu_q, cu_k, seqlen_q, seqlen_k, **options)
    return (out[:, 0, :seqlen_k] > 0).int().tolist()


def test_flash_attn_causal_mask_is_aligned_to_the_bottom_right_as_documented():
    flash = flash_attn_varlen_func(CPU_FP32)
    # The two masks drawn in `flash_attn_varlen_func`'s docstring.
    assert _mask_of(flash, 2, 5, causal=True) == [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    assert _mask_of(flash, 5, 2, causal=True) == [[0, 0], [0, 0], [0, 0], [1, 0], [1, 1]]
    assert _mask_of(flash, 3, 3) == [[1, 1, 1]] * 3  # causal=False, no window: full attention


def test_window_keeps_left_keys_before_the_query_and_right_after():
    flash, torch_varlen = flash_attn_varlen_func(CPU_FP32), varlen_attn(CPU_FP32)
    band = [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [0, 1, 1, 1, 0], [0, 0, 1, 1, 1]]
    assert _mask_of(flash, 5, 5, causal=True, window_size=(2, 0)) == band
    assert _mask_of(flash, 5, 5, causal=True, window_size=(2, 3)) == band  # causal forces right = 0
    assert _mask_of(flash, 5, 5, window_size=(2, 0)) == band
    assert _mask_of(torch_varlen, 5, 5, window_size=(2, 0)) == band  # "(W, 0) for causal ... window of size W"
    assert _mask_of(torch_varlen, 5, 5, window_size=(-1, 0)) == np.tril(np.ones((5, 5), int)).tolist()
    assert _mask_of(torch_varlen, 3, 3) == [[1, 1, 1]] * 3  # (-1, -1) by default: full attention
    assert _mask_of(flash, 3, 3, window_size=(0, 1)) == [[1, 1, 0], [0, 1, 1], [0, 0, 1]]


@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("softcap", [0.0, 2.0])
def test_flash_reference_matches_the_sdpa_kernel_with_gradients(window, softcap):
    lengths = [97, 1, 13, 40]
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(sum(lengths), h, 16, generator=generator, requires_grad=True) for h in (6, 2, 2))
    segments = Boundaries(cu_seqlens=_cu(lengths), max_length=97)
    expected = sdpa_kernel(q, k, v, segments, scale=0.3, window=window, softcap=softcap or None, dropout=0.0)
    out = flash_attn_varlen_func(CPU_FP32)(
        q=q,
        k=k,
        v=v,
        cu_seqlens_q=segments.cu_seqlens,
        cu_seqlens_k=segments.cu_seqlens,
        max_seqlen_q=97,
        max_seqlen_k=97,
        softmax_scale=0.3,
        causal=True,
        window_size=(-1, -1) if window is None else (window - 1, 0),
        softcap=softcap,
    )
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    grad = torch.randn_like(out)
    for got, want in zip(
        torch.autograd.grad(out, (q, k, v), grad), torch.autograd.grad(expected, (q, k, v), grad), strict=True
    ):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def _valid_inputs():
    q = torch.randn(7, 4, 16, dtype=torch.bfloat16)
    k, v = (torch.randn(7, 2, 16, dtype=torch.bfloat16) for _ in range(2))
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    return {"q": q, "k": k, "v": v, "cu_seqlens_q": cu, "cu_seqlens_k": cu, "max_seqlen_q": 4, "max_seqlen_k": 4}


BF16_CPU = KernelContract(device_type="cpu")
BAD_INPUTS = {
    "fp32": ({"q": lambda x: x.float(), "k": lambda x: x.float(), "v": lambda x: x.float()}, "only supports"),
    "mixed dtypes": ({"k": lambda x: x.half()}, "same dtype"),
    "int64 cu_seqlens": ({"cu_seqlens_q": lambda x: x.long()}, "cu_seqlens_q must have dtype int32"),
    "decreasing cu_seqlens": (
        {"cu_seqlens_k": lambda x: torch.tensor([0, 5, 3, 7], dtype=torch.int32)},
        "non-decreasing",
    ),
    "not covering the row": ({"cu_seqlens_q": lambda x: torch.tensor([0, 3, 6], dtype=torch.int32)}, "from 0 to 7"),
    "max_seqlen a tensor": ({"max_seqlen_q": lambda x: torch.tensor(4)}, "must be a Python int"),
    "max_seqlen too small": ({"max_seqlen_k": lambda x: 3}, "below the longest sequence 4"),
    "(B, T, H, D) layout": ({"q": lambda x: x[None]}, r"must be \(total, heads, head_dim\)"),
    "strided last dim": ({"q": lambda x: x.transpose(1, 2).contiguous().transpose(1, 2)}, "contiguous last dim"),
    "head dim 264": ({key: lambda x: torch.zeros(7, x.shape[1], 264, dtype=x.dtype) for key in "qkv"}, "at most 256"),
    "head dim 12": ({key: lambda x: x[..., :12] for key in "qkv"}, "multiple of 8"),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_every_kernel_precondition_is_refused(case):
    changes, message = BAD_INPUTS[case]
    inputs = _valid_inputs()
    flash_attn_varlen_func(BF16_CPU)(**inputs)  # the unchanged inputs pass
    inputs |= {key: change(inputs[key]) for key, change in changes.items()}
    with pytest.raises(RuntimeError, match=message):
        flash_attn_varlen_func(BF16_CPU)(**inputs)
    # varlen_attn reads the head counts in Python first: a 4-D query fails its GQA check with a ValueError.
    error, message = (ValueError, "multiple of kv heads") if case == "(B, T, H, D) layout" else (RuntimeError, message)
    with pytest.raises(error, match=message):
        varlen_attn(BF16_CPU)(*inputs.values(), enable_gqa=True)


def test_cuda_contract_refuses_cpu_tensors_and_cu_seqlens_on_another_device():
    inputs = _valid_inputs()
    with pytest.raises(RuntimeError, match="q must be on cuda"):
        flash_attn_varlen_func()(**inputs)
    meta = inputs | {"cu_seqlens_k": inputs["cu_seqlens_k"].to("meta")}
    with pytest.raises(RuntimeError, match="cu_seqlens_k must be on cpu"):
        flash_attn_varlen_func(BF16_CPU)(**meta)


def test_torch_varlen_needs_enable_gqa_and_flash_refuses_softcap_with_dropout():
    inputs = _valid_inputs()
    with pytest.raises(ValueError, match="Try setting enable_gqa=True"):
        varlen_attn(BF16_CPU)(*inputs.values())
    with pytest.raises(RuntimeError, match="Number of heads in key/value must divide"):
        flash_attn_varlen_func(BF16_CPU)(**inputs | {"q": torch.zeros(7, 3, 16, dtype=torch.bfloat16)})
    with pytest.raises(ValueError, match="multiple of kv heads"):
        varlen_attn(BF16_CPU)(torch.zeros(7, 3, 16, dtype=torch.bfloat16), *list(inputs.values())[1:], enable_gqa=True)
    with pytest.raises(RuntimeError, match="Softcapping does not support dropout"):
        flash_attn_varlen_func(BF16_CPU)(**inputs, dropout_p=0.1, softcap=5.0)
    with pytest.raises(NotImplementedError, match="no dropout"):
        flash_attn_varlen_func(BF16_CPU)(**inputs, dropout_p=0.1)
    with pytest.raises(RuntimeError, match="window_size must have length 2"):
        flash_attn_varlen_func(BF16_CPU)(**inputs, window_size=3)


# On a CUDA machine: the real kernels against the references, outputs and gradients, on awkward lengths in bf16.
# Tolerance as in flash-attn's own tests: twice the error of the same reference computed in bf16.
needs_cuda = pytest.mark.skipif(not capabilities.HAS_CUDA, reason="needs a CUDA device")
REAL_DEVICE = "cuda"
EXACT, ROUGH = KernelContract(), KernelContract(compute_dtype=torch.bfloat16)
REAL_CASES = [
    {"causal": True, "window_size": (-1, -1), "softcap": 0.0},
    {"causal": True, "window_size": (63, 0), "softcap": 0.0},
    {"causal": True, "window_size": (-1, -1), "softcap": 2.0},  # scores reach about 5: the cap bites
    {"causal": True, "window_size": (-1, -1), "softcap": 0.0, "softmax_scale": 0.05},
]


def _compare_real(call, real_kernel, reference_kernel, lengths=(1025, 97, 1, 300), heads=(8, 2), head_dim=64):
    """`call(kernel, q, k, v, cu, longest)` with the real kernel and with the reference in float64 and in bf16."""
    generator = torch.Generator(device=REAL_DEVICE).manual_seed(0)
    inputs = [
        torch.randn(sum(lengths), h, head_dim, device=REAL_DEVICE, dtype=torch.bfloat16, generator=generator)
        for h in (heads[0], heads[1], heads[1])
    ]
    inputs = [t.requires_grad_() for t in inputs]
    cu = _cu(lengths, REAL_DEVICE)
    outs = [
        call(kernel, *inputs, cu, max(lengths))
        for kernel in (real_kernel, reference_kernel(EXACT), reference_kernel(ROUGH))
    ]
    grad = torch.randn_like(outs[0])
    triples = [outs, *zip(*(torch.autograd.grad(out, inputs, grad) for out in outs), strict=True)]
    for name, (got, exact, rough) in zip(("out", "dq", "dk", "dv"), triples, strict=True):
        error = (got.double() - exact.double()).abs().max().item()
        bound = 2 * (rough.double() - exact.double()).abs().max().item() + 1e-3
        assert error <= bound, f"{name}: the real kernel is off by {error:.3g}, more than {bound:.3g}"


@needs_cuda
@pytest.mark.skipif(capabilities.flash_attn_varlen_func is None, reason="needs flash-attn 2")
@pytest.mark.parametrize("options", REAL_CASES)
def test_real_flash_attn_matches_the_reference(options):
    def call(kernel, q, k, v, cu, longest):
        return kernel(
            q=q, k=k, v=v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=longest, max_seqlen_k=longest, **options
        )

    _compare_real(call, capabilities.flash_attn_varlen_func, flash_attn_varlen_func)


@needs_cuda
@pytest.mark.skipif(capabilities.varlen_attn is None, reason="needs torch varlen_attn")
@pytest.mark.parametrize("window_size", [(-1, 0), (63, 0)])
def test_real_torch_varlen_matches_the_reference(window_size):
    accepted = capabilities.parameters(capabilities.varlen_attn)
    if "window_size" not in accepted and window_size != (-1, 0):
        pytest.skip("this torch's varlen_attn has no window_size")
    options = {"window_size": window_size} if "window_size" in accepted else {"is_causal": True}
    options |= {"enable_gqa": True} if "enable_gqa" in accepted else {}

    def call(kernel, q, k, v, cu, longest):
        return kernel(q, k, v, cu, cu, longest, longest, **options)

    _compare_real(call, capabilities.varlen_attn, varlen_attn_like(capabilities.varlen_attn))


# FA4 (`flash_attn.cute`): windows as `(left, right)` with None for unlimited, sinks as `learnable_sink`, `(out, lse)`.
FA4_CASES = {
    "causal": {"causal": True},
    "window": {"causal": True, "window_size": (63, 0)},
    "softcap": {"causal": True, "softcap": 2.0},
    "scale": {"causal": True, "softmax_scale": 0.05},
    "sinks": {"causal": True, "learnable_sink": 1.5},
}


@needs_cuda
@pytest.mark.skipif(capabilities.flash_attn_4_varlen_func is None, reason="needs flash-attn-4")
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("case", FA4_CASES)
def test_real_flash_attn_4_matches_the_reference(case, head_dim):
    options = dict(FA4_CASES[case])
    if "learnable_sink" in options:  # one sink logit per query head, as gpt-oss passes its `s_aux`
        options["learnable_sink"] = torch.full((8,), options["learnable_sink"], device=REAL_DEVICE)

    _compare_real(
        _fa4_call(options), capabilities.flash_attn_4_varlen_func, flash_attn_4_varlen_func, head_dim=head_dim
    )


def _fa4_call(options):
    def call(kernel, q, k, v, cu, longest):
        bounds = {"cu_seqlens_q": cu, "cu_seqlens_k": cu, "max_seqlen_q": longest, "max_seqlen_k": longest}
        out, _ = kernel(q, k, v, **bounds, **options)
        return out

    return call


@needs_cuda
@pytest.mark.skipif(capabilities.flash_attn_4_varlen_func is None, reason="needs flash-attn-4")
@pytest.mark.parametrize("head_dim", [16, 48])
def test_real_flash_attn_4_trains_wrong_where_flatcollate_passes_it_over(head_dim):
    """The rule `features.wrong_gradients` holds against the installed FA4: where it passes FA4 over, the real query
    gradient is off. When a release fixes it, this fails: lift the rule then."""
    assert wrong_gradients("flash_attn_4", head_dim) is not None
    with pytest.raises(AssertionError, match="dq: the real kernel is off"):
        _compare_real(
            _fa4_call({"causal": True}),
            capabilities.flash_attn_4_varlen_func,
            flash_attn_4_varlen_func,
            head_dim=head_dim,
        )
