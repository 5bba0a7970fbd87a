"""Tiny random-weight vision-language models and per-example inputs laid out as each family's processor lays them out.

`tiny_vision_lm("qwen2_vl")` builds an `AutoModelForImageTextToText` with a 2-layer text model (`tiny_config`) and a
1-layer vision tower small enough that an image becomes a handful of tokens. `tiny_vision_examples(model)` returns
examples the model accepts alone; the number of placeholder tokens per image is read from the model's own
`get_image_features`, so the examples are right by construction. Token ids:

    0 .. 2         bos / eos / pad of most text configs (never drawn as text)
    3 .. 479       text tokens
    480 .. 499     every special token id of the config (image, video, vision start/end, boi/eoi, ...)
    500 .. 510     layout tokens a processor adds that the config does not hold ([IMG_BREAK], <global-img>, ...)
    511            pad (where the original pad id fell outside the vocabulary)
"""

import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from transformers import AutoConfig, AutoModelForImageTextToText, PretrainedConfig, PreTrainedModel

from flatcollate.models import tiny_config

VOCAB_SIZE = 512
TEXT_IDS = (3, 480)  # [low, high) range of random text tokens
SPECIAL_BASE = 480
LAYOUT_BASE = 500

# Vision tower sizes, set where the vision config defines them; a family's table entry overrides any of them.
TINY_VISION_SIZES = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "depth": 1,
    "num_attention_heads": 2,
    "num_heads": 2,
    "embed_dim": 32,
    "head_dim": 16,
    "projection_dim": 32,
    "image_size": 32,
    "patch_size": 8,
}

# Projector widths kept at the composite config's top level.
TINY_PROJECTOR_SIZES = {"alignment_intermediate_size": 64, "projector_hidden_size": 64}

_SPECIAL_NAME = re.compile(r"(token_id|token_index)$")
_NOT_MULTIMODAL = ("pad_token_id", "bos_token_id", "eos_token_id", "sep_token_id", "unk_token_id")

# Families that could not be built tiny or given a valid example: model_type -> measured reason.
TINY_BUILD_NOTES: dict[str, str] = {}


@dataclass(frozen=True)
class _Family:
    """How one family is shrunk and how its processor lays out an image.

    `pixels(model, size, generator)` returns the vision fields of one image, `merge` joins the fields of an
    example's images, `block(ids, count, fields)` returns the token ids standing for one image of `count` features.
    """

    pixels: Callable
    merge: Callable
    block: Callable
    sizes: tuple = ((32, 32),)
    vision: dict = field(default_factory=dict)
    top: dict = field(default_factory=dict)
    text: dict = field(default_factory=dict)
    layout: tuple = ()  # names of layout tokens the processor adds (ids from LAYOUT_BASE on)
    images_first: bool = False
    token_types: Callable | None = None  # `token_type_ids` of an example, where the model takes them


# ---- vision fields of one image -------------------------------------------------------------------------------


def _square_pixels(model, size, generator):
    """`pixel_values: (1, C, H, W) float32` at the vision tower's fixed image size."""
    side = model.config.vision_config.image_size
    height, width = side if isinstance(side, (list, tuple)) else (side, side)
    return {"pixel_values": torch.randn(1, 3, height, width, generator=generator)}


def _sized_pixels(model, size, generator):
    """`pixel_values: (1, C, H, W) float32` of the drawn size, `image_sizes: (1, 2) int64` (Pixtral, LLaVA-NeXT)."""
    return {"pixel_values": torch.randn(1, 3, *size, generator=generator), "image_sizes": torch.tensor([size])}


def _anyres_pixels(model, size, generator):
    """`pixel_values: (1, 1 + tiles, C, s, s)`, `image_sizes: (1, 2) int64`: LLaVA-NeXT's base image and tiles."""
    from transformers.models.llava_next.modeling_llava_next import image_size_to_num_patches

    side = model.config.vision_config.image_size
    patches = image_size_to_num_patches(size, model.config.image_grid_pinpoints, side)
    return {
        "pixel_values": torch.randn(1, patches, 3, side, side, generator=generator),
        "image_sizes": torch.tensor([size]),
    }


def _qwen_pixels(model, size, generator):
    """`pixel_values: (h * w, C * T * P * P)` flattened patches, `image_grid_thw: (1, 3) int64` = (1, h, w)."""
    vision = model.config.vision_config
    h, w = size  # in patches
    channels = getattr(vision, "in_channels", None) or getattr(vision, "num_channels", 3)
    width = channels * getattr(vision, "temporal_patch_size", 1) * vision.patch_size**2
    return {"pixel_values": torch.randn(h * w, width, generator=generator), "image_grid_thw": torch.tensor([[1, h, w]])}


