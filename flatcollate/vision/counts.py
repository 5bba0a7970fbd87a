"""How many placeholder tokens each image of an example fills, per family: the model's own rule, applied to the
example's vision fields with the numbers of the family's config.

The model checks only a batch's total: images handed to the wrong example (two examples given each other's images)
balance in the total of a flattened batch and run in the other sequence. The collator therefore counts each example
from its own images. A rule is a pure function `(example) -> (images,) int64` bound to the family's numbers with
`functools.partial` (a partial pickles, so a collator crosses into `DataLoader` workers)::

    family                          one image fills                                   read from
    Qwen2/2.5/3-VL, GLM-4V, ...     t * h * w / merge**2                              image_grid_thw
    VideoLLaMA 3                    t * h * w / merge_i**2                            image_grid_thw, image_merge_sizes
    LLaVA-NeXT(-Video), OneVision   base + rows * (cols + 1) of the unpadded grid     image_sizes (batch_num_images)
    Pixtral (Mistral 3, ...)        (H // (patch * merge)) * (W // (patch * merge))   image_sizes
    LFM2-VL                         (h // factor) * (w // factor)                     spatial_shapes
    Idefics2/3, SmolVLM             tokens per tile * real tiles                      pixel_values (all-zero: padding)
    Granite Docling                 tokens per tile * real tiles                      pixel_attention_mask
    Fuyu                            one per patch                                     pixel_values
    LLaVA, Gemma 3, PaliGemma, ...  a fixed count from the config                     pixel_values (images)

Families without a rule here (`image_token_rule` returns None) are checked for the presence of placeholders only.
"""

import functools
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from transformers.models.llava_next.modeling_llava_next import get_anyres_image_grid_shape, unpad_image

from ..families import family_of

Rule = Callable[[Mapping[str, Any]], np.ndarray]


def image_token_rule(config) -> Rule | None:
    """The rule giving each image's placeholder count for `config`'s family, or None where it is not known.

    >>> from transformers import AutoConfig
    >>> rule = image_token_rule(AutoConfig.for_model("qwen2_vl"))
    >>> rule({"pixel_values": np.zeros((40, 8)), "image_grid_thw": [[1, 4, 4], [1, 4, 6]]}).tolist()
    [4, 6]
    """
    family, vision = config.model_type, getattr(config, "vision_config", None)
    if (merge_attribute := family_of(family).spatial_merge) is not None:
        merge = getattr(vision, merge_attribute)
        return functools.partial(grid_tokens, area=int(np.prod(merge)) if isinstance(merge, list | tuple) else merge**2)
    if family == "video_llama_3":
        return functools.partial(grid_tokens, merge_field="image_merge_sizes")
    if family in ("gemma3", "shieldgemma2"):
        return functools.partial(fixed_tokens, tokens=config.mm_tokens_per_image)
    if family in ("mistral3", "lighton_ocr", "mistral_large4"):
        return functools.partial(sized_tokens, stride=vision.patch_size * config.spatial_merge_size)
    if family == "lfm2_vl":
        return functools.partial(spatial_tokens, factor=config.downsample_factor)
    if family == "fuyu":
        return patch_tokens
    if family in ("idefics3", "smolvlm", "granite_docling", "idefics2"):
        tiles = real_tile_tokens if family != "granite_docling" else masked_tile_tokens
        if family == "idefics2":
            return functools.partial(tiles, tokens=config.perceiver_config.resampler_n_latents)
        scale = config.scale_factor if family != "granite_docling" else vision.scale_factor
        return functools.partial(tiles, tokens=int(_patches(vision) / scale**2))
    if family == "llava" and getattr(vision, "model_type", None) == "pixtral":
        return functools.partial(sized_tokens, stride=vision.patch_size)
    tokens = _fixed_count(config)
    if tokens is not None:
        return functools.partial(fixed_tokens, tokens=tokens)
    if family in ("llava_next", "llava_next_video", "llava_onevision"):
        crop = _crop_tokens(config)
        if crop is None:
            return None
        aspect = getattr(config, "vision_aspect_ratio", None) if family == "llava_onevision" else None
        return functools.partial(
            anyres_tokens,
            crop_tokens=crop,
            side=vision.image_size,
            feature_side=vision.image_size // vision.patch_size,
            pinpoints=[list(p) for p in config.image_grid_pinpoints],
            max_crops=int(aspect.removeprefix("anyres_max_")) if aspect else None,
        )
    return None


