"""Synthetic preference pairs: prompt, chosen and rejected lengths drawn from a pair profile
(`flatcollate.profiles.pair_profile`), written as text of random words for `offline_tokenizer`, so that TRL tokenizes
each to exactly its drawn length (and appends the eos to each reply).

A pair of lengths `(p, c, r)` trains two sequences of `p + c + 1` and `p + r + 1` tokens, each cut to `max_length`.
"""

from dataclasses import dataclass

import numpy as np

from ..profiles.pair_profile import PairProfile, load_pair_profile

EOS_PER_REPLY = 1
"""Tokens TRL appends to every reply of a text (not conversational) dataset: the eos."""


@dataclass(frozen=True)
class PairDraw:
    """Pairs drawn for one run, in training order.

    Args:
        prompt (`np.ndarray` of shape `(N,)`, int64): prompt tokens of each pair, all `< max_length`.
        chosen (`np.ndarray` of shape `(N,)`, int64): chosen reply tokens, without the eos.
        rejected (`np.ndarray` of shape `(N,)`, int64): rejected reply tokens, without the eos.
        max_length (`int`): sequences are cut to it.
    """

    prompt: np.ndarray
    chosen: np.ndarray
    rejected: np.ndarray
    max_length: int

    def uncut_lengths(self) -> tuple[np.ndarray, np.ndarray]:
        """Tokens of each `prompt + chosen + eos` and `prompt + rejected + eos` before the cut to `max_length`; two
        `(N,)` int64 arrays."""
        return self.prompt + self.chosen + EOS_PER_REPLY, self.prompt + self.rejected + EOS_PER_REPLY

    def sequence_lengths(self) -> tuple[np.ndarray, np.ndarray]:
        """Tokens trained of each sequence (`uncut_lengths`), cut to `max_length`; two `(N,)` int64 arrays."""
        return tuple(np.minimum(lengths, self.max_length) for lengths in self.uncut_lengths())

    @property
    def truncated(self) -> int:
        """Sequences longer than `max_length`, which lost their tail."""
        return int((np.concatenate(self.uncut_lengths()) > self.max_length).sum())


def sample_pairs(profile: str | PairProfile, n: int, *, max_length: int, seed: int, whole: bool = False) -> PairDraw:
    """`n` pairs of `profile` (a name, path or `PairProfile`), among those whose prompt is shorter than `max_length`;
    with `whole`, only among those whose two sequences (eos included) fit in `max_length` (`trl.RewardTrainer` drops
    the others rather than truncate them).

    >>> draw = sample_pairs("hh_rlhf", 3, max_length=256, seed=0, whole=True)
    >>> draw.prompt.shape, bool((np.concatenate(draw.sequence_lengths()) <= 256).all()), draw.truncated
    ((3,), True, 0)
    """
    profile = load_pair_profile(profile) if not isinstance(profile, PairProfile) else profile
    max_pair = max_length - EOS_PER_REPLY if whole else None
    lengths = profile.sample(n, seed=seed, max_prompt=max_length, max_pair=max_pair)
    return PairDraw(*lengths, max_length=max_length)


def pair_texts(draw: PairDraw, *, vocab_size: int, seed: int) -> list[dict[str, str]]:
    """Pairs as text for `offline_tokenizer(vocab_size)` (`flatcollate.synthetic.rows`): words `t<id>`, ids uniform in
    `[0, vocab_size - 2)` (its last two ids are pad and eos). Replies start with a space, so TRL's
    `prompt + reply` splits between the prompt's last word and the reply's first.

    >>> draw = PairDraw(np.array([2]), np.array([1]), np.array([0]), max_length=8)
    >>> [sorted(row) for row in pair_texts(draw, vocab_size=10, seed=0)]
    [['chosen', 'prompt', 'rejected']]
    """
    rng = np.random.default_rng(seed)
    words = np.char.add("t", np.arange(vocab_size - 2).astype(str))
    counts = np.stack([draw.prompt, draw.chosen, draw.rejected], axis=1)
    drawn = words[rng.integers(0, vocab_size - 2, size=int(counts.sum()))]
    ends = np.cumsum(counts.ravel()).reshape(counts.shape)
    starts = ends - counts
    rows = []
    for (p0, c0, r0), (p1, c1, r1) in zip(starts.tolist(), ends.tolist(), strict=True):  # one dict per pair
        rows.append(
            {
                "prompt": " ".join(drawn[p0:p1]),
                "chosen": "".join(" " + word for word in drawn[c0:c1]),
                "rejected": "".join(" " + word for word in drawn[r0:r1]),
            }
        )
    return rows


def reward_texts(draw: PairDraw, *, vocab_size: int, seed: int) -> list[dict[str, str]]:
    """`pair_texts` as `trl.RewardTrainer` takes them: `chosen` = prompt + chosen reply, `rejected` = prompt +
    rejected reply.

    >>> draw = PairDraw(np.array([2]), np.array([1]), np.array([0]), max_length=8)
    >>> [len(row["chosen"].split()) for row in reward_texts(draw, vocab_size=10, seed=0)]
    [3]
    """
    rows = pair_texts(draw, vocab_size=vocab_size, seed=seed)
    return [{key: row["prompt"] + row[key] for key in ("chosen", "rejected")} for row in rows]
