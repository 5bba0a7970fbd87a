"""How each vision-language family lays out an example's images, and how many placeholder tokens each image fills.

A processor expands every image of an example into placeholder tokens in `input_ids`; the model replaces them, in
order, with the vision tower's features. Flattening concatenates the examples' images in example order, so the
features still land on their own example's placeholders, provided every example holds exactly as many placeholders as
its images fill. A surplus in one example and a shortfall in the next cancel in the model's own total check and move
an image into the wrong sequence: the collator counts per example (`expected_placeholders`), by the family's own rule
(`flatcollate.vision.counts`).
"""

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ..families import family_of
from .counts import Rule, image_token_rule, stated_count


@dataclass(frozen=True)
class VisionLayout:
    """What the vision collator needs to know about a family.

    Attributes:
        image_token_id (`int`, *optional*): the image placeholder id (counts are checked when set).
        video_token_id (`int`, *optional*): the video placeholder id (`video_token_id`, or `video_token_index`).
        frame_tokens (`int`, *optional*): placeholders of each frame of a video whose `pixel_values_videos` are
            `(videos, frames, C, H, W)`, each video then ending with one newline placeholder (`pooled_frame_tokens`).
        merge_size (`int`, *optional*): spatial merge of grid families (`vision_config.spatial_merge_size`, where
            `Family.grid_layout`).
        tokens_per_image (`int`, *optional*): placeholders of every image, for families whose config states it
            (`flatcollate.vision.counts.stated_count`).
        image_tokens (`Callable`, *optional*): the family's rule, `(example) -> (images,) int64` placeholders of each
            image from the example's vision fields (`flatcollate.vision.counts.image_token_rule`).
        same_count (`bool`): every image fills the same (unknown) number of placeholders (`Family.fixed_count`, and
            no rule knows the count); checked across the batch.
        batch_first (`tuple[str, ...]`): fields laid out `(1, images, ...)` per example (`Family.batch_first`).
        padded (`tuple[str, ...]`): fields padded on dimension 1 to concatenate (`Family.padded`: the processor
            zero-pads images to the batch's largest, and the collator pads the examples' images the same way).
        image_dims (`int`, *optional*): dimensions of an example's `pixel_values` where the family fixes them:
            `(images, C, H, W)` where each image is one feature map (`Family.fixed_count`), `(1, tiles, C, H, W)` for
            batch-first tiles of a vision tower, `(1, patches, D)` for batch-first patch rows of a family without one
            (Fuyu). A pack's entries, one per example, have one more (`flatcollate.vision.packs.is_pack`).
        model_inputs (`frozenset[str]`, *optional*): the parameters of the model's `forward` (set by
            `VisionDataCollatorWithFlattening.from_model`): an example's field among them that the collator cannot
            place is refused rather than dropped.
    """

    image_token_id: int | None = None
    video_token_id: int | None = None
    frame_tokens: int | None = None
    merge_size: int | None = None
    tokens_per_image: int | None = None
    image_tokens: Rule | None = None
    same_count: bool = False
    batch_first: tuple[str, ...] = ()
    padded: tuple[str, ...] = ()
    image_dims: int | None = None
    model_inputs: frozenset[str] | None = None

    @classmethod
    def from_config(cls, config) -> "VisionLayout":
        """The layout of a family from its (composite) config.

        >>> from transformers import Qwen2VLConfig
        >>> VisionLayout.from_config(Qwen2VLConfig()).merge_size
        2
        """
        family = family_of(config.model_type)
        image = getattr(config, "image_token_id", None)
        image = getattr(config, "image_token_index", None) if image is None else image
        vision = getattr(config, "vision_config", None)
        merge = getattr(vision, "spatial_merge_size", None) if family.grid_layout else None
        rule = image_token_rule(config)
        video = getattr(config, "video_token_id", None)
        rows = 5 if vision is not None else 3  # batch-first tiles of a vision tower, or patch rows (Fuyu, no tower)
        return cls(
            image_token_id=image,
            video_token_id=getattr(config, "video_token_index", None) if video is None else video,
            frame_tokens=pooled_frame_tokens(config),
            merge_size=merge,
            tokens_per_image=stated_count(config),
            image_tokens=rule,
            same_count=family.fixed_count and rule is None,
            batch_first=family.batch_first,
            padded=family.padded,
            image_dims=4 if family.fixed_count else rows if "pixel_values" in family.batch_first else None,
        )


