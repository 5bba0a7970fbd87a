"""The `sdpa` kernel as one operator (what compiled models call): same outputs and gradients as the per-sequence
reference, a fake that matches the real operator, and the cases the compiled path refuses."""

import pytest
import torch

from flatcollate.attention.compiled_sdpa import compiled_sdpa_kernel, packed_sdpa
from flatcollate.boundaries import cu_seqlens_to_position_ids

from .test_kernels import make_inputs, reference_attention

LENGTHS = [13, 1, 7, 4, 9]
CASES = {
    "gqa": {},
    "window": {"window": 3},
    "softcap": {"softcap": 2.0},
    "sinks": {"sinks": True},
}


def op_arguments(case: dict, *, from_positions: bool = False, chunk: int | None = None):
    (q, k, v), segments = make_inputs(LENGTHS, requires_grad=True, seed=len(case))
    sinks = torch.randn(q.shape[1], requires_grad=True) if case.get("sinks") else None
    cu, positions, longest = segments.cu_seqlens, None, segments.max_length
    host = cu.clone()  # the guard's host copy, a CPU tensor
    if from_positions:
        positions = torch.from_numpy(cu_seqlens_to_position_ids(segments.cu_seqlens.numpy()))[None]
        cu, host, longest = None, None, None
    return (q, k, v, cu, host, positions, longest, 0.3, case.get("window"), case.get("softcap"), sinks, chunk)


@pytest.mark.parametrize("from_positions", [False, True], ids=["cu_seqlens", "position_ids"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_operator_matches_reference_outputs_and_gradients(case, from_positions):
    arguments = op_arguments(CASES[case], from_positions=from_positions)
    q, k, v, *_, window, softcap, sinks, _ = arguments
    out = packed_sdpa(*arguments)
    expected = reference_attention(q, k, v, LENGTHS, scale=0.3, window=window, softcap=softcap, sinks=sinks)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    inputs = [t for t in (q, k, v, sinks) if t is not None]
    grad_out = torch.randn_like(out)
    got = torch.autograd.grad(out, inputs, grad_out)
    want = torch.autograd.grad(expected, inputs, grad_out)
    for name, g, w in zip(("query", "key", "value", "sinks"), got, want, strict=False):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5, msg=name)


def test_chunked_operator_is_attention_over_the_chunks():
    arguments = op_arguments({}, chunk=4)
    q, k, v = arguments[:3]
    chunks = [piece for n in LENGTHS for piece in [4] * (n // 4) + ([n % 4] if n % 4 else [])]
    expected = reference_attention(q, k, v, chunks, scale=0.3)
    torch.testing.assert_close(packed_sdpa(*arguments), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("case", ["gqa", "sinks"])
def test_opcheck_fake_and_autograd_registrations(case):
    # Schema, fake tensor shapes, autograd registration and tracing with dynamic shapes, as torch.compile uses them.
    torch.library.opcheck(packed_sdpa, op_arguments(CASES[case]))


def test_compiled_path_refuses_attention_dropout():
    q, k, v, cu, *_ = op_arguments({})
    options = {"scale": 0.3, "window": None, "softcap": None, "sinks": None, "chunk": None}
    with pytest.raises(ValueError, match=r"Attention dropout \(0.1\).*attention_dropout=0.0"):
        compiled_sdpa_kernel(q, k, v, {"cu_seq_lens_q": cu}, dropout=0.1, **options)
