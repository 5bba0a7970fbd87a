"""flatcollate: padding-free fine-tuning for Hugging Face models.

Collators flatten each mini-batch into one row with the boundaries attention kernels need, models are prepared so no
token attends across a boundary, and the data, streaming and benchmark tools build on both.
"""

from ._conventions import IGNORE_INDEX
from .bench import load_profile, run_throughput
from .check import CheckReport, check_model
from .collate import DataCollatorForCompletionOnlyLM, DataCollatorWithFlattening, flatten_features
from .data import (
    PackedDataset,
    TokenBudgetBatchSampler,
    build_encoder,
    make_supervised_dataset,
    make_supervised_dset,
    pack_dataset,
    pack_lengths,
)
from .modeling import prepare_model_for_flattening
from .parallel import (
    DataCollatorForSequenceParallel,
    prepare_model_for_sequence_parallel,
    sequence_parallel_loss,
    split_for_sequence_parallel,
)
from .streaming import StreamingPacker, interleave
from .training import normalized_loss
from .vision import VisionDataCollatorWithFlattening, VisionLayout

__version__ = "0.1.0"

__all__ = [
    "IGNORE_INDEX",
    "CheckReport",
    "DataCollatorForCompletionOnlyLM",
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
    "run_throughput",
    "sequence_parallel_loss",
    "split_for_sequence_parallel",
]