# ---- rules: `(example) -> (images,) int64` --------------------------------------------------------------------------


def grid_tokens(example: Mapping, *, area: int | None = None, merge_field: str | None = None) -> np.ndarray:
    """`t * h * w / merge**2` per image, `image_grid_thw: (images, 3) int64`; the merge per image from `merge_field`
    (`image_merge_sizes: (images,) int64`, VideoLLaMA 3) where given."""
    grid = _field(example, "image_grid_thw").reshape(-1, 3).astype(np.int64)
    if merge_field is not None:
        area = _field(example, merge_field).reshape(-1).astype(np.int64) ** 2
    return grid.prod(-1) // area


def fixed_tokens(example: Mapping, *, tokens: int) -> np.ndarray:
    """`tokens` for each image of `pixel_values: (images, C, H, W)`."""
    return np.full(np.shape(_field(example, "pixel_values"))[0], tokens, dtype=np.int64)


def sized_tokens(example: Mapping, *, stride: int) -> np.ndarray:
    """Pixtral: `(H // stride) * (W // stride)` per image, `image_sizes: (images, 2)` in pixels."""
    sizes = _field(example, "image_sizes").reshape(-1, 2).astype(np.int64)
    return (sizes // stride).prod(-1)


def spatial_tokens(example: Mapping, *, factor: int) -> np.ndarray:
    """LFM2-VL: `(h // factor) * (w // factor)` per image, `spatial_shapes: (images, 2)` in patches."""
    shapes = _field(example, "spatial_shapes").reshape(-1, 2).astype(np.int64)
    return (shapes // factor).prod(-1)


def patch_tokens(example: Mapping) -> np.ndarray:
    """Fuyu: one token per patch, `pixel_values: (1, patches, P * P * C)`."""
    shape = np.shape(_field(example, "pixel_values"))
    return np.full(shape[0], shape[1], dtype=np.int64)


def real_tile_tokens(example: Mapping, *, tokens: int) -> np.ndarray:
    """Idefics2/3, SmolVLM: `tokens` per tile of `pixel_values: (1, tiles, C, H, W)` that is not all zero (the
    model drops all-zero tiles as padding)."""
    pixels = _field(example, "pixel_values")
    real = np.any(pixels.reshape(-1, int(np.prod(pixels.shape[-3:]))) != 0, axis=-1)
    return np.full(int(real.sum()), tokens, dtype=np.int64)


def masked_tile_tokens(example: Mapping, *, tokens: int) -> np.ndarray:
    """Granite Docling: `tokens` per tile marked real in `pixel_attention_mask: (1, tiles) bool`."""
    real = _field(example, "pixel_attention_mask").reshape(-1).astype(bool)
    return np.full(int(real.sum()), tokens, dtype=np.int64)


def anyres_tokens(
    example: Mapping, *, crop_tokens: int, side: int, feature_side: int, pinpoints: list, max_crops: int | None
) -> np.ndarray:
    """LLaVA-NeXT(-Video), LLaVA-OneVision: per image `image_sizes: (images, 2)` (height, width), the base crop's
    `crop_tokens`, then the crops' feature grid unpadded to the image's aspect ratio, each row closed by a newline::

        base crop    [b b b ... b]                     crop_tokens
        crops        [f f f f n | f f f f n | ...]     rows * (cols + 1), rows x cols = unpadded grid

    OneVision shrinks a grid larger than `max_crops` crops (`vision_aspect_ratio`), and gives an image of an
    example with several images (`batch_num_images` > 1) its base crop and one newline only.
    """
    sizes = _field(example, "image_sizes").reshape(-1, 2).astype(np.int64)
    alone = np.ones(len(sizes), dtype=bool)
    if example.get("batch_num_images") is not None:
        per_example = _array(example["batch_num_images"]).reshape(-1).astype(np.int64)
        alone = np.repeat(per_example == 1, per_example)
    counts = []
    for size, patched in zip(sizes.tolist(), alone.tolist(), strict=True):  # one grid per image
        if not patched:
            counts.append(crop_tokens + 1)
            continue
        grid_h, grid_w = get_anyres_image_grid_shape(size, pinpoints, side)
        rows, cols = unpad_image(torch.empty(0, grid_h * feature_side, grid_w * feature_side), size).shape[1:]
        ratio = math.sqrt(rows * cols / (max_crops * feature_side**2)) if max_crops else 0.0
        if ratio > 1.1:  # the model's own threshold
            rows, cols = int(rows // ratio), int(cols // ratio)
        counts.append(crop_tokens + rows * (cols + 1))
    return np.array(counts, dtype=np.int64)


# ---- the numbers of fixed-count families -------------------------------------------------------------------------


def _fixed_count(config) -> int | None:
    """Placeholders of every image where the family fills a fixed number, from its config; None otherwise."""
    family, vision = config.model_type, getattr(config, "vision_config", None)
    crop = _crop_tokens(config)
    if family in ("llava", "video_llava"):
        return crop
    if family == "vipllava":  # drops the class token whatever the strategy
        cls = family_of(vision.model_type).class_tokens
        return None if cls is None else _patches(vision) + cls - 1
    if family == "paligemma":
        return _patches(vision)
    if family == "aya_vision":  # pixel shuffle of the square feature map
        return None if crop is None else int(math.isqrt(crop) // config.downsample_factor) ** 2
    if family == "cohere2_vision":
        return int(_sides(vision)[0] // config.downsample_factor) * int(_sides(vision)[1] // config.downsample_factor)
    if family == "internvl":
        height, width = _sides(vision)
        return int(height * config.downsample_ratio) * int(width * config.downsample_ratio)
    if family == "llama4":
        height, width = _sides(vision)
        return int(height * vision.pixel_shuffle_ratio) * int(width * vision.pixel_shuffle_ratio)
    if family == "aria":
        queries = {int(k): int(v) for k, v in config.projector_patch_to_query_dict.items()}
        return queries.get(_patches(vision))
    if family in ("got_ocr2", "pp_chart2table"):  # two stride-2 convolutions (padding 1) after the SAM encoder
        height, width = _sides(vision)
        return -(-height // 4) * -(-width // 4)
    return None


def _crop_tokens(config) -> int | None:
    """Tokens of one crop of a LLaVA-style tower: its patches, a class token where the tower has one, less the first
    token under the `"default"` feature strategy; None for a tower whose class tokens are not known
    (`Family.class_tokens`)."""
    vision = config.vision_config
    cls = family_of(vision.model_type).class_tokens
    if cls is None:
        return None
    default = getattr(config, "vision_feature_select_strategy", None) == "default"
    return _patches(vision) + cls - int(default)


def _sides(vision) -> tuple[int, int]:
    """Patches along the height and width of the tower's square (or `[h, w]`) input."""
    size, patch = vision.image_size, vision.patch_size
    size = size if isinstance(size, list | tuple) else (size, size)
    patch = patch if isinstance(patch, list | tuple) else (patch, patch)
    return size[0] // patch[0], size[1] // patch[1]


def _patches(vision) -> int:
    height, width = _sides(vision)
    return height * width


def _field(example: Mapping, name: str) -> np.ndarray:
    value = example.get(name)
    if value is None:
        raise ValueError(
            f"it carries images but no `{name}`, from which its family counts each image's placeholder tokens. Keep "
            f"the `{name}` the processor returns for the example."
        )
    return _array(value)


def _array(value: Any) -> np.ndarray:
    return value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
