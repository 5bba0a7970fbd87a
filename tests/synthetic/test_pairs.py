"""`flatcollate.synthetic.pairs`: pairs drawn from a pair profile, and their texts tokenize to the drawn lengths."""

import numpy as np
import pytest

from flatcollate.profiles.pair_profile import load_pair_profile
from flatcollate.synthetic.pairs import PairDraw, pair_texts, reward_texts, sample_pairs


def test_samples_are_seeded_and_whole_samples_fit():
    profile = load_pair_profile("hh_rlhf")
    draw = sample_pairs(profile, 200, max_length=128, seed=3, whole=True)
    assert (np.concatenate(draw.sequence_lengths()) <= 128).all() and draw.truncated == 0
    again = sample_pairs("hh_rlhf", 200, max_length=128, seed=3, whole=True)
    np.testing.assert_array_equal(draw.chosen, again.chosen)
    cut = sample_pairs(profile, 200, max_length=128, seed=3)  # negative control: without `whole`, some are cut
    assert (cut.prompt < 128).all() and cut.truncated > 0
    with pytest.raises(ValueError):
        sample_pairs(profile, 2, max_length=int(profile.prompt.min()), seed=0)


def test_pair_texts_tokenize_to_the_drawn_lengths():
    from flatcollate.synthetic import offline_tokenizer

    tokenizer = offline_tokenizer(64)
    draw = PairDraw(np.array([3, 1]), np.array([0, 2]), np.array([4, 1]), max_length=100)
    for row, p, c, r in zip(pair_texts(draw, vocab_size=64, seed=0), [3, 1], [0, 2], [4, 1], strict=True):
        eos = tokenizer.eos_token
        assert len(tokenizer(row["prompt"])["input_ids"]) == p
        assert len(tokenizer(row["prompt"] + row["chosen"] + eos)["input_ids"]) == p + c + 1
        assert len(tokenizer(row["prompt"] + row["rejected"] + eos)["input_ids"]) == p + r + 1


def test_reward_texts_tokenize_to_the_drawn_lengths():
    from flatcollate.synthetic import offline_tokenizer

    tokenizer = offline_tokenizer(64)
    draw = PairDraw(np.array([3, 1]), np.array([0, 2]), np.array([4, 1]), max_length=100)
    chosen, rejected = draw.sequence_lengths()
    rows = reward_texts(draw, vocab_size=64, seed=0)
    assert [sorted(row) for row in rows] == [["chosen", "rejected"]] * 2
    for row, c, r in zip(rows, chosen, rejected, strict=True):
        assert len(tokenizer(row["chosen"] + tokenizer.eos_token)["input_ids"]) == c
        assert len(tokenizer(row["rejected"] + tokenizer.eos_token)["input_ids"]) == r
