"""flatcollate: padding-free fine-tuning for Hugging Face models.

Collators flatten each mini-batch into one row with the boundaries attention kernels need, models are prepared so no
token attends across a boundary, and the data, streaming and benchmark tools build on both.

Each public name is imported from its module on first use, so `import flatcollate` (and `flatcollate --help`) does not
load torch. Importing `flatcollate.attention`, or using a name that needs it (`prepare_model_for_flattening`),
registers the `flatcollate` attention backend with transformers.
"""

from ._lazy import lazy_exports

__version__ = "0.1.0"

_SOURCES = {
    "IGNORE_INDEX": "_conventions",
    "load_profile": "profiles",
    "CheckReport": "check",
    "check_model": "check",
    "DataCollatorForCompletionOnlyLM": "collate",
    "DataCollatorWithFlattening": "collate",
    "flatten_features": "collate",
    "PackedDataset": "data",
    "TokenBudgetBatchSampler": "data",
    "build_encoder": "data",
    "make_supervised_dataset": "data",
    "make_supervised_dset": "data",
    "pack_dataset": "data",
    "pack_lengths": "data",
    "prepare_model_for_flattening": "modeling",
    "DataCollatorForPreference": "preference",
    "sequence_logprobs": "preference",
    "DataCollatorForSequenceParallel": "parallel",
    "prepare_model_for_sequence_parallel": "parallel",
    "sequence_parallel_loss": "parallel",
    "split_for_sequence_parallel": "parallel",
    "StreamingPacker": "streaming",
    "interleave": "streaming",
    "normalized_loss": "training",
    "VisionDataCollatorWithFlattening": "vision",
    "VisionLayout": "vision",
}
"""Public name -> the subpackage it is re-exported from."""

__all__ = [
    "IGNORE_INDEX",
    "CheckReport",
    "DataCollatorForCompletionOnlyLM",
    "DataCollatorForPreference",
    "DataCollatorForSequenceParallel",
    "DataCollatorWithFlattening",
    "PackedDataset",
    "StreamingPacker",
    "TokenBudgetBatchSampler",
    "VisionDataCollatorWithFlattening",
    "VisionLayout",
    "__version__",
    "build_encoder",
    "check_model",
    "flatten_features",
    "interleave",
    "load_profile",
    "make_supervised_dataset",
    "make_supervised_dset",
    "normalized_loss",
    "pack_dataset",
    "pack_lengths",
    "prepare_model_for_flattening",
    "prepare_model_for_sequence_parallel",
    "sequence_logprobs",
    "sequence_parallel_loss",
    "split_for_sequence_parallel",
]


__getattr__, __dir__ = lazy_exports(__name__, _SOURCES, __all__)
