"""The mask-builder patch: exact for the prepared model only, inert for every other model of the family."""

import itertools

import pytest
import torch

from flatcollate.check.text import flattened_inputs
from flatcollate.modeling import prepare_model_for_flattening
from flatcollate.testing import tiny_causal_lm

LENGTHS = (5, 1, 8)


def _flat_and_alone(model, batch):
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    flat = model(**inputs, use_cache=False).logits
    bounds = batch["cu_seq_lens_q"].tolist()
    alone = [model(input_ids=batch["input_ids"][:, s:e], use_cache=False).logits for s, e in itertools.pairwise(bounds)]
    return flat, torch.cat(alone, dim=1)


@pytest.mark.parametrize("family", ["falcon", "bloom"])
def test_prepared_model_exact_other_models_untouched(family):
    batch = flattened_inputs(LENGTHS, 256, seed=0)
    prepared = prepare_model_for_flattening(tiny_causal_lm(family))
    assert prepared.config._attn_implementation != "flatcollate"  # its layers ignore the attention interface
    flat, alone = _flat_and_alone(prepared, batch)
    torch.testing.assert_close(flat, alone, atol=1e-5, rtol=0)

    untouched = tiny_causal_lm(family)  # same module, now patched, but this model was not prepared
    flat, alone = _flat_and_alone(untouched, batch)
    assert (flat - alone).abs().max() > 1e-3


def test_padding_mask_of_ordinary_batches_is_still_honoured():
    model = prepare_model_for_flattening(tiny_causal_lm("falcon"))
    ids = torch.randint(0, 256, (2, 6))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0  # left padding on row 0
    padded = model(input_ids=ids, attention_mask=mask).logits
    alone = model(input_ids=ids[:1, 2:]).logits
    torch.testing.assert_close(padded[:1, 2:], alone, atol=1e-5, rtol=0)
