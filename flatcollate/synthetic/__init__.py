"""Synthetic data that follows real length profiles, for offline examples, tests and the benchmarks: rows of random
token ids with an in-memory tokenizer (`rows`) and flat sequences drawn at scale (`sequences`); the benchmarks'
preference pairs as text (`pairs`) and image-text examples (`images`) are imported from their modules.

Imports from flatcollate: `_conventions`, `profiles`, `testing`.
"""

from .rows import offline_tokenizer, synthetic_rows, synthetic_sft_dataset
from .sequences import synthetic_sequences

__all__ = ["offline_tokenizer", "synthetic_rows", "synthetic_sequences", "synthetic_sft_dataset"]
