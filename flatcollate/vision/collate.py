"""`VisionDataCollatorWithFlattening`: flattened image-text batches from per-example processor outputs."""

import contextlib
import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from .._conventions import IMAGE_FIELDS, TOKEN_TYPE_FIELDS
from ..collate.flattening import DataCollatorWithFlattening
from ..modeling.token_types import check_example_token_types, token_types_read
from .fields import check_fields, check_vision_model, model_inputs
from .layouts import VisionLayout, expected_placeholders, image_count, placeholder_runs, placeholders_per_image
from .packs import STACKED_VIDEO_DIMS, ndim, split_packs


class VisionDataCollatorWithFlattening(DataCollatorWithFlattening):
    """Concatenates a mini-batch of image-text examples into one row, images in example order.

    Each example is what the family's processor returns for that example alone: `input_ids` (image placeholders
    already expanded), optional `labels` and masks, per-token type ids (`mm_token_type_ids` or `token_type_ids`, 1-D),
    and its vision fields (`pixel_values`, `image_grid_thw`, `image_sizes`, `pixel_attention_mask`, ...). Text fields
    are flattened as by `DataCollatorWithFlattening`; per-token type ids are concatenated like `input_ids`; vision
    fields are concatenated in example order on their image dimension::

        example 0   [t t <i i i i> t]          pixel_values (16, D)   image_grid_thw [[1 4 4]]
        example 1   [t <i i> t t <i i> t]      pixel_values (16, D)   image_grid_thw [[1 2 4] [1 4 2]]
        batch       [t t <i i i i> t | t <i i> t t <i i> t]
                    pixel_values (32, D)       image_grid_thw [[1 4 4] [1 2 4] [1 4 2]]

    Every example must hold exactly the placeholders its own images fill, counted per example by the family's own rule
    (`flatcollate.vision.counts`: from `image_grid_thw`, `image_sizes`, real tiles, ...); otherwise a surplus in one
    example and a shortfall in the next (two examples given each other's images) would move an image into the wrong
    sequence without any error from the model. A field the model's forward takes that the collator cannot place is
    refused, never dropped (`flatcollate.vision.fields`).

    A feature may be a pack of whole examples (`flatcollate.data.pack_dataset` on encoded rows: `seq_lengths`, and
    every vision field with one entry per example, `flatcollate.vision.packs`); one pack or several per batch. Each
    pack is split into its examples first, so every example is checked against its own images and the batch is the
    one its examples give unpacked; messages name them `Pack p, example k`.

    Prepare the model with `flatcollate.prepare_model_for_flattening`: multimodal-RoPE families (Qwen2/2.5/3-VL,
    GLM-4V) then get their 3-D positions per sequence from the model's own `get_rope_index`.

    Args:
        layout (`VisionLayout`, *optional*): the family's layout; `VisionDataCollatorWithFlattening.from_model(model)`
            reads it from the model's config. Without one, vision fields are concatenated on dimension 0 and only the
            presence of placeholders is checked.
        token_types (`str`, *optional*): the per-token types the family reads (`mm_token_type_ids`,
            `token_type_ids`; `from_model` sets it); an example with images but without them is refused.
        kwargs: options of `DataCollatorWithFlattening`.

    >>> collator = VisionDataCollatorWithFlattening(layout=VisionLayout(image_token_id=9, tokens_per_image=2))
    >>> batch = collator([
    ...     {"input_ids": [1, 9, 9, 2], "pixel_values": torch.zeros(1, 3, 4, 4)},
    ...     {"input_ids": [3, 4]},
    ...     {"input_ids": [9, 9, 5], "pixel_values": torch.ones(1, 3, 4, 4)},
    ... ])
    >>> batch["input_ids"].tolist(), batch["cu_seq_lens_q"].tolist(), tuple(batch["pixel_values"].shape)
    ([[1, 9, 9, 2, 3, 4, 9, 9, 5]], [0, 4, 6, 9], (2, 3, 4, 4))
    """

    def __init__(self, *args, layout: VisionLayout | None = None, token_types: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.layout = layout if layout is not None else VisionLayout()
        self.token_types = token_types

    @classmethod
    def from_model(cls, model, **kwargs) -> "VisionDataCollatorWithFlattening":
        """A collator with the layout of `model`'s family (a model or its config; PEFT wrappers are read through) and,
        given a model, the parameters of its forward (`VisionLayout.model_inputs`).

        Raises:
            `ValueError`: `model` has no vision tower (`flatcollate.vision.fields.check_vision_model`).
        """
        check_vision_model(model)
        config = getattr(model, "config", model)
        kwargs.setdefault("vocab_size", getattr(config.get_text_config(), "vocab_size", None))
        kwargs.setdefault("token_types", token_types_read(model) if isinstance(model, torch.nn.Module) else None)
        layout = VisionLayout.from_config(config)
        if isinstance(model, torch.nn.Module):
            layout = dataclasses.replace(layout, model_inputs=model_inputs(model))
        return cls(layout=layout, **kwargs)

    def __call__(
        self, features: Sequence[Mapping[str, Any]], return_tensors: str | None = None, separator_id: int | None = None
    ) -> dict[str, Any]:
        return_tensors = return_tensors or self.return_tensors
        if isinstance(features, Mapping) or not isinstance(features, Sequence):
            raise TypeError(f"features must be a list of examples (dicts), got {type(features).__name__}.")
        features, where = split_packs(features, image_dims=self.layout.image_dims)
        with _named(where):
            check_fields(features, self.layout.model_inputs)
        text = [_without(feature, (*IMAGE_FIELDS, *TOKEN_TYPE_FIELDS)) for feature in features]
        with _named(where):
            batch = super().__call__(text, return_tensors="np", separator_id=separator_id)
        length = batch["input_ids"].shape[1]
        ids = [_numpy(feature["input_ids"]).reshape(-1) for feature in features]
        counts = [self._check_placeholders(f, row, name) for f, row, name in zip(features, ids, where, strict=True)]
        if self.layout.same_count and self.layout.tokens_per_image is None:
            _check_same_count([images for images, _ in counts], where, "images")
        if any(videos is not None for _, videos in counts):  # stacked videos with no rule: one count for all
            _check_same_count([videos or (0, 0) for _, videos in counts], where, "videos")
        with _named(where):
            check_example_token_types(features, self.token_types)
        for field in TOKEN_TYPE_FIELDS:
            if any(field in feature for feature in features):
                batch[field] = _token_types(features, ids, field, length, where)
        for field in IMAGE_FIELDS:
            if any(feature.get(field) is not None for feature in features):
                batch[field] = self._images(features, field)
        if return_tensors == "pt":
            batch = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in batch.items()}
        return batch

    def _check_placeholders(
        self, feature: Mapping, ids: np.ndarray, where: str
    ) -> tuple[tuple[int, int], tuple[int, int] | None]:
        """Raise when the example's placeholders are not what its own images (videos) fill; returns its
        `(image placeholders, images)`, and `(video placeholders, videos)` where its videos are stacked
        `(videos, frames, C, H, W)` and no rule counts them (the batch's videos then share one count)."""
        layout, counts, stacked = self.layout, (0, 0), None
        checks = ((False, layout.image_token_id, "pixel_values"), (True, layout.video_token_id, "pixel_values_videos"))
        for video, token, field in checks:
            if token is None:
                continue
            found = int((ids == token).sum())
            try:
                expected = expected_placeholders(feature, layout, video=video)
                images = image_count(feature, layout, field)
            except ValueError as error:  # a field the family counts from is missing
                raise ValueError(f"{where}: {error}") from None
            if not video:
                counts = (found, images)
            elif expected is None and ndim(feature.get(field)) == STACKED_VIDEO_DIMS:
                stacked = (found, images)
            if expected is None and (found > 0) != (images > 0):
                expected = "some" if images else 0
            if expected is not None and found != expected:
                tiled = "pixel_values" in layout.batch_first  # Idefics-style rows of tiles (Fuyu: of patches)
                noun = "videos" if video else "images (tiles)" if tiled else "images"
                raise ValueError(
                    f"{where}: `input_ids` hold {found} placeholder tokens (id {token}) but its {images} "
                    f"{noun} fill {expected}. Flattened, the features would land in another "
                    "example's sequence. Process each example's text and images together (the processor expands the "
                    "placeholders), and do not truncate inside an image."
                )
        if layout.image_token_id is not None:
            _check_image_order(feature, ids, layout, where)
        if layout.video_token_id is not None and layout.merge_size is not None:
            _check_video_order(feature, ids, layout, where)
        return counts, stacked

    def _images(self, features: Sequence[Mapping], field: str) -> np.ndarray:
        layout = self.layout
        axis = 1 if field in layout.batch_first else 0
        parts = [np.asarray(_numpy(f[field])) for f in features if f.get(field) is not None]
        if field in layout.padded:  # zeros after each image's extent, as the processor pads within one example
            widest = np.max([part.shape for part in parts], axis=0)
            parts = [
                np.pad(p, [(0, 0), *((0, int(w - n)) for w, n in zip(widest[1:], p.shape[1:], strict=True))])
                for p in parts
            ]
        shapes = {part.shape[:axis] + part.shape[axis + 1 :] for part in parts}
        if len(shapes) > 1:
            fix = "Process the images at one resolution"
            if field == "pixel_values_videos":  # (videos, frames, C, H, W): the model stacks the batch's videos
                fix = "The videos differ in frames or size: sample every video to one number of frames (one size)"
            raise ValueError(
                f"`{field}` of the examples differ in shape beyond the image dimension ({sorted(shapes)}); they cannot "
                f"be concatenated. {fix}, or pass the family's `layout` (`VisionDataCollatorWithFlattening.from_model("
                "model)`)."
            )
        out = np.concatenate(parts, axis=axis)
        # Nested Python floats (a `datasets` column read without a torch format) come back as float64; processors
        # emit float32, which is what the vision towers take.
        return out.astype(np.float32) if out.dtype == np.float64 else out


