"""Model-level proof: a flattened batch gives the same logits, loss and gradients as running sequences apart."""

import numpy as np
import pytest
import torch

from flatcollate import DataCollatorWithFlattening
from flatcollate.testing import tiny_causal_lm

LENGTHS = [7, 1, 23, 12, 2]
TOL = 1e-5


def make_features(seed=0):
    rng = np.random.default_rng(seed)
    features = []
    for length in LENGTHS:
        ids = rng.integers(0, 256, length)
        labels = ids.copy()
        labels[: length // 3] = -100  # a prompt part
        features.append({"input_ids": ids.tolist(), "labels": labels.tolist()})
    return features


def padded_batch(features):
    longest = max(len(f["input_ids"]) for f in features)
    input_ids = torch.zeros(len(features), longest, dtype=torch.long)
    labels = torch.full((len(features), longest), -100)
    attention_mask = torch.zeros(len(features), longest, dtype=torch.long)
    for row, f in enumerate(features):
        n = len(f["input_ids"])
        input_ids[row, :n] = torch.tensor(f["input_ids"])
        labels[row, :n] = torch.tensor(f["labels"])
        attention_mask[row, :n] = 1
    return {"input_ids": input_ids, "labels": labels, "attention_mask": attention_mask}


def grads(model):
    return {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_flattened_equals_separate_and_padded(family, attn):
    model = tiny_causal_lm(family, attn_implementation=attn)
    features = make_features()
    batch = DataCollatorWithFlattening()(features)

    out = model(**batch, use_cache=False)
    # Per-sequence logits equal each sequence run alone.
    starts = batch["cu_seq_lens_q"].tolist()
    with torch.no_grad():
        for i, f in enumerate(features):
            alone = model(input_ids=torch.tensor([f["input_ids"]]), use_cache=False).logits[0]
            piece = out.logits[0, starts[i] : starts[i + 1]]
            assert (piece - alone).abs().max().item() <= TOL, f"sequence {i}"

    # Loss and gradients equal the padded batch's token-weighted loss and gradients.
    out.loss.backward()
    flat_grads = grads(model)
    model.zero_grad()
    padded = model(**padded_batch(features), use_cache=False)
    padded.loss.backward()
    assert abs(out.loss.item() - padded.loss.item()) <= TOL
    padded_grads = grads(model)
    assert flat_grads.keys() == padded_grads.keys()
    for name, g in padded_grads.items():
        assert (flat_grads[name] - g).abs().max().item() <= TOL, name


def test_attention_mask_contaminates_in_vanilla_transformers():
    """The failure the guard exists for: an attention_mask with a flattened row mixes sequences."""
    model = tiny_causal_lm("llama")
    features = make_features()
    batch = DataCollatorWithFlattening()(features)
    with torch.no_grad():
        clean = model(**batch, use_cache=False).logits
        mixed = model(**batch, attention_mask=torch.ones_like(batch["input_ids"]), use_cache=False).logits
    assert (clean - mixed).abs().max().item() > 1e-2
