"""Padding-free vision-language training: flattened image-text batches, per-sequence multimodal positions, and the
composite-model handling `prepare_model_for_flattening` applies to image-text-to-text models.

Imports from flatcollate: `_conventions`, `boundaries`, `families`, `collate`, `modeling`.
"""

from .collate import VisionDataCollatorWithFlattening
from .layouts import VisionLayout
from .processors import images_only, load_processor

__all__ = [
    "VisionDataCollatorWithFlattening",
    "VisionLayout",
    "images_only",
    "load_processor",
]
