"""Collators that flatten a mini-batch into one row."""

from .completion_only import DataCollatorForCompletionOnlyLM
from .flattening import DataCollatorWithFlattening, flatten_features

__all__ = ["DataCollatorForCompletionOnlyLM", "DataCollatorWithFlattening", "flatten_features"]
