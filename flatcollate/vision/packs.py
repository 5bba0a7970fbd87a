"""Packs of image-text examples: built from examples (`pack_examples`), split back into them (`split_packs`).

A pack is one row holding several whole examples back to back (`flatcollate.data.pack_dataset` on encoded rows):
per-token fields concatenated, `seq_lengths` saying it is a pack and where its examples start (restarting
`position_ids` agree with it), and every vision field holding one entry per example, in example order, None for an
example without images::

    pack   input_ids       [t <i i i i> t | t t t | <i i> t]      seq_lengths [6, 3, 3]
           pixel_values    [(16, D), None, (8, D)]
           image_grid_thw  [[[1 4 4]], None, [[1 2 4]]]
    split  example 0       input_ids [t <i i i i> t]   pixel_values (16, D)   image_grid_thw [[1 4 4]]
           example 1       input_ids [t t t]
           example 2       input_ids [<i i> t]         pixel_values (8, D)    image_grid_thw [[1 2 4]]

`VisionDataCollatorWithFlattening` splits every pack of a batch into its examples before it collates, so each example
is checked against its own images (a pack checked as one row would accept images in the wrong example order
whenever the totals agree, as for Gemma 3, whose images all fill the same number of placeholders) and gets its own
positions, exactly as the same examples collated unpacked.
"""

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from .._conventions import IMAGE_FIELDS, TOKEN_TYPE_FIELDS
from ..boundaries import lengths_to_cu_seqlens
from ..collate.features import MASK_KEYS, segment_lengths

PER_TOKEN = ("input_ids", "labels", "attention_mask", *MASK_KEYS, *TOKEN_TYPE_FIELDS)
"""Fields of a pack with one value per token, split at the examples' boundaries."""

BOUNDARIES = ("seq_lengths", "position_ids")
"""Fields that mark a pack's examples; the collator writes them again for the split examples."""


