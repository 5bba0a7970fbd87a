"""How many placeholder tokens each image of an example fills, per family: the model's own rule, applied to the
example's vision fields with the numbers of the family's config.

The model checks only a batch's total: images handed to the wrong example (two examples given each other's images)
balance in the total of a flattened batch and run in the other sequence. The collator therefore counts each example
from its own images. A rule is a pure function `(example) -> (images,) int64` bound to the family's numbers with
`functools.partial` (a partial pickles, so a collator crosses into `DataLoader` workers)::

    rule: family                    one image fills                                   read from
    grid: Qwen2/2.5/3-VL, GLM-4V    t * h * w / merge**2                              image_grid_thw
    grid_merges: VideoLLaMA 3       t * h * w / merge_i**2                            image_grid_thw, image_merge_sizes
    anyres: LLaVA-NeXT, OneVision   base + rows * (cols + 1) of the unpadded grid     image_sizes (batch_num_images)
    sized: Pixtral (Mistral 3)      (H // (patch * merge)) * (W // (patch * merge))   image_sizes
    spatial: LFM2-VL                (h // factor) * (w // factor)                     spatial_shapes
    (latent_)tiles: Idefics2/3      tokens per tile * real tiles                      pixel_values (all-zero: padding)
    masked_tiles: Granite Docling   tokens per tile * real tiles                      pixel_attention_mask
    per_patch: Fuyu                 one per patch                                     pixel_values
    crop, fixed, ...: LLaVA, Gemma  a fixed count from the config                     pixel_values (images)

Which rule a family follows, and the config attributes it reads, is the family's record (`Family.image_tokens`,
`flatcollate.families`); the builders here (`RULES`) know rules, not families. Families without a rule
(`image_token_rule` returns None) are checked for the presence of placeholders only.
"""

import functools
import math
import operator
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from transformers.models.llava_next.modeling_llava_next import get_anyres_image_grid_shape, unpad_image

from ..families import family_of

Rule = Callable[[Mapping[str, Any]], np.ndarray]


def image_token_rule(config) -> Rule | None:
    """The rule giving each image's placeholder count for `config`'s family, or None where it is not known.

    >>> from transformers import Qwen2VLConfig
    >>> rule = image_token_rule(Qwen2VLConfig())
    >>> rule({"pixel_values": np.zeros((40, 8)), "image_grid_thw": [[1, 4, 4], [1, 4, 6]]}).tolist()
    [4, 6]
    """
    rule = family_of(config.model_type).image_tokens
    return None if rule is None else RULES[rule[0]](config, *rule[1:])


def stated_count(config) -> int | None:
    """Placeholders of every image where the family's config states them (rule `"fixed"`), else None.

    >>> from transformers import Gemma3Config, LlavaConfig
    >>> stated_count(Gemma3Config()), stated_count(LlavaConfig())
    (256, None)
    """
    name, *reads = family_of(config.model_type).image_tokens or ("",)
    return _read(config, reads[0]) if name == "fixed" else None


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


# ---- the numbers of a config ------------------------------------------------------------------------------------


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


def _read(config, path: str) -> Any:
    """A config attribute by dotted path from the composite config (`"vision_config.patch_size"`)."""
    return operator.attrgetter(path)(config)


# ---- builders: `(config, *reads) -> Rule | None`, one per rule name of `Family.image_tokens` -------------------------


def _grid(config, merge: str) -> Rule:
    """`grid_tokens` with the vision tower's spatial merge: a side, or a kernel `(h, w)` (Kimi-K2.5)."""
    merge = _read(config, merge)
    return functools.partial(grid_tokens, area=int(np.prod(merge)) if isinstance(merge, list | tuple) else merge**2)


def _tiles(config, scale: str, tiles: Callable = real_tile_tokens) -> Rule:
    """A tile rule (`real_tile_tokens`, `masked_tile_tokens`), each tile's patches pixel-shuffled by `scale`."""
    return functools.partial(tiles, tokens=int(_patches(config.vision_config) / _read(config, scale) ** 2))


