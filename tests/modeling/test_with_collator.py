"""End to end: the flattening collator's batch through a prepared model equals each sequence run alone."""

import itertools

import pytest
import torch

from flatcollate import DataCollatorWithFlattening
from flatcollate._conventions import IGNORE_INDEX
from flatcollate.modeling import prepare_model_for_flattening
from flatcollate.testing import tiny_causal_lm


@pytest.mark.parametrize(("family", "overrides"), [("qwen2", {}), ("mistral", {"sliding_window": 3})])
def test_collated_batch_logits_loss_and_gradients_match_each_sequence_alone(family, overrides):
    generator = torch.Generator().manual_seed(1)
    lengths = [9, 1, 5, 12, 2]
    features = [{"input_ids": torch.randint(0, 256, (n,), generator=generator).tolist()} for n in lengths]
    batch = DataCollatorWithFlattening()(features)
    assert "attention_mask" not in batch
    model = prepare_model_for_flattening(tiny_causal_lm(family, **overrides))

    out = model(**batch)
    out.loss.backward()
    flat_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)

    # Reference: one forward per sequence, summed token losses over the same label count.
    bounds = batch["cu_seq_lens_q"].tolist()
    logits, total = [], 0.0
    for start, end in itertools.pairwise(bounds):
        seq_logits = model(input_ids=batch["input_ids"][:, start:end]).logits
        labels = batch["labels"][0, start + 1 : end]
        total = total + torch.nn.functional.cross_entropy(seq_logits[0, :-1], labels, reduction="sum")
        logits.append(seq_logits)
    count = (batch["labels"][0, 1:] != IGNORE_INDEX).sum()
    loss = total / count
    loss.backward()

    torch.testing.assert_close(out.logits, torch.cat(logits, dim=1), atol=1e-5, rtol=0)
    torch.testing.assert_close(out.loss, loss, atol=1e-5, rtol=0)
    for name, grad in flat_grads.items():
        torch.testing.assert_close(grad, model.get_parameter(name).grad, atol=1e-5, rtol=0, msg=name)
