"""flatcollate: padding-free fine-tuning for Hugging Face models."""

from ._conventions import IGNORE_INDEX
from .collate import DataCollatorForCompletionOnlyLM, DataCollatorWithFlattening, flatten_features

__version__ = "0.1.0"

__all__ = [
    "IGNORE_INDEX",
    "DataCollatorForCompletionOnlyLM",
    "DataCollatorWithFlattening",
    "__version__",
    "flatten_features",
]
