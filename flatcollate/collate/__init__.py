"""Collators that flatten a mini-batch into one row.

Imports from flatcollate: `_conventions`, `boundaries`.
"""

from .completion_only import DataCollatorForCompletionOnlyLM
from .flattening import DataCollatorWithFlattening, flatten_features

__all__ = ["DataCollatorForCompletionOnlyLM", "DataCollatorWithFlattening", "flatten_features"]