def pack_examples(examples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One pack of whole examples, as `pack_dataset` writes a packed row (its Python twin, for in-memory examples).

    Args:
        examples: image-text examples as their processor returns them (`input_ids` `(L,)` int and the other
            `PER_TOKEN` fields, vision fields as arrays or tensors).

    Returns:
        `dict`: the per-token fields concatenated (`np.ndarray` of shape `(sum L,)`), `seq_lengths` (`list[int]`),
        and each vision field any example has as a list with one entry per example (its array, or None).

    >>> pack = pack_examples([{"input_ids": [1, 9, 9], "pixel_values": np.ones((1, 2))}, {"input_ids": [3, 4]}])
    >>> pack["input_ids"].tolist(), pack["seq_lengths"], [p if p is None else p.shape for p in pack["pixel_values"]]
    ([1, 9, 9, 3, 4], [3, 2], [(1, 2), None])
    """
    keys = {key for example in examples for key in example if example[key] is not None}
    pack: dict[str, Any] = {}
    for key in PER_TOKEN:
        if key in keys:
            pack[key] = np.concatenate([_numpy(example[key]).reshape(-1) for example in examples])
    pack["seq_lengths"] = [len(_numpy(example["input_ids"]).reshape(-1)) for example in examples]
    for key in IMAGE_FIELDS:
        if key in keys:
            pack[key] = [example.get(key) for example in examples]
    return pack


GRID_FIELDS = ("image_grid_thw", "video_grid_thw", "image_sizes", "spatial_shapes")
"""Vision fields with one row per image (`(images, k)`) in every family: one level deeper, they are a pack's entries."""

STACKED_VIDEO_DIMS = 5
"""`pixel_values_videos` of an example whose family stacks its videos: `(videos, frames, C, H, W)`."""


def is_pack(feature: Mapping, index: int, *, image_dims: int | None = None) -> bool:
    """Whether `feature` is a pack: it says so with `seq_lengths` (`pack_dataset` and `pack_examples` write it).

    A pack is never guessed from its other fields: one example's positions do not restart, and its vision fields
    would be read as one example's. A feature without `seq_lengths` that shows the signs of a pack whose marker was
    removed (`transformers.Trainer`'s `remove_unused_columns=True` drops it) is refused: restarting positions, a
    per-image field (`GRID_FIELDS`) not `(images, k)`, `pixel_values` one dimension deeper than the family's examples
    (`image_dims`, `VisionLayout.image_dims`), or `pixel_values_videos` deeper than stacked videos.

    Raises:
        `ValueError`: naming the feature, what shows it is a pack, and the fix.
    """
    if "seq_lengths" in feature:
        return True
    if "input_ids" not in feature or not any(feature.get(key) is not None for key in IMAGE_FIELDS):
        return False
    sign = None
    if "position_ids" in feature:
        restarts = len(segment_lengths(feature, len(_numpy(feature["input_ids"]).reshape(-1)), index=index)) - 1
        sign = f"its `position_ids` restart {restarts} times" if restarts else None
    for key in GRID_FIELDS:
        value = feature.get(key)
        if sign is None and value is not None and ndim(value) != 2:
            sign = f"its `{key}` has {ndim(value)} dimensions, not `(images, k)` (one entry per packed example)"
    deeper = (("pixel_values", image_dims), ("pixel_values_videos", STACKED_VIDEO_DIMS))
    for key, dims in deeper:
        if sign is None and dims is not None and feature.get(key) is not None and ndim(feature[key]) == dims + 1:
            sign = f"its `{key}` has {dims + 1} dimensions, one more than the family's examples"
    if sign is None:
        return False
    raise ValueError(
        f"Example {index} carries images and {sign}, but no `seq_lengths`: a pack says it is a pack, or its examples' "
        "images cannot be told apart. `transformers.Trainer` drops `seq_lengths` (not an argument of the model's "
        "forward): pass `TrainingArguments(remove_unused_columns=False)` or train with `FlatSFTTrainer`, which keeps "
        "it; or collate the examples unpacked."
    )


def split_packs(features: Sequence[Any], *, image_dims: int | None = None) -> tuple[list[Any], list[str]]:
    """The batch with every pack replaced by its examples, and how messages name each example.

    Args:
        features: examples and packs (dicts; anything else is passed on for the text collator to name).
        image_dims: dimensions of an example's `pixel_values` where the family fixes them (`is_pack`).

    Returns:
        `(examples, where)`: the examples in batch order, a pack's in pack order; `where[i]` names example `i` in
        the batch as given, `"Example 3"`, or `"Pack 1, example 2"` (the third example of the second feature).

    Raises:
        `ValueError`: a vision field of a pack without one entry per example, naming the pack, the field and the fix.

    >>> pack = {"input_ids": [1, 9, 9, 3], "seq_lengths": [3, 1], "pixel_values": [np.ones((1, 2)), None]}
    >>> examples, where = split_packs([{"input_ids": [5]}, pack])
    >>> where
    ['Example 0', 'Pack 1, example 0', 'Pack 1, example 1']
    >>> [e["input_ids"].tolist() for e in examples[1:]], [sorted(e) for e in examples[1:]]
    ([[1, 9, 9], [3]], [['input_ids', 'pixel_values'], ['input_ids']])
    """
    examples, where = [], []
    # One step per feature and per example of a pack; the tokens are cut with `np.split`.
    for index, feature in enumerate(features):
        if not isinstance(feature, Mapping) or not is_pack(feature, index, image_dims=image_dims):
            examples.append(feature)
            where.append(f"Example {index}")
            continue
        ids = _numpy(feature["input_ids"]).reshape(-1)
        lengths = segment_lengths(feature, len(ids), index=index)
        parts: list[dict] = [{} for _ in lengths]
        cuts = lengths_to_cu_seqlens(lengths)[1:-1]
        for key, value in feature.items():
            if key in BOUNDARIES or value is None:
                continue
            if key in PER_TOKEN:
                pieces = np.split(_numpy(value).reshape(-1), cuts)
            elif key in IMAGE_FIELDS:
                pieces = _entries(value, len(lengths), index=index, field=key)
            else:  # not per token (an id, metadata): each example keeps it, for the collator to judge
                pieces = [value] * len(lengths)
            for part, piece in zip(parts, pieces, strict=True):
                if piece is not None:
                    part[key] = piece
        examples.extend(parts)
        where.extend(f"Pack {index}, example {k}" for k in range(len(lengths)))
    return examples, where


def _entries(value: Any, count: int, *, index: int, field: str) -> list:
    """The per-example entries of a pack's vision field (a list, tuple, object array, or a tensor or array stacked
    on its first dimension when every entry has the same shape)."""
    sized = isinstance(value, list | tuple) or (isinstance(value, torch.Tensor | np.ndarray) and value.ndim > 0)
    if sized and len(value) == count:
        return list(value)
    found = len(value) if sized else "no"
    raise ValueError(
        f"Pack {index}: `{field}` has {found} entries but the pack holds {count} examples (`seq_lengths`). A pack "
        "keeps one entry per example, in example order (None for an example without images), so that each example's "
        "placeholders are checked against its own images. Pack encoded rows with `flatcollate.data.pack_dataset` "
        "(in memory: `flatcollate.vision.packs.pack_examples`), or collate the examples unpacked."
    )


def ndim(value: Any) -> int:
    """Dimensions of a field (a tensor, an array or nested lists); -1 for nested lists of different sizes."""
    try:
        return _numpy(value).ndim
    except ValueError:  # ragged nested lists: per-example entries of different sizes
        return -1


def _numpy(value: Any) -> np.ndarray:
    return value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
