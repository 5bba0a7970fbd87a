"""Synthetic text sequences whose lengths follow a length profile: random token ids, prompt tokens labelled -100,
stored flat (one array of every sequence's ids back to back, and the lengths).

Token ids are drawn with numpy from offsets into one flat array: no Python loop over tokens.
"""

from dataclasses import dataclass

import numpy as np

from .._conventions import IGNORE_INDEX
from ..profiles.length_profile import LengthProfile


@dataclass(frozen=True)
class SyntheticSequences:
    """Random sequences drawn from a profile, stored flat.

    Args:
        tokens (`np.ndarray` of shape `(T,)`, int64): every sequence's token ids back to back.
        labels (`np.ndarray` of shape `(T,)`, int64): `tokens` with prompt positions set to -100.
        lengths (`np.ndarray` of shape `(N,)`, int64): tokens per sequence, each in `[1, max_length]`.
        truncated (`int`): sequences that were longer than `max_length` and lost their tail (as an SFT trainer's
            `max_length` truncation does).
    """

    tokens: np.ndarray
    labels: np.ndarray
    lengths: np.ndarray
    truncated: int

    @property
    def offsets(self) -> np.ndarray:
        """`(N + 1,)` int64 start of every sequence in the flat arrays."""
        return np.concatenate([[0], np.cumsum(self.lengths)])

    def features(self, indices: np.ndarray) -> list[dict[str, np.ndarray]]:
        """Examples `{"input_ids", "labels"}` (1-D int64 views) for a collator, in the order of `indices`."""
        starts, ends = self.offsets[indices], self.offsets[indices + 1]
        # One dict per sequence: this is the per-example interface collators take.
        return [{"input_ids": self.tokens[s:e], "labels": self.labels[s:e]} for s, e in zip(starts, ends, strict=True)]


def synthetic_sequences(
    profile: LengthProfile, n: int, *, max_length: int, vocab_size: int, seed: int
) -> SyntheticSequences:
    """Draw `n` sequences: lengths from `profile`, ids uniform in `[1, vocab_size)` (0 is left for padding).

    >>> from flatcollate.profiles import load_profile
    >>> seqs = synthetic_sequences(load_profile("gsm8k"), 4, max_length=64, vocab_size=100, seed=0)
    >>> int(seqs.lengths.max()) <= 64, seqs.tokens.shape == (int(seqs.lengths.sum()),)
    (True, True)
    """
    if max_length < 1 or vocab_size < 2:
        raise ValueError(f"Need max_length >= 1 and vocab_size >= 2, got {max_length} and {vocab_size}.")
    prompt, completion = profile.sample(n, seed=seed)
    full = prompt + completion
    lengths = np.minimum(full, max_length)
    rng = np.random.default_rng(seed + 1)
    tokens = rng.integers(1, vocab_size, size=int(lengths.sum()), dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    # Position of each token inside its own sequence: flat index minus the start of its sequence.
    within = np.arange(tokens.size) - np.repeat(offsets[:-1], lengths)
    labels = np.where(within < np.repeat(prompt, lengths), IGNORE_INDEX, tokens)
    return SyntheticSequences(tokens, labels, lengths, truncated=int((full > max_length).sum()))
