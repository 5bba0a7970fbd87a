"""Benchmarks of padding-free training: realistic length profiles, throughput and memory per collation mode."""

from .batches import MODES, SyntheticSequences, step_batches, synthetic_sequences
from .profiles import LengthProfile, available_profiles, load_profile, padded_fill
from .report import markdown_table, summary_text, write_report
from .throughput import ThroughputConfig, run_throughput

__all__ = [
    "MODES",
    "LengthProfile",
    "SyntheticSequences",
    "ThroughputConfig",
    "available_profiles",
    "load_profile",
    "markdown_table",
    "padded_fill",
    "run_throughput",
    "step_batches",
    "summary_text",
    "synthetic_sequences",
    "write_report",
]
