"""Padding-free vision-language training: flattened image-text batches, per-sequence multimodal positions, and the
composite-model handling `prepare_model_for_flattening` applies to image-text-to-text models."""

from .collate import VisionDataCollatorWithFlattening
from .layouts import VisionLayout
from .positions import multimodal_position_ids
from .tiny import tiny_vision_examples, tiny_vision_lm

__all__ = [
    "VisionDataCollatorWithFlattening",
    "VisionLayout",
    "multimodal_position_ids",
    "tiny_vision_examples",
    "tiny_vision_lm",
]
