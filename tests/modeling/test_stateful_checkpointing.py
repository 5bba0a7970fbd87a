"""Gradient checkpointing recomputes state-carrying layers with the boundaries of the forward they belong to.

Two forwards before one backward (gradient accumulation in one graph, or two losses summed) is where boundaries kept
as model state go wrong: the recompute of the first forward would see the second forward's boundaries.
"""

import copy

import pytest
import torch

from flatcollate import DataCollatorWithFlattening
from flatcollate.modeling import prepare_model_for_flattening
from flatcollate.testing import tiny_causal_lm

pytestmark = pytest.mark.slow


def batch(lengths, seed):
    generator = torch.Generator().manual_seed(seed)
    return DataCollatorWithFlattening()(
        [{"input_ids": torch.randint(0, 256, (n,), generator=generator).tolist()} for n in lengths]
    )


def summed_loss_grads(model, batches) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    sum(model(**b).loss for b in batches).backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("use_reentrant", [True, False], ids=["reentrant", "non-reentrant"])
@pytest.mark.parametrize("family", ["mamba2", "jamba", "qwen3_next"])
def test_two_forwards_then_one_backward_match_without_checkpointing(family, use_reentrant):
    batches = [batch([7, 1, 12, 4], seed=0), batch([3, 9, 2], seed=1)]
    reference = prepare_model_for_flattening(tiny_causal_lm(family, seed=0)).train()
    checkpointed = copy.deepcopy(reference)
    checkpointed.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": use_reentrant})
    assert any(getattr(m, "gradient_checkpointing", False) for m in checkpointed.modules())

    expected = summed_loss_grads(reference, batches)
    got = summed_loss_grads(checkpointed, batches)
    assert got.keys() == expected.keys()
    for name, grad in expected.items():
        torch.testing.assert_close(got[name], grad, atol=1e-5, rtol=0, msg=name)


def test_checkpointing_enabled_after_a_forward_still_recomputes_with_the_right_boundaries():
    # Trainer enables checkpointing at train() time, after prepare and possibly after earlier forwards.
    batches = [batch([5, 8], seed=2), batch([2, 2, 9], seed=3)]
    reference = prepare_model_for_flattening(tiny_causal_lm("mamba2", seed=1)).train()
    checkpointed = copy.deepcopy(reference)
    checkpointed(**batches[0])
    checkpointed.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    expected, got = summed_loss_grads(reference, batches), summed_loss_grads(checkpointed, batches)
    for name, grad in expected.items():
        torch.testing.assert_close(got[name], grad, atol=1e-5, rtol=0, msg=name)