def _siglip2_pixels(model, size, generator):
    """`pixel_values: (1, h * w, C * P * P)`, `pixel_attention_mask: (1, h * w) int64`, `spatial_shapes: (1, 2)`."""
    patch = model.config.vision_config.patch_size
    h, w = size  # in patches
    return {
        "pixel_values": torch.randn(1, h * w, 3 * patch * patch, generator=generator),
        "pixel_attention_mask": torch.ones(1, h * w, dtype=torch.int64),
        "spatial_shapes": torch.tensor([[h, w]]),
    }


def _tile_pixels(model, size, generator):
    """`pixel_values: (1, tiles, C, s, s)`, `pixel_attention_mask: (1, tiles, s, s) bool`; `size` = (rows, cols)."""
    side = model.config.vision_config.image_size
    tiles = size[0] * size[1] + (1 if size != (1, 1) else 0)  # a split image also carries its global view
    return {
        "pixel_values": torch.randn(1, tiles, 3, side, side, generator=generator),
        "pixel_attention_mask": torch.ones(1, tiles, side, side, dtype=torch.bool),
    }


# ---- joining the images of one example --------------------------------------------------------------------------


def _cat(parts):
    """Images stacked along dim 0 (one row per image, or per patch for Qwen)."""
    return {key: torch.cat([p[key] for p in parts]) for key in parts[0]}


def _cat_tiles(parts):
    """Idefics3 / SmolVLM: all tiles of the example's images along dim 1 of a batch of one."""
    return {key: torch.cat([p[key] for p in parts], dim=1) for key in parts[0]}


def _cat_padded(parts):
    """Images zero-padded to the largest in every trailing dim, as the processors pad them (Pixtral, LLaVA-NeXT)."""
    return {key: _pad_cat([p[key] for p in parts]) for key in parts[0]}


def _pad_cat(tensors):
    """`(1, *dims)` tensors -> `(n, *max dims)`, zero (False) where a tensor is smaller."""
    shape = [max(sizes) for sizes in zip(*(t.shape[1:] for t in tensors), strict=True)]
    out = tensors[0].new_zeros(len(tensors), *shape)
    for i, t in enumerate(tensors):  # one copy per image
        out[(i, *(slice(0, s) for s in t.shape[1:]))] = t[0]
    return out


# ---- token block of one image -------------------------------------------------------------------------------------


def _image_id(config):
    return config.image_token_id if getattr(config, "image_token_id", None) is not None else config.image_token_index


def _plain(config, ids, count, fields):
    return [_image_id(config)] * count


def _wrapped(start, end):
    """`<start> <image> x count <end>`, with `start`/`end` naming config attributes or layout tokens."""

    def block(config, ids, count, fields):
        first, last = (getattr(config, name) if hasattr(config, name) else ids[name] for name in (start, end))
        return [first, *[_image_id(config)] * count, last]

    return block


def _pixtral_rows(config, ids, count, fields):
    """Mistral 3: rows of [IMG] each closed by [IMG_BREAK], the last by [IMG_END]."""
    merge = config.vision_config.patch_size * config.spatial_merge_size
    height, width = (int(s) for s in fields["image_sizes"][0])
    rows, cols = height // merge, width // merge
    if rows * cols != count:
        raise ValueError(f"mistral3: {rows} x {cols} [IMG] rows for {count} image features")
    block = ([_image_id(config)] * cols + [ids["img_break"]]) * rows
    return [*block[:-1], ids["img_end"]]


