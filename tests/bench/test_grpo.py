"""The GRPO log-prob benchmark (`flatcollate bench --task grpo`): its batches are built as `GRPOTrainer` builds them,
the padding it reports is the count of those batches, and both passes give the same losses; a row whose boundaries
are dropped does not. What every preference task shares is tested in `test_pair_tasks.py`. No timing is asserted."""

import numpy as np
import pytest
import torch

from flatcollate.bench.config import PairBenchConfig
from flatcollate.bench.harness import in_process, run_bench
from flatcollate.bench.pairs import draw_pairs, padded_pair_tokens

trl = pytest.importorskip("trl")

from flatcollate.bench.tasks.grpo import grpo_batches, padded_grpo_tokens  # noqa: E402  (needs trl)
from flatcollate.integrations.trl.grpo import CompletionRows  # noqa: E402

pytestmark = pytest.mark.slow

SIZES = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2, "num_key_value_heads": 1}
SIZES |= {"head_dim": 16, "num_hidden_layers": 2, "vocab_size": 256}
TINY = {"steps": 2, "warmup_steps": 1, "repeats": 1, "batch_size": 2, "max_length": 128, "model_overrides": SIZES}


def test_batches_are_what_grpo_trainer_builds_and_the_padding_their_count():
    config = PairBenchConfig(max_length=256, steps=6, warmup_steps=1, batch_size=3)
    draw = draw_pairs(config, whole=True)
    batches = grpo_batches(draw, batch_size=3, vocab_size=100, seed=0)
    real, slots = padded_grpo_tokens(draw, batch_size=3)
    assert len(batches) == 7 == real.size
    for index, batch in enumerate(batches):
        ids, mask, width = batch["input_ids"], batch["attention_mask"], batch["logits_to_keep"]
        part = slice(3 * index, 3 * index + 3)
        completions = np.stack([draw.chosen[part], draw.rejected[part]], axis=1).reshape(-1) + 1  # the eos
        assert mask.sum() == real[index] and mask.numel() == slots[index]
        assert width == completions.max() and (mask[:, -width:].sum(dim=1).numpy() == completions).all()
        assert (mask[:, :-width].sum(dim=1).numpy() == np.repeat(draw.prompt[part], 2)).all()
        assert torch.equal(ids[0, :-width], ids[1, :-width]), "a prompt's two completions share its ids"
        assert CompletionRows(mask, width).flattenable, "left-padded prompt, right-padded completion: one run"
        assert (ids[mask == 0] == 0).all() and (ids[mask == 1] > 0).all()
    # Control: DPO pads each sequence whole, not prompt and completion apart, and counts other slots.
    _, dpo_slots = padded_pair_tokens(draw, batch_size=3)
    assert (dpo_slots <= slots).all() and (dpo_slots < slots).any()


def test_both_passes_score_the_completions_alike():
    result = run_bench("grpo", PairBenchConfig(**TINY), progress=False, runner=in_process)
    padded, flattened = result["modes"]["padded"], result["modes"]["flattened"]
    assert padded["optimizer_steps"] == flattened["optimizer_steps"] == 2 and len(padded["losses"]) == 2
    assert result["loss_equivalence"]["max_abs_loss_diff"] <= 1e-5
    assert 4 < padded["losses"][0] < 7, "a random 256-word model scores about log(256) = 5.5 per token"
    real, slots = padded_grpo_tokens(draw_pairs(PairBenchConfig(**TINY), whole=True), batch_size=2)
    assert padded["computed_tokens"] == slots[1:].sum() and flattened["computed_tokens"] == real[1:].sum()
    assert flattened["attn"] == "flatcollate" and padded["attn"] == "sdpa"


def test_a_row_without_its_boundaries_scores_otherwise(monkeypatch):
    # Control: the flattened row as one sequence (positions running on, one segment) attends across completions.
    def one_sequence(self, input_ids):
        total = self.boundaries.total
        bounds = torch.tensor([0, total], dtype=torch.int32, device=input_ids.device)
        return {
            "input_ids": input_ids[self.real][None],
            "position_ids": torch.arange(total, device=input_ids.device)[None],
            "cu_seq_lens_q": bounds,
            "cu_seq_lens_k": bounds,
            "max_length_q": total,
            "max_length_k": total,
        }

    monkeypatch.setattr(CompletionRows, "model_inputs", one_sequence)
    result = run_bench("grpo", PairBenchConfig(**TINY), progress=False, runner=in_process)
    assert result["loss_equivalence"]["max_abs_loss_diff"] > 1e-3