def _without(feature: Mapping, keys: tuple[str, ...]) -> dict:
    if not isinstance(feature, Mapping):
        return feature  # the base collator names the bad example
    return {key: value for key, value in feature.items() if key not in keys}


def _check_image_order(feature: Mapping, ids: np.ndarray, layout: VisionLayout, where: str) -> None:
    """Raise when the example's images fill its placeholder runs in another order (its total agrees).

    Compared where the example has one run of image placeholders per image: each image gives at least one run, so
    as many runs as images means one run each (tiles and rows of one image, or images without a separator between
    them, give other run counts and are checked by their total only)::

        input_ids       [t <s i i i i e> t <s i i e> t]     runs [4, 2]
        image_grid_thw  [[1 2 4] [1 4 4]]                   fill [2, 4]   -> refused: image 0 fills 2, its run holds 4
    """
    per_image = placeholders_per_image(feature, layout)
    if per_image is None:
        return
    runs = placeholder_runs(ids, layout.image_token_id)
    if len(runs) != len(per_image) or (runs == per_image).all():
        return
    k = int(np.flatnonzero(runs != per_image)[0])
    raise ValueError(
        f"{where}: image {k} fills {per_image[k]} placeholder tokens but its run of placeholders (the {k + 1}th of "
        f"`input_ids`) holds {runs[k]} (runs {runs.tolist()}, images {per_image.tolist()}): the example's images are "
        "not in the order of their placeholders, and each would land on another image's tokens. Keep the vision "
        "fields (`pixel_values`, `image_grid_thw`, ...) in the order the images appear in the text, as the processor "
        "returns them."
    )


