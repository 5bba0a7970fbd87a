"""flatcollate: padding-free fine-tuning for Hugging Face models.

Collators flatten each mini-batch into one row with the boundaries attention kernels need, models are prepared so no
token attends across a boundary, and the data, streaming and benchmark tools build on both.

The top level holds what the quick starts use: the collators, `prepare_model_for_flattening`, `check_model` and the
data pipeline. Everything else is imported from its subpackage (`flatcollate.vision`, `flatcollate.preference`,
`flatcollate.parallel`, `flatcollate.streaming`, `flatcollate.training`, `flatcollate.integrations.trl`, ...).

Each public name is imported from its module on first use, so `import flatcollate` (and `flatcollate --help`) does not
load torch. Importing `flatcollate.attention`, or using a name that needs it (`prepare_model_for_flattening`),
registers the `flatcollate` attention backend with transformers.
"""

from ._lazy import lazy_exports

__version__ = "0.1.0"

_SOURCES = {
    "IGNORE_INDEX": "_conventions",
    "DataCollatorForCompletionOnlyLM": "collate",
    "DataCollatorWithFlattening": "collate",
    "prepare_model_for_flattening": "modeling",
    "check_model": "check",
    "PackedDataset": "data",
    "TokenBudgetBatchSampler": "data",
    "build_encoder": "data",
    "make_supervised_dataset": "data",
    "pack_dataset": "data",
    "pack_lengths": "data",
}
"""Public name -> the subpackage it is re-exported from."""

__all__ = ["__version__", *sorted(_SOURCES)]


__getattr__, __dir__ = lazy_exports(__name__, _SOURCES, __all__)
