"""`flatcollate.synthetic.sequences`: profile-drawn sequences against a per-sequence loop."""

import numpy as np

from flatcollate.profiles.length_profile import LengthProfile
from flatcollate.synthetic import synthetic_sequences


def _pool(n=11, max_length=40, seed=0):
    profile = LengthProfile.from_lengths([0, 1, 5, 30, 60], [1, 0, 7, 20, 3], name="edges")
    return synthetic_sequences(profile, n, max_length=max_length, vocab_size=50, seed=seed)


def test_synthetic_sequences_against_a_per_sequence_loop():
    prompt, completion = LengthProfile.from_lengths([0, 1, 5, 30, 60], [1, 0, 7, 20, 3], name="edges").sample(
        11, seed=0
    )
    seqs = _pool()
    np.testing.assert_array_equal(seqs.lengths, np.minimum(prompt + completion, 40))
    assert seqs.truncated == int((prompt + completion > 40).sum())
    for i, (start, end) in enumerate(zip(seqs.offsets[:-1], seqs.offsets[1:], strict=True)):
        expected = seqs.tokens[start:end].copy()
        expected[: prompt[i]] = -100
        np.testing.assert_array_equal(seqs.labels[start:end], expected)
    assert seqs.tokens.min() >= 1 and seqs.tokens.max() < 50
