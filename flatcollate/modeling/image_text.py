"""What the guard adds for image-text models: the text row of 3-D rotary positions, per-sequence 3-D positions, image
blocks that attend both ways, and the check that images come with the per-token types the family reads.

A flattened batch of a multimodal-RoPE family (Qwen2-VL and its relatives) may bring positions `(4, B, T)`, text row
first: that row says where its sequences start (`_text_positions`). The guard then builds the batch's boundaries as
for text, and this feature gives each sequence its own 3-D positions (`checked_multimodal_positions`) and, for the
image-block families (Gemma 3, PaliGemma), numbers each image's tokens so they attend to their own image both ways,
never across a sequence (`block_ids`).
"""

import functools
from collections.abc import Callable

import torch

from ..attention.bidirectional_blocks import BLOCKS_KEY, block_ids
from ..families import family_of
from .boundary_check import BOUNDARY_KEYS
from .multimodal_positions import checked_multimodal_positions, rope_index_of
from .prepared_state import Feature, FlatBatch, add_feature
from .token_types import require_token_types, token_types_read


def _text_positions(model: torch.nn.Module, arguments: dict) -> torch.Tensor | None:
    """The text positions `(B, T)` of a batch: the first row of multimodal-RoPE positions `(4, B, T)` (transformers
    puts it first), None for three rows without boundaries (an ordinary call, left as it is)."""
    given = arguments.get("position_ids")
    if not isinstance(given, torch.Tensor) or given.dim() != 3:
        return given
    if given.shape[0] == 4:
        return given[0]
    if not any(arguments.get(key) is not None for key in BOUNDARY_KEYS):
        return None
    raise ValueError(
        f"`position_ids` of shape {tuple(given.shape)} hold the 3-D rotary positions without the text row, so the "
        "sequences of a flattened batch cannot be told apart from them. Leave `position_ids` out (flatcollate "
        "computes them per sequence) or pass shape (4, 1, T), text row first."
    )


def _changes(
    rope_index: Callable | None, block_type: int | None, model: torch.nn.Module, arguments: dict, flat: FlatBatch | None
) -> dict:
    """Per-sequence 3-D positions and image blocks of a flattened batch (nothing for an ordinary one)."""
    if flat is None:
        return {}
    require_token_types(model, arguments)  # both read the per-token types: images without them are refused
    changes = {}
    if flat.positions is None:
        return changes
    if rope_index is not None:
        changes["position_ids"] = checked_multimodal_positions(rope_index, arguments, flat.positions, flat.boundaries)
    token_types = arguments.get("token_type_ids")
    if block_type is not None and token_types is not None:
        changes[BLOCKS_KEY] = block_ids(token_types, flat.boundaries.starts, block_type)
    return changes


def add_image_text(model: torch.nn.Module) -> bool:
    """Register the image-text checks and changes with the guard of `model` where its family reads per-token types,
    3-D positions or image blocks; whether it does."""
    rope_index = rope_index_of(model)
    block_type = family_of(getattr(model.config, "model_type", "")).block_token_type
    if rope_index is None and block_type is None and token_types_read(model) is None:
        return False
    changes = functools.partial(_changes, rope_index, block_type)
    add_feature(model, Feature("image-text", changes=changes, text_positions=_text_positions if rope_index else None))
    return True
