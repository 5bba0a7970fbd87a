"""Benchmarks of padding-free training: throughput, memory and MFU per collation mode, on batches drawn from the
length profiles of `flatcollate.profiles`.

Each public name is imported from its module on first use, so the `flatcollate bench` options load without torch.

The DPO benchmark (`dpo`, `flatcollate bench --task dpo`) trains TRL's trainers; it imports `integrations` (and so
trl) only inside the worker that trains; so does the reward benchmark (`reward`, `flatcollate bench --task reward`).

Imports from flatcollate: `flatcollate` (its version), `_conventions`, `_lazy`, `cli`, `attention`, `data`, `modeling`,
`models`, `vision`, `check`, `integrations`, `synthetic`, `profiles`.
"""

from .._lazy import lazy_exports

_SOURCES = {
    "MODES": "config",
    "DPOBenchConfig": "config",
    "ThroughputConfig": "config",
    "run_dpo_bench": "dpo",
    "run_reward_bench": "reward",
    "write_dpo_report": "dpo_report",
    "SyntheticSequences": "batches",
    "step_batches": "batches",
    "synthetic_sequences": "batches",
    "markdown_table": "report",
    "summary_text": "report",
    "write_report": "report",
    "run_throughput": "throughput",
}
"""Public name -> the module that defines it."""

__all__ = [
    "MODES",
    "DPOBenchConfig",
    "SyntheticSequences",
    "ThroughputConfig",
    "markdown_table",
    "run_dpo_bench",
    "run_reward_bench",
    "run_throughput",
    "step_batches",
    "summary_text",
    "synthetic_sequences",
    "write_dpo_report",
    "write_report",
]


__getattr__, __dir__ = lazy_exports(__name__, _SOURCES, __all__)
