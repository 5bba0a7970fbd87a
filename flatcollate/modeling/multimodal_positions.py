"""Multimodal rotary positions (mRoPE) of a flattened row, computed per sequence by the model's own `get_rope_index`.

Qwen2-VL, Qwen2.5-VL, Qwen3-VL, GLM-4V and their relatives rotate each token by three positions (time, height, width):
text tokens count up on all three, an image's tokens take their grid coordinates, and the text after an image
continues from the image's largest coordinate. Two sequences of a flattened row, the first with one 2 x 2 image::

    tokens        t  t  <img> i  i  i  i  </img> t | t  t  t
    text row      0  1  2     3  4  5  6  7      8 | 0  1  2      restarting positions (cu_seq_lens)
    time row      0  1  2     3  3  3  3  5      6 | 0  1  2
    height row    0  1  2     3  3  4  4  5      6 | 0  1  2
    width row     0  1  2     3  4  3  4  5      6 | 0  1  2

The model's `get_rope_index` numbers one example per batch row; run on the whole flattened row it would number the
second sequence after the first. `multimodal_position_ids` lays the row out as one batch row per sequence (padded,
with an attention mask), calls `get_rope_index` once, and reads the positions back in row order: the images of the
row are consumed in order, which is the order of the sequences. The text row goes first, as transformers expects for
packed rows: `position_ids` of shape `(4, 1, T)`.
"""

import inspect
from collections.abc import Callable

import torch

from .._conventions import IDS_DTYPE
from ..boundaries import Boundaries

ROPE_INDEX_INPUTS = ("mm_token_type_ids", "image_grid_thw", "video_grid_thw", "second_per_grid_ts")
"""Forward arguments `get_rope_index` reads besides `input_ids` (those its signature names are passed)."""


def rope_index_of(model: torch.nn.Module) -> Callable | None:
    """The `get_rope_index` method of a multimodal-RoPE model (on it or its inner `model`), or None."""
    for candidate in (model, getattr(model, "model", None)):
        method = getattr(candidate, "get_rope_index", None)
        if callable(method):
            return method
    return None


def multimodal_position_ids(
    rope_index: Callable, input_ids: torch.Tensor, boundaries: Boundaries, **inputs: torch.Tensor | None
) -> torch.Tensor:
    """Positions of a flattened multimodal row: the text row, then the model's 3-D positions of each sequence.

    Args:
        rope_index (`Callable`): the model's `get_rope_index` (see `rope_index_of`).
        input_ids (`torch.Tensor` of shape `(1, T)`, int64): the flattened row.
        boundaries (`Boundaries`): where the row's sequences start.
        inputs: `mm_token_type_ids` `(1, T)`, `image_grid_thw` `(num_images, 3)`, `video_grid_thw`
            `(num_videos, 3)`, `second_per_grid_ts` `(num_videos,)`, as given to the model (None where absent).

    Returns:
        `torch.Tensor` of shape `(4, 1, T)`, int64: restarting text positions, then time, height and width.
    """
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError(
            f"A flattened multimodal batch is one row; got `input_ids` of shape {tuple(input_ids.shape)}. Collate it "
            "with `flatcollate.vision.VisionDataCollatorWithFlattening`."
        )
    device = input_ids.device
    sequences, longest = len(boundaries.host) - 1, boundaries.max_length
    # One batch row per sequence, left-aligned: token j of sequence s sits at (s, j).
    row_of, column = boundaries.seq_idx.to(device).long(), boundaries.position_ids().to(device)
    mask = torch.zeros(sequences, longest, dtype=torch.bool, device=device)
    mask[row_of, column] = True

    def per_sequence(flat: torch.Tensor) -> torch.Tensor:
        grid = torch.zeros(sequences, longest, dtype=flat.dtype, device=device)
        grid[row_of, column] = flat.reshape(-1)
        return grid

    accepted = inspect.signature(rope_index).parameters
    extra = {name: value for name, value in inputs.items() if value is not None and name in accepted}
    if "mm_token_type_ids" in extra:
        extra["mm_token_type_ids"] = per_sequence(extra["mm_token_type_ids"])
    elif "mm_token_type_ids" in accepted:  # a text-only row: every token is text (type 0)
        extra["mm_token_type_ids"] = torch.zeros(sequences, longest, dtype=torch.int32, device=device)
    spatial, _ = rope_index(per_sequence(input_ids), attention_mask=mask.long(), **extra)
    spatial = spatial[:, row_of, column].to(IDS_DTYPE)  # (3, T), back in row order
    text = column.to(IDS_DTYPE)
    return torch.cat([text[None], spatial], dim=0)[:, None, :]


def checked_multimodal_positions(
    rope_index: Callable, arguments: dict, text_positions: torch.Tensor, boundaries: Boundaries
) -> torch.Tensor:
    """The `(4, 1, T)` positions a flattened batch of a multimodal-RoPE model runs with (the guard calls this).

    Args:
        rope_index (`Callable`): the model's `get_rope_index`.
        arguments (`dict`): the forward's arguments: `input_ids` `(1, T)`, the `ROPE_INDEX_INPUTS`, and
            `position_ids` when the batch brings its own (`(4, 1, T)`: text row first).
        text_positions (`torch.Tensor` of shape `(1, T)`, int64): restarting positions already checked against the
            batch's boundaries.
        boundaries (`Boundaries`): the batch's boundaries.

    Raises:
        `ValueError` when the batch brings 3-D positions that differ from the per-sequence ones, or images without
        `input_ids` to place them.
    """
    input_ids = arguments.get("input_ids")
    if not isinstance(input_ids, torch.Tensor):
        if any(arguments.get(name) is not None for name in ROPE_INDEX_INPUTS[1:]):
            raise ValueError(
                "A flattened batch with images needs `input_ids` to place each image's 3-D positions; pass "
                "`input_ids` rather than `inputs_embeds`."
            )
        return text_positions[None].expand(4, -1, -1)
    inputs = {name: arguments.get(name) for name in ROPE_INDEX_INPUTS}
    positions = multimodal_position_ids(rope_index, input_ids, boundaries, **inputs)
    given = arguments.get("position_ids")
    if isinstance(given, torch.Tensor) and given.dim() == 3:
        differ = torch.nonzero((given[1:].to(positions.device) != positions[1:]).any(0).reshape(-1))
        if differ.numel():
            raise ValueError(
                f"The batch's 3-D `position_ids` differ from the model's own `get_rope_index` run on each sequence "
                f"(first at token {int(differ[0])}): the positions would run on across sequences or misplace an "
                "image. Leave `position_ids` out (flatcollate computes them per sequence) or pass the text row only."
            )
    return positions
