"""Benchmarks of padding-free training: throughput, memory and MFU per collation mode, for every task (text SFT,
image-text SFT, DPO, KTO, reward, GRPO log-prob passes) through one harness (`harness`), on batches drawn from the
length profiles of `flatcollate.profiles`.

Each public name is imported from its module on first use, so the `flatcollate bench` options load without torch. The
preference tasks import `integrations` (and so trl) only inside the worker that trains.

Imports from flatcollate: `flatcollate` (its collator), `_conventions`, `_lazy`, `_paths`, `cli`, `attention`, `data`,
`modeling`, `testing`, `vision`, `check`, `integrations`, `synthetic`, `profiles`.
"""

from .._lazy import lazy_exports

_SOURCES = {
    "PairBenchConfig": "config",
    "SFTBenchConfig": "config",
    "VisionBenchConfig": "tasks.vision",
    "run_bench": "harness",
    "summary_text": "report",
    "write_report": "report",
}
"""Public name -> the module that defines it."""

__all__ = sorted(_SOURCES)


__getattr__, __dir__ = lazy_exports(__name__, _SOURCES, __all__)