def _anyres(config, aspect: str | None = None) -> Rule | None:
    """`anyres_tokens` with LLaVA-NeXT's crop and pinpoints; OneVision's `max_crops` from the top-level `aspect`
    attribute (`"anyres_max_9"`). None where the crop's tokens are not known."""
    crop = _crop_tokens(config)
    if crop is None:
        return None
    vision, aspect = config.vision_config, getattr(config, aspect, None) if aspect else None
    return functools.partial(
        anyres_tokens,
        crop_tokens=crop,
        side=vision.image_size,
        feature_side=vision.image_size // vision.patch_size,
        pinpoints=[list(p) for p in config.image_grid_pinpoints],
        max_crops=int(aspect.removeprefix("anyres_max_")) if aspect else None,
    )


def _tower(config, *otherwise: str) -> Rule | None:
    """The rule of the vision tower's record where it has one (LLaVA on Pixtral), else the rule `otherwise`."""
    tower = family_of(getattr(getattr(config, "vision_config", None), "model_type", None) or "").image_tokens
    rule = tower or otherwise
    return RULES[rule[0]](config, *rule[1:])


def _each(count: Callable[..., int | None], config, *reads: str) -> Rule | None:
    """`fixed_tokens` with `count(config, *reads)` for every image; None where the count is not known."""
    tokens = count(config, *reads)
    return None if tokens is None else functools.partial(fixed_tokens, tokens=tokens)


def _default_crop(config) -> int | None:
    """One crop less its first token whatever the feature strategy (VipLLaVA)."""
    vision = config.vision_config
    cls = family_of(vision.model_type).class_tokens
    return None if cls is None else _patches(vision) + cls - 1


def _shuffled_crop(config, factor: str) -> int | None:
    """One crop's square feature map after a pixel shuffle by `factor` (Aya Vision)."""
    crop = _crop_tokens(config)
    return None if crop is None else int(math.isqrt(crop) // _read(config, factor)) ** 2


def _divided_sides(config, factor: str) -> int:
    (height, width), factor = _sides(config.vision_config), _read(config, factor)
    return int(height // factor) * int(width // factor)


def _scaled_sides(config, ratio: str) -> int:
    (height, width), ratio = _sides(config.vision_config), _read(config, ratio)
    return int(height * ratio) * int(width * ratio)


def _queries(config, table: str) -> int | None:
    """The projector's query count for the tower's patches (Aria), None where the table has none."""
    queries = {int(k): int(v) for k, v in _read(config, table).items()}
    return queries.get(_patches(config.vision_config))


def _sam_neck(config) -> int:
    """Two stride-2 convolutions (padding 1) after the SAM encoder (GOT-OCR2)."""
    height, width = _sides(config.vision_config)
    return -(-height // 4) * -(-width // 4)


RULES: dict[str, Callable[..., Rule | None]] = {
    # counts read from the example's vision fields
    "grid": _grid,
    "grid_merges": lambda config, field: functools.partial(grid_tokens, merge_field=field),  # merge per image
    "anyres": _anyres,
    "sized": lambda config, *strides: functools.partial(
        sized_tokens, stride=math.prod(_read(config, s) for s in strides)
    ),
    "spatial": lambda config, factor: functools.partial(spatial_tokens, factor=_read(config, factor)),
    "tiles": _tiles,
    "masked_tiles": lambda config, scale: _tiles(config, scale, masked_tile_tokens),
    "latent_tiles": lambda config, latents: functools.partial(real_tile_tokens, tokens=_read(config, latents)),
    "per_patch": lambda config: patch_tokens,
    "tower": _tower,
    # the same count for every image, from the config
    "fixed": lambda config, tokens: functools.partial(fixed_tokens, tokens=_read(config, tokens)),
    "crop": functools.partial(_each, _crop_tokens),
    "default_crop": functools.partial(_each, _default_crop),
    "patches": functools.partial(_each, lambda config: _patches(config.vision_config)),
    "shuffled_crop": functools.partial(_each, _shuffled_crop),
    "divided_sides": functools.partial(_each, _divided_sides),
    "scaled_sides": functools.partial(_each, _scaled_sides),
    "queries": functools.partial(_each, _queries),
    "sam_neck": functools.partial(_each, _sam_neck),
}
"""Rule name (`Family.image_tokens[0]`) -> builder `(config, *reads) -> Rule | None` of the rule with the config's
numbers; `reads` are the rest of the family's `image_tokens`."""


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