def _check_video_order(feature: Mapping, ids: np.ndarray, layout: VisionLayout, where: str) -> None:
    """Raise when a video of the example (grid families) does not end where a run of video placeholders ends.

    A video fills one run (Qwen2/2.5-VL) or one run per temporal patch, between timestamps (Qwen3-VL); either way its
    placeholders end with a run. Checked where the runs are at least the videos (videos without a separator between
    them merge their runs), the total being checked before::

        input_ids       [t <s v v v v e> t <s v v e> t]     runs [4, 2]    run ends [4, 6]
        video_grid_thw  [[1 2 4] [2 2 4]]                   fill [2, 4]    video ends [2, 6]   -> refused: video 0
    """
    grid = feature.get("video_grid_thw")
    if grid is None:
        return
    runs = placeholder_runs(ids, layout.video_token_id)
    fills = _numpy(grid).reshape(-1, 3).prod(-1).astype(np.int64) // layout.merge_size**2
    if len(runs) < len(fills) or runs.sum() != fills.sum():
        return
    ends = ~np.isin(np.cumsum(fills), np.cumsum(runs))
    if not ends.any():
        return
    k = int(np.flatnonzero(ends)[0])
    raise ValueError(
        f"{where}: video {k} fills {fills[k]} placeholder tokens of `video_grid_thw` but no run of video placeholders "
        f"ends there (runs {runs.tolist()}, videos {fills.tolist()}): the example's videos are not in the order of "
        "their placeholders, and each would land on another video's tokens. Keep the video fields "
        "(`pixel_values_videos`, `video_grid_thw`, `second_per_grid_ts`) in the order the videos appear in the text, "
        "as the processor returns them."
    )


