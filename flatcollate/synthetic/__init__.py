"""Synthetic data that follows real length profiles, for offline examples, tests and the benchmarks: rows of random
token ids with an in-memory tokenizer (`rows`), flat sequences drawn at scale (`sequences`), preference pairs as text
(`pairs`) and, imported from its module, image-text examples (`images`).

Imports from flatcollate: `_conventions`, `profiles`, `testing`.
"""

from .pairs import EOS_PER_REPLY, PairDraw, pair_texts, reward_texts, sample_pairs
from .rows import offline_tokenizer, synthetic_rows, synthetic_sft_dataset
from .sequences import SyntheticSequences, synthetic_sequences

__all__ = [
    "EOS_PER_REPLY",
    "PairDraw",
    "SyntheticSequences",
    "offline_tokenizer",
    "pair_texts",
    "reward_texts",
    "sample_pairs",
    "synthetic_rows",
    "synthetic_sequences",
    "synthetic_sft_dataset",
]
