"""Collators that flatten a mini-batch into one row.

Imports from flatcollate: `_conventions`, `boundaries`.
"""

from .completion_only import DataCollatorForCompletionOnlyLM
from .flatten import flatten_features
from .flattening import DataCollatorWithFlattening

__all__ = ["DataCollatorForCompletionOnlyLM", "DataCollatorWithFlattening", "flatten_features"]