def _check_same_count(counts: list[tuple[int, int]], where: list[str], noun: str) -> None:
    """Where every image (video) of a batch fills the same number of placeholders: every example of the batch agrees.

    Args:
        counts: `(placeholders, images)` (`(placeholders, videos)`) of each example.
        where: how messages name each example (`packs.split_packs`).
        noun: `"images"` or `"videos"`.
    """
    first = None
    for index, (found, images) in enumerate(counts):
        if not images:
            continue
        per_image = found / images
        if first is None:
            first = (index, per_image)
        elif per_image != first[1]:
            other = where[first[0]][0].lower() + where[first[0]][1:]  # "example 0", "pack 1, example 2"
            raise ValueError(
                f"{where[index]}: its {images} {noun} have {found} placeholder tokens ({per_image:g} each), but "
                f"{other}'s have {first[1]:g} each; every one of the batch fills the same number. Process each "
                f"example's text and {noun} together, and do not truncate inside one."
            )


@contextlib.contextmanager
def _named(where: list[str]):
    """Checks of other modules name an example `Example i` by its place in the split batch: name it by `where`."""
    try:
        yield
    except ValueError as error:
        found = re.match(r"Example (\d+)", str(error), flags=re.IGNORECASE)
        if found is None or where[int(found[1])] == f"Example {found[1]}":
            raise
        raise ValueError(where[int(found[1])] + str(error)[found.end() :]) from None


def _numpy(value: Any) -> np.ndarray:
    return value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)


def _token_types(
    features: Sequence[Mapping], ids: list[np.ndarray], field: str, length: int, where: list[str]
) -> np.ndarray:
    """`(1, T)` int64: the examples' per-token types back to back, 0 (text) on the row's padding."""
    parts = []
    for index, (feature, row) in enumerate(zip(features, ids, strict=True)):
        value = feature.get(field)
        types = np.zeros(len(row), dtype=np.int64) if value is None else _numpy(value).reshape(-1).astype(np.int64)
        if len(types) != len(row):
            raise ValueError(
                f"{where[index]}: `{field}` has {len(types)} entries but `input_ids` has {len(row)}; pass the "
                "processor's output for the example unchanged."
            )
        parts.append(types)
    flat = np.concatenate(parts)
    return np.pad(flat, (0, length - len(flat)))[None]