def _idefics_tiles(config, ids, count, fields):
    """Idefics3 / SmolVLM: `<fake><row_r_col_c><image> x n` per tile, then `<fake><global-img><image> x n<fake>`."""
    tiles = fields["pixel_values"].shape[1]
    per_tile = count // tiles
    image, fake = [_image_id(config)] * per_tile, ids["fake_token_around_image"]
    if tiles == 1:
        return [fake, ids["global_img"], *image, fake]
    rows, cols = (2, tiles // 2) if tiles > 3 else (1, tiles - 1)
    out = []
    for r in range(rows):  # one block per tile: at most a few
        for c in range(cols):
            out += [fake, ids[f"row_{r + 1}_col_{c + 1}"], *image]
        out.append(ids["newline"])
    return [*out, ids["newline"], fake, ids["global_img"], *image, fake]


def _image_token_types(is_image: torch.Tensor, answer_length: int) -> torch.Tensor:
    """`token_type_ids: (L,) int64`, 1 on image tokens (Gemma 3: images attend bidirectionally)."""
    return is_image


def _suffix_token_types(is_image: torch.Tensor, answer_length: int) -> torch.Tensor:
    """`token_type_ids: (L,) int64`, 1 on the answer (PaliGemma: images and prompt form a bidirectional prefix)."""
    types = torch.zeros_like(is_image)
    types[types.numel() - answer_length :] = 1
    return types


_IDEFICS_LAYOUT = ("fake_token_around_image", "global_img", "newline", "row_1_col_1", "row_1_col_2")
_IDEFICS = {
    "pixels": _tile_pixels,
    "merge": _cat_tiles,
    "block": _idefics_tiles,
    "sizes": ((1, 1), (1, 2)),
    "top": {"scale_factor": 2},
    "layout": _IDEFICS_LAYOUT,
}
_QWEN = {"pixels": _qwen_pixels, "merge": _cat, "sizes": ((4, 4), (4, 6), (8, 4), (2, 6))}  # patches; 2x2 merge
_ANYRES = {
    "pixels": _anyres_pixels,
    "merge": _cat_padded,
    "block": _plain,
    "sizes": ((32, 32), (32, 64), (64, 32), (48, 40)),
    "top": {"image_grid_pinpoints": [[32, 64], [64, 32], [64, 64]], "image_seq_length": 16},
}
_GEMMA3 = {
    "pixels": _square_pixels,
    "merge": _cat,
    "block": _wrapped("boi_token_index", "eoi_token_index"),
    "top": {"mm_tokens_per_image": 4},
}
_PIXTRAL = {
    "pixels": _sized_pixels,
    "merge": _cat_padded,
    "block": _pixtral_rows,
    "sizes": ((16, 16), (16, 24), (8, 32), (24, 16)),
    "vision": {"patch_size": 4, "image_size": 32},
    "layout": ("img_break", "img_end"),
}
_SQUARE = {"pixels": _square_pixels, "merge": _cat}
_MROPE = {"mrope_section": [2, 3, 3]}  # sums to head_dim // 2 = 8
_QWEN2_5 = {**_QWEN, "text": {"rope_parameters": _MROPE}}
_QWEN2_5_VISION = {"patch_size": 4, "out_hidden_size": 64, "window_size": 16, "fullatt_block_indexes": [0]}
_QWEN3 = {
    **_QWEN,
    "block": _wrapped("vision_start_token_id", "vision_end_token_id"),
    "vision": {"patch_size": 4, "out_hidden_size": 64, "num_position_embeddings": 16, "deepstack_visual_indexes": [0]},
    "text": {"rope_parameters": _MROPE},
}
_LINEAR_ATTENTION = {  # gated delta-net layers: one linear, one full attention layer, narrow heads
    "layer_types": ["linear_attention", "full_attention"],
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
}
_QWEN3_5 = {**_QWEN3, "text": {**_QWEN3["text"], **_LINEAR_ATTENTION}}
_GLM4V = {
    **_QWEN,
    "block": _wrapped("image_start_token_id", "image_end_token_id"),
    "vision": {"patch_size": 4, "image_size": 16, "out_hidden_size": 64},
}

FAMILIES: dict[str, _Family] = {
    "qwen2_vl": _Family(
        **_QWEN,
        block=_wrapped("vision_start_token_id", "vision_end_token_id"),
        vision={"hidden_size": 64, "patch_size": 4},
        text={"rope_parameters": _MROPE},
    ),
    "qwen2_5_vl": _Family(
        **_QWEN2_5, block=_wrapped("vision_start_token_id", "vision_end_token_id"), vision=_QWEN2_5_VISION
    ),
    "qwen3_vl": _Family(**_QWEN3),
    "qwen3_vl_moe": _Family(**_QWEN3),
    "glm4v": _Family(**_GLM4V, text={"rope_parameters": _MROPE}),
    "glm4v_moe": _Family(**_GLM4V, text={"rope_parameters": {"mrope_section": [1, 1, 2]}}),  # rotary on half a head
    "llava_next": _Family(**_ANYRES),
    "paligemma": _Family(
        pixels=_square_pixels, merge=_cat, block=_plain, images_first=True, token_types=_suffix_token_types
    ),
    "aya_vision": _Family(
        **_SQUARE, block=_wrapped("start_of_img", "end_of_img"), layout=("start_of_img", "end_of_img")
    ),
    "cohere2_vision": _Family(**_SQUARE, block=_wrapped("boi", "eoi"), layout=("boi", "eoi")),
    "internvl": _Family(
        **_SQUARE,
        block=_wrapped("img_start", "img_end"),
        layout=("img_start", "img_end"),
        vision={"image_size": [32, 32], "patch_size": [8, 8]},
        top={"image_seq_length": 4},
    ),
    "llava_onevision": _Family(
        pixels=_anyres_pixels,
        merge=_cat_padded,
        block=_plain,
        sizes=((32, 32), (32, 64), (64, 32), (48, 40)),
        top={"image_grid_pinpoints": [[32, 32], [32, 64], [64, 32], [64, 64]]},
    ),
    "vipllava": _Family(**_SQUARE, block=_plain, top={"vision_feature_layers": [-2, -1]}),
    "lfm2_vl": _Family(
        pixels=_siglip2_pixels,
        merge=_cat_padded,
        block=_wrapped("image_start", "image_end"),
        layout=("image_start", "image_end"),
        sizes=((4, 4), (4, 6), (6, 2)),
        vision={"num_patches": 16},
    ),
    "cosmos3_omni": _Family(**_QWEN3),
    "cosmos3_edge": _Family(**_QWEN3),
    "qwen3_5": _Family(**_QWEN3_5),
    "qwen3_5_moe": _Family(**_QWEN3_5),
    "glm46v": _Family(**_GLM4V, text={"rope_parameters": _MROPE}),
    "glmga": _Family(**_GLM4V, text={"rope_parameters": _MROPE}),
    "glm_ocr": _Family(**_GLM4V, text={"rope_parameters": _MROPE}),
    "video_llava": _Family(**_SQUARE, block=_plain),
    "hyperclovax_vision_v2": _Family(**_QWEN2_5, block=_plain, vision=_QWEN2_5_VISION),
    "exaone4_5": _Family(**_QWEN2_5, block=_plain, vision={**_QWEN2_5_VISION, "num_key_value_heads": 2}),
    "lfm3_vl": _Family(
        **{
            **_QWEN3,
            "text": {**_QWEN3["text"], "layer_types": ["conv", "full_attention"]},
            "vision": {**_QWEN3["vision"], "layer_types": ["full_attention"], "num_key_value_heads": 2},
        }
    ),
    "gemma3": _Family(**_GEMMA3),
    "llava": _Family(pixels=_square_pixels, merge=_cat, block=_plain, top={"image_seq_length": 16}),
    "idefics3": _Family(**_IDEFICS),
    "smolvlm": _Family(**_IDEFICS),
    "llava_next_video": _Family(**_ANYRES),
    "shieldgemma2": _Family(**_GEMMA3),
    "mistral3": _Family(**_PIXTRAL),
    "lighton_ocr": _Family(**_PIXTRAL),
    "mistral_large4": _Family(**_PIXTRAL),
}


def tiny_vision_lm(model_type: str, *, seed: int = 0, attn_implementation: str = "sdpa") -> PreTrainedModel:
    """An image-text-to-text model of `model_type` with random weights: 2 text layers of width 64, 1 vision layer.

    Every multimodal special token id of the config is moved into the 512-token vocabulary (480 and up).

    Args:
        model_type: a key of `FAMILIES`, e.g. `"qwen2_vl"`.
        seed: seed of the weights.
        attn_implementation: backend of the model (`"sdpa"`, `"eager"`, `"flatcollate"`, ...).

    Returns:
        `PreTrainedModel` in fp32, in the mode `from_config` leaves it.

    >>> m = tiny_vision_lm("llava")
    >>> m.config.text_config.hidden_size, m.config.text_config.vocab_size, m.config.image_token_id
    (64, 512, 480)
    """
    if model_type not in FAMILIES:
        known = ", ".join(sorted(FAMILIES))
        raise ValueError(f"model_type={model_type!r} has no tiny vision recipe; known: {known}.")
    config = tiny_vision_config(model_type)
    torch.manual_seed(seed)
    return AutoModelForImageTextToText.from_config(config, attn_implementation=attn_implementation, dtype=torch.float32)


def tiny_vision_config(model_type: str) -> PretrainedConfig:
    """The shrunk composite config `tiny_vision_lm` builds from (text via `tiny_config`, vision via the table)."""
    family = FAMILIES[model_type]
    config = AutoConfig.for_model(model_type)
    text = tiny_config(config.text_config, vocab_size=VOCAB_SIZE)
    for name, value in family.text.items():
        setattr(text, name, {**getattr(text, name), **value} if isinstance(value, dict) else value)
    config.text_config = text
    vision = config.vision_config
    for name, value in {**TINY_VISION_SIZES, **family.vision}.items():
        if name in family.vision or getattr(vision, name, None) is not None:
            setattr(vision, name, value)
    for name, value in {**TINY_PROJECTOR_SIZES, **family.top}.items():
        if name in family.top or getattr(config, name, None) is not None:
            setattr(config, name, value)
    for offset, name in enumerate(special_token_names(config)):
        setattr(config, name, SPECIAL_BASE + offset)
    if getattr(config, "pad_token_id", None) is not None and config.pad_token_id >= VOCAB_SIZE:
        config.pad_token_id = VOCAB_SIZE - 1
    return config


def special_token_names(config: PretrainedConfig) -> list[str]:
    """Names of the config's multimodal special token ids (`image_token_id`, `boi_token_index`, ...), sorted."""
    return sorted(
        name
        for name, value in vars(config).items()
        if _SPECIAL_NAME.search(name) and name.lstrip("_") not in _NOT_MULTIMODAL and isinstance(value, int)
    )


def layout_token_ids(model_type: str) -> dict[str, int]:
    """Ids of the layout tokens a family's processor adds beside the config's own (`[IMG_BREAK]`, `<global-img>`)."""
    return {name: LAYOUT_BASE + offset for offset, name in enumerate(FAMILIES[model_type].layout)}


def image_feature_count(model: PreTrainedModel, fields: dict[str, torch.Tensor]) -> int:
    """Number of feature rows the model makes of one image's vision fields, i.e. the image tokens it consumes."""
    hidden = model.config.text_config.hidden_size
    with torch.no_grad():
        out = model.get_image_features(**fields)
    features = getattr(out, "pooler_output", out)
    total = sum(f.numel() for f in features) if isinstance(features, (list, tuple)) else features.numel()
    if total % hidden:
        raise ValueError(f"{model.config.model_type}: image features of {total} values are not rows of {hidden}")
    return total // hidden


def tiny_vision_examples(
    model: PreTrainedModel, *, count: int = 3, seed: int = 0, images: tuple[int, ...] = (1, 2, 0)
) -> list[dict[str, torch.Tensor]]:
    """Examples that `model` (from `tiny_vision_lm`) accepts alone, each as its processor returns a batch of one.

    Example `i` holds `images[i % len(images)]` images of sizes drawn from the family's table, between a short
    prompt and an answer (after both for families whose images lead, e.g. PaliGemma):

        prompt (2-5 text tokens) | image blocks, as the processor lays them out | answer (4-11 text tokens)

    Args:
        model: a model from `tiny_vision_lm`.
        count: number of examples.
        seed: seed of the tokens, image sizes and pixels.
        images: images per example, cycled; 0 gives a text-only example.

    Returns:
        `list[dict]`: per-token fields `input_ids`, `labels` (image blocks at -100) and, where the model takes them,
        `mm_token_type_ids` / `token_type_ids`, each `(L,) int64`; vision fields (`pixel_values`, `image_grid_thw`,
        `image_sizes`, `pixel_attention_mask`) exactly as the model takes them for a batch of one.

    >>> m = tiny_vision_lm("llava")
    >>> [(e["input_ids"].shape == e["labels"].shape, "pixel_values" in e) for e in tiny_vision_examples(m)]
    [(True, True), (True, True), (True, False)]
    """
    config = model.config
    family = FAMILIES[config.model_type]
    ids = layout_token_ids(config.model_type)
    generator = torch.Generator().manual_seed(seed)
    takes = inspect.signature(model.forward).parameters
    examples = []
    for index in range(count):  # one example at a time: each draws its own sizes and pixels
        parts, block = [], []
        for _ in range(images[index % len(images)]):
            size = family.sizes[int(torch.randint(len(family.sizes), (1,), generator=generator))]
            fields = family.pixels(model, size, generator)
            block += family.block(config, ids, image_feature_count(model, fields), fields)
            parts.append(fields)
        prompt = torch.randint(*TEXT_IDS, (int(torch.randint(2, 6, (1,), generator=generator)),), generator=generator)
        answer = torch.randint(*TEXT_IDS, (int(torch.randint(4, 12, (1,), generator=generator)),), generator=generator)
        block = torch.tensor(block, dtype=torch.int64)
        pieces = (block, prompt, answer) if family.images_first else (prompt, block, answer)
        input_ids = torch.cat(pieces)
        in_block = torch.cat([torch.full_like(p, p is block, dtype=torch.bool) for p in pieces])
        example = {"input_ids": input_ids, "labels": input_ids.masked_fill(in_block, -100)}
        is_image = (input_ids == _image_id(config)).long()
        if "mm_token_type_ids" in takes:
            example["mm_token_type_ids"] = is_image
        if "token_type_ids" in takes:
            example["token_type_ids"] = (family.token_types or _image_token_types)(is_image, answer.numel())
        if parts:
            example.update(family.merge(parts))
        examples.append(example)
    return examples
