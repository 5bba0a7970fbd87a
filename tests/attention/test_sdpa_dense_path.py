"""The sdpa kernel on rows with nothing to pad: sequences already in batch order run on views of the row (no gathers),
and still match the slow per-sequence reference on outputs and gradients."""

import numpy as np
import pytest
import torch

from flatcollate.attention import length_batches
from flatcollate.attention.kernels import sdpa_kernel
from flatcollate.boundaries import Boundaries, lengths_to_cu_seqlens
from flatcollate.testing.reference_kernels import varlen_attention

DENSE = {
    "equal": [16, 16, 16, 16],
    "one_sequence": [37],
    "length_one": [1, 1, 1],
    "descending_equal_groups": [12, 12, 12, 5, 5, 1],  # batches of 12, 5 and 1: each already contiguous
}
GATHERED = {
    "ragged": [5, 12, 1, 9],
    "equal_with_padding_inside_a_batch": [16, 15, 16],
}


def _run(lengths, *, window=None, softcap=None):
    generator = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(sum(lengths), h, 16, generator=generator, requires_grad=True) for h in (4, 2, 2))
    cu = torch.from_numpy(lengths_to_cu_seqlens(np.array(lengths)))
    out = sdpa_kernel(
        q, k, v, Boundaries(cu, max(lengths)), scale=0.3, window=window, softcap=softcap, dropout=0.0
    )
    bounds = cu.tolist()
    expected = varlen_attention(
        q, k, v, bounds, bounds, scale=0.3, left=-1 if window is None else window - 1, right=0, softcap=softcap or 0
    )
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    grad = torch.randn_like(out)
    for got, want in zip(
        torch.autograd.grad(out, (q, k, v), grad), torch.autograd.grad(expected, (q, k, v), grad), strict=True
    ):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


class CountedGather:
    """Counts the gathers into and out of length batches."""

    def __init__(self, monkeypatch):
        self.calls = 0
        for name in ("ToSlots", "FromSlots"):
            original = getattr(length_batches, name).apply
            monkeypatch.setattr(getattr(length_batches, name), "apply", self._counted(original))

    def _counted(self, original):
        def apply(*args):
            self.calls += 1
            return original(*args)

        return apply


@pytest.mark.parametrize("mix", DENSE)
@pytest.mark.parametrize("options", [{}, {"window": 5}, {"softcap": 2.0}])
def test_rows_already_in_batch_order_take_no_gather_and_match_the_reference(monkeypatch, mix, options):
    gathers = CountedGather(monkeypatch)
    _run(DENSE[mix], **options)
    assert gathers.calls == 0
    assert length_batches.group_plan(Boundaries.from_lengths(DENSE[mix])).in_place


@pytest.mark.parametrize("mix", GATHERED)
def test_other_rows_are_gathered_and_match_the_reference(monkeypatch, mix):
    gathers = CountedGather(monkeypatch)
    _run(GATHERED[mix], window=4)
    assert gathers.calls == 4  # q, k, v in; the output back
