"""Benchmarks of padding-free training: realistic length profiles, throughput and memory per collation mode.

Each public name is imported from its module on first use, so the `flatcollate bench` options load without torch.

Imports from flatcollate: `flatcollate` (its version), `_conventions`, `_lazy`, `cli`, `attention`, `data`, `modeling`,
`models`, `vision`, `check`.
"""

from .._lazy import lazy_exports

_SOURCES = {
    "MODES": "config",
    "ThroughputConfig": "config",
    "SyntheticSequences": "batches",
    "step_batches": "batches",
    "synthetic_sequences": "batches",
    "LengthProfile": "length_profile",
    "available_profiles": "profiles",
    "load_profile": "profiles",
    "padded_fill": "profiles",
    "markdown_table": "report",
    "summary_text": "report",
    "write_report": "report",
    "run_throughput": "throughput",
}
"""Public name -> the module that defines it."""

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


__getattr__, __dir__ = lazy_exports(__name__, _SOURCES, __all__)