def pooled_frame_tokens(config) -> int | None:
    """Placeholders of each video frame where the family pools every frame's patch grid 2 x 2 (rounding up) and ends
    each video with a newline (LLaVA-OneVision's `apply_pooling`), else None.

    >>> from transformers import LlavaOnevisionConfig
    >>> pooled_frame_tokens(LlavaOnevisionConfig())  # SigLIP at 384 pixels, patches of 14: 27 x 27 -> 14 x 14
    196
    """
    if not family_of(config).pooled_frames:
        return None
    side = config.vision_config.image_size // config.vision_config.patch_size
    return math.ceil(side / 2) ** 2


def image_count(example: Mapping, layout: VisionLayout, field: str = "pixel_values") -> int:
    """Number of images (or crops) an example holds, from its `pixel_values` (0 when it has none)."""
    value = example.get(field)
    if value is None:
        return 0
    if layout.image_tokens is not None and field == "pixel_values":
        return len(layout.image_tokens(example))
    if layout.merge_size is not None:  # grid families: one row of `*_grid_thw` per image
        grid = example.get("image_grid_thw" if field == "pixel_values" else "video_grid_thw")
        return 0 if grid is None else int(np.asarray(grid).reshape(-1, 3).shape[0])
    shape = np.shape(value)
    return int(shape[1]) if field in layout.batch_first else int(shape[0])


def expected_placeholders(example: Mapping, layout: VisionLayout, *, video: bool = False) -> int | None:
    """Placeholders the example's images (videos) fill, or None where the family does not say.

    Raises `ValueError` when the example carries images without a field its family counts them from.
    """
    if not video and layout.image_tokens is not None:
        return 0 if example.get("pixel_values") is None else int(layout.image_tokens(example).sum())
    if layout.merge_size is not None:
        grid = example.get("video_grid_thw" if video else "image_grid_thw")
        if grid is None:
            return 0
        return int(np.asarray(grid).reshape(-1, 3).prod(-1).sum()) // layout.merge_size**2
    if video and layout.frame_tokens is not None:  # (videos, frames, C, H, W): frames pooled, then a newline each
        videos = example.get("pixel_values_videos")
        shape = (0, 0) if videos is None else np.shape(videos)
        return int(shape[0]) * (int(shape[1]) * layout.frame_tokens + 1)
    if video:
        return None
    if layout.tokens_per_image is not None:
        return image_count(example, layout) * layout.tokens_per_image
    return None


def placeholders_per_image(example: Mapping, layout: VisionLayout) -> np.ndarray | None:
    """`(images,)` int64 placeholders of each image of the example, in order, or None where the family does not say."""
    if example.get("pixel_values") is None:
        return None
    if layout.image_tokens is not None:
        return np.asarray(layout.image_tokens(example), dtype=np.int64).reshape(-1)
    if layout.merge_size is not None and example.get("image_grid_thw") is not None:
        return np.asarray(example["image_grid_thw"]).reshape(-1, 3).prod(-1).astype(np.int64) // layout.merge_size**2
    if layout.tokens_per_image is not None:
        return np.full(image_count(example, layout), layout.tokens_per_image, dtype=np.int64)
    return None


def placeholder_runs(ids: np.ndarray, token: int) -> np.ndarray:
    """`(runs,)` int64 lengths of the runs of `token` in `ids` (`(T,)` int), in order.

    >>> placeholder_runs(np.array([1, 9, 9, 2, 9, 3, 9, 9, 9]), 9).tolist()
    [2, 1, 3]
    """
    edges = np.diff(np.concatenate([[0], (ids == token).astype(np.int8), [0]]))
    return np.flatnonzero(edges == -1) - np.flatnonzero(edges == 1)
