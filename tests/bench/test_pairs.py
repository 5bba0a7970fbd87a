"""What the preference tasks train on (`flatcollate.bench.pairs`): pairs drawn from the pair profile, seeded, cut to
max_length or drawn whole, and the padding of TRL's batches of them, counted by hand and against TRL's own collators."""

import numpy as np
import pytest

from flatcollate.bench.config import PairBenchConfig
from flatcollate.bench.pairs import draw_pairs, padded_pair_tokens
from flatcollate.profiles.pair_profile import load_pair_profile
from flatcollate.synthetic.pairs import PairDraw


def test_draws_are_seeded_and_leave_out_prompts_that_fill_max_length():
    config = PairBenchConfig(max_length=64, steps=50, batch_size=4)
    draw = draw_pairs(config)
    again = draw_pairs(config)
    assert draw.prompt.size == 51 * 4 and (draw.prompt < 64).all()
    np.testing.assert_array_equal(draw.chosen, again.chosen)
    chosen, _ = draw.sequence_lengths()
    assert chosen.max() <= 64 and (chosen == np.minimum(draw.prompt + draw.chosen + 1, 64)).all()
    assert draw.truncated == int(
        (draw.prompt + draw.chosen + 1 > 64).sum() + (draw.prompt + draw.rejected + 1 > 64).sum()
    )


def test_whole_draws_keep_only_pairs_that_fit_and_are_seeded():
    config = PairBenchConfig(max_length=64, steps=50, batch_size=4)
    draw = draw_pairs(config, whole=True)
    assert draw.prompt.size == 51 * 4 and draw.truncated == 0
    assert (draw.prompt + np.maximum(draw.chosen, draw.rejected) + 1 <= 64).all()
    np.testing.assert_array_equal(draw.rejected, draw_pairs(config, whole=True).rejected)


def test_a_max_length_no_pair_fits_in_names_the_shortest():
    profile = load_pair_profile("hh_rlhf")
    shortest = int((profile.prompt + np.maximum(profile.chosen, profile.rejected)).min())
    with pytest.raises(ValueError, match=f"shortest has {shortest}"):
        draw_pairs(PairBenchConfig(max_length=shortest), whole=True)


def test_padding_is_what_trls_reward_collator_pads():
    trl = pytest.importorskip("trl")
    rng = np.random.default_rng(0)
    draw = PairDraw(*(rng.integers(low, 30, size=7) for low in (1, 0, 0)), max_length=100)
    chosen, rejected = draw.sequence_lengths()
    collator = trl.trainer.reward_trainer.DataCollatorForPreference(pad_token_id=0)
    real, slots = padded_pair_tokens(draw, batch_size=3)
    for index, start in enumerate(range(0, 7, 3)):
        examples = [
            {"chosen_ids": [2] * int(c), "rejected_ids": [3] * int(r)}
            for c, r in zip(chosen[start : start + 3], rejected[start : start + 3], strict=True)
        ]
        batch = collator(examples)
        assert batch["attention_mask"].sum() == real[index] and batch["input_ids"].numel() == slots[index]


def test_padding_of_a_small_batch_by_hand():
    """Pairs (prompt, chosen, rejected) = (3, 1, 2), (1, 1, 1), (2, 4, 1), batch 2, max_length 6; + 1 eos per reply:
    batch 0 sequences 5 3 | 6 3 -> 4 x 6 = 24 slots, 17 real; batch 1 sequences 6 (7 cut to 6) | 4 -> 2 x 6, 10 real."""
    draw = PairDraw(np.array([3, 1, 2]), np.array([1, 1, 4]), np.array([2, 1, 1]), max_length=6)
    real, slots = padded_pair_tokens(draw, batch_size=2)
    assert real.tolist() == [17, 10] and slots.tolist() == [24, 12]
    assert draw.truncated == 1
    assert 1 - real.sum() / slots.sum() == pytest.approx(9 / 36)


def test_padding_is_what_trls_collator_pads():
    trl = pytest.importorskip("trl")
    rng = np.random.default_rng(0)
    draw = PairDraw(*(rng.integers(low, 30, size=7) for low in (1, 0, 0)), max_length=24)
    collator = trl.trainer.dpo_trainer.DataCollatorForPreference(pad_token_id=0, max_length=24)
    real, slots = padded_pair_tokens(draw, batch_size=3)
    for index, start in enumerate(range(0, 7, 3)):
        examples = [
            {"prompt_ids": [1] * int(p), "chosen_ids": [2] * (int(c) + 1), "rejected_ids": [3] * (int(r) + 1)}
            for p, c, r in zip(*(a[start : start + 3] for a in (draw.prompt, draw.chosen, draw.rejected)), strict=True)
        ]
        batch = collator(examples)
        assert batch["attention_mask"].sum() == real[index] and batch["input_ids"].numel() == slots[index]


@pytest.mark.parametrize(("task", "per_pair"), [("dpo", 2), ("reward", 2), ("grpo", 2), ("kto", 4)])
def test_every_pair_task_describes_the_sequences_its_timed_steps_train(task, per_pair):
    """KTO trains each example's sequence and its KL sequence: four per pair; the others two."""
    from flatcollate.bench.harness import get_task

    config = PairBenchConfig(max_length=256, steps=3, batch_size=4)
    work = get_task(task).workload(config)
    data = work.data
    assert data["sequences"] == per_pair * config.steps * config.batch_size
    assert data["mean_length"] * data["sequences"] == pytest.approx(work.real_tokens)  # every real token, once
    assert data["longest"] <= config.max_length and data["profile_sample"] == "20,000 pairs"
    assert 0 < data["profile_padding"] < 1 and (data["truncated"] > 0) == (task in ("dpo", "kto"))  # 256 cuts some


def test_a_task_whose_sequences_miss_tokens_its_layout_counts_is_caught():
    from flatcollate.bench.pairs import pair_workload
    from flatcollate.bench.tasks.kto import padded_kto_tokens

    config = PairBenchConfig(max_length=256, steps=3, batch_size=4)
    with pytest.raises(AssertionError, match="the sequences and the layout count other tokens"):
        pair_workload(config, whole=False, modes=("padded", "flattened"), layout=padded_kto_tokens)  # no KL sequences
