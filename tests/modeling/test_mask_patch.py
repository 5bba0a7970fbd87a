"""The mask-builder patch: exact for the prepared model only, inert for every other model of the family."""

import itertools
import sys

import pytest
import torch

from flatcollate.check.text import flattened_inputs
from flatcollate.modeling import prepare_model_for_flattening
from flatcollate.testing import tiny_causal_lm

LENGTHS = (5, 1, 8)


def _alone(model, batch, bounds):
    alone = [model(input_ids=batch["input_ids"][:, s:e], use_cache=False).logits for s, e in itertools.pairwise(bounds)]
    return torch.cat(alone, dim=1)


def _flat_and_alone(model, batch):
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    flat = model(**inputs, use_cache=False).logits
    return flat, _alone(model, batch, batch["cu_seq_lens_q"].tolist())


@pytest.mark.parametrize("family", ["falcon", "bloom"])
def test_prepared_model_exact_other_models_untouched(family):
    batch = flattened_inputs(LENGTHS, 256, seed=0)
    prepared = prepare_model_for_flattening(tiny_causal_lm(family))
    assert prepared.config._attn_implementation != "flatcollate"  # its layers ignore the attention interface
    flat, alone = _flat_and_alone(prepared, batch)
    torch.testing.assert_close(flat, alone, atol=1e-5, rtol=0)

    # Negative control: the same logits against the sequences cut one token elsewhere.
    moved = [0, 6, 7, 14]  # (5, 1, 8) with the first boundary one token later
    assert (flat - _alone(prepared, batch, moved)).abs().max() > 1e-3

    untouched = tiny_causal_lm(family)  # same module, now patched, but this model was not prepared
    module = sys.modules[type(untouched).__module__]
    patched = module.create_causal_mask
    inputs = {k: v for k, v in batch.items() if k in ("input_ids", "position_ids")}
    with torch.no_grad():
        through_patch = untouched(**inputs, use_cache=False).logits
        try:
            module.create_causal_mask = patched.__wrapped__
            original = untouched(**inputs, use_cache=False).logits
        finally:
            module.create_causal_mask = patched
    torch.testing.assert_close(through_patch, original, atol=0, rtol=0)  # inert for a model that is not prepared


def test_padding_mask_of_ordinary_batches_is_still_honoured():
    model = prepare_model_for_flattening(tiny_causal_lm("falcon"))
    ids = torch.randint(0, 256, (2, 6))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0  # left padding on row 0
    padded = model(input_ids=ids, attention_mask=mask).logits
    alone = model(input_ids=ids[:1, 2:]).logits
    torch.testing.assert_close(padded[:1, 2:], alone, atol=1e-5, rtol=0)
