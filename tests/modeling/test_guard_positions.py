"""The guard checks positions against the batch's boundaries, and derives them where the collator emitted none.

Without this, a batch with `cu_seq_lens` (or only `seq_idx`) but arange positions runs silently wrong: learned
absolute positions (GPT-2) keep counting across sequences, and transformers' own SDPA sees one long sequence.
"""

import itertools

import pytest
import torch

from flatcollate import DataCollatorWithFlattening
from flatcollate.modeling import prepare_model_for_flattening
from flatcollate.testing import tiny_causal_lm

LENGTHS = [6, 1, 9, 3]


def features(seed: int = 0) -> list[dict]:
    generator = torch.Generator().manual_seed(seed)
    return [{"input_ids": torch.randint(0, 256, (n,), generator=generator).tolist()} for n in LENGTHS]


def alone_logits(model, batch) -> torch.Tensor:
    """Reference: every sequence through the model on its own."""
    bounds = [0, *itertools.accumulate(LENGTHS)]
    ids = batch["input_ids"]
    return torch.cat([model(input_ids=ids[:, s:e]).logits for s, e in itertools.pairwise(bounds)], dim=1)


@pytest.mark.parametrize(
    ("family", "attn_implementation"),
    [("gpt2", "flatcollate"), ("llama", None), ("llama", "flatcollate"), ("mamba2", "flatcollate")],
    ids=["gpt2-learned-positions", "llama-sdpa-kept", "llama-packed", "mamba2-state-carrying"],
)
@pytest.mark.parametrize(
    "collator_options",
    [
        {"return_position_ids": False},
        {"return_position_ids": False, "return_flash_attn_kwargs": False},
    ],
    ids=["cu_seq_lens-without-positions", "seq_idx-only"],
)
def test_batches_without_positions_get_restarting_positions(family, attn_implementation, collator_options):
    model = prepare_model_for_flattening(tiny_causal_lm(family), attn_implementation=attn_implementation)
    batch = DataCollatorWithFlattening(**collator_options)(features())
    assert "position_ids" not in batch
    batch.pop("labels")
    torch.testing.assert_close(model(**batch).logits, alone_logits(model, batch), atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_positions_that_do_not_restart_at_the_boundaries_are_refused(family):
    model = prepare_model_for_flattening(tiny_causal_lm(family))
    batch = DataCollatorWithFlattening()(features())
    batch["position_ids"] = torch.arange(sum(LENGTHS))[None]
    with pytest.raises(ValueError, match=r"(?s)position_ids.*do not restart.*cu_seq_lens_q.*first at token 6"):
        model(**batch)


def test_positions_restarting_elsewhere_are_refused():
    model = prepare_model_for_flattening(tiny_causal_lm("llama"))
    batch = DataCollatorWithFlattening()(features())
    batch["position_ids"] = DataCollatorWithFlattening()(features()[::-1])["position_ids"]
    with pytest.raises(ValueError, match=r"position_ids.*cu_seq_lens_q"):
        model(**batch)


def test_seq_idx_that_disagrees_with_cu_seq_lens_is_refused():
    model = prepare_model_for_flattening(tiny_causal_lm("llama"))
    batch = DataCollatorWithFlattening()(features())
    batch["seq_idx"] = torch.zeros_like(batch["seq_idx"])
    with pytest.raises(ValueError, match=r"seq_idx.*cu_seq_lens_q"):
        model(**batch)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda b: b.update(cu_seq_lens_q=b["cu_seq_lens_q"][:-1], cu_seq_lens_k=b["cu_seq_lens_k"][:-1]), "ends at"),
        (lambda b: b.update(cu_seq_lens_k=b["cu_seq_lens_k"].flip(0)), "cu_seq_lens_k"),
        (lambda b: b.update(max_length_q=2, max_length_k=2), "max_length_q"),
        (lambda b: b["cu_seq_lens_q"].__setitem__(1, 12), "increasing"),
    ],
    ids=["short", "k-differs", "max-length", "decreasing"],
)
def test_inconsistent_boundaries_are_refused(change, words):
    model = prepare_model_for_flattening(tiny_causal_lm("llama"))
    batch = DataCollatorWithFlattening()(features())
    batch["cu_seq_lens_q"] = batch["cu_seq_lens_q"].clone()
    change(batch)
    with pytest.raises(ValueError, match=words):
        model(**batch)


def test_a_consistent_batch_runs_unchanged():
    model = prepare_model_for_flattening(tiny_causal_lm("llama"))
    batch = DataCollatorWithFlattening(position_ids_start=3)(features())
    batch.pop("labels")
    assert model(**batch).logits.shape == (1, sum(LENGTHS), 256)
