"""flatcollate: padding-free fine-tuning for Hugging Face models."""

from ._conventions import IGNORE_INDEX

__version__ = "0.1.0"

__all__ = ["IGNORE_INDEX", "__version__"]
