"""Per-family recipes of the tiny vision-language models: vision sizes, vision fields of one image, how an example's
images are joined, and the token block a family's processor lays out for one image.

A recipe is a `Family` entry of `FAMILIES`; layouts shared by several families (Qwen patches, LLaVA-NeXT tiles,
Pixtral rows, Idefics tiles) are dicts unpacked into each entry.
"""

from collections.abc import Callable
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class Family:
    """How one family is shrunk and how its processor lays out an image.

    `pixels(model, size, generator)` returns the vision fields of one image of a size drawn from `sizes` (pixels,
    patches or tiles, as the recipe reads it), `merge(parts)` joins the fields of an example's images, and
    `block(config, ids, count, fields, size)` returns the token ids standing for one image of `count` features
    (`ids`: the layout tokens by name). `vision`, `text`, `top` and `nested` override config attributes after shrinking.
    """

    pixels: Callable
    merge: Callable
    block: Callable
    sizes: tuple = ((32, 32),)
    vision: dict = field(default_factory=dict)
    top: dict = field(default_factory=dict)
    nested: dict = field(default_factory=dict)  # other sub-configs by attribute name -> overrides
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
    frames = getattr(vision, "temporal_patch_size", None) or getattr(vision, "patch_temporal", 1)
    width = channels * frames * vision.patch_size**2
    return {"pixel_values": torch.randn(h * w, width, generator=generator), "image_grid_thw": torch.tensor([[1, h, w]])}


def _patch_image_pixels(model, size, generator):
    """`pixel_values: (h * w, C, P, P)`: Qwen's patches kept as small images (Kimi-K2.5, PaddleOCR-VL)."""
    fields = _qwen_pixels(model, size, generator)
    patch = model.config.vision_config.patch_size
    return {**fields, "pixel_values": fields["pixel_values"].view(-1, 3, patch, patch)}


def _merge_size_pixels(model, size, generator):
    """Qwen's patches and `image_merge_sizes: (1,) int64` (VideoLLaMA 3 merges images 2 x 2)."""
    return {**_qwen_pixels(model, size, generator), "image_merge_sizes": torch.tensor([2])}


def _siglip2_pixels(model, size, generator):
    """`pixel_values: (1, h * w, C * P * P)`, `pixel_attention_mask: (1, h * w) int64`, `spatial_shapes: (1, 2)`."""
    patch = model.config.vision_config.patch_size
    h, w = size  # in patches
    return {
        "pixel_values": torch.randn(1, h * w, 3 * patch * patch, generator=generator),
        "pixel_attention_mask": torch.ones(1, h * w, dtype=torch.int64),
        "spatial_shapes": torch.tensor([[h, w]]),
    }


def _docling_pixels(model, size, generator):
    """Idefics3's tiles with one mask flag per tile: `pixel_attention_mask: (1, tiles) bool` (Granite Docling)."""
    fields = _tile_pixels(model, size, generator)
    return {**fields, "pixel_attention_mask": fields["pixel_attention_mask"].flatten(2).all(-1)}


def _fuyu_pixels(model, size, generator):
    """`pixel_values: (1, h * w, P * P * C)`: Fuyu's patches of one image row by row, no vision tower."""
    config = model.config
    width = config.patch_size**2 * config.num_channels
    return {"pixel_values": torch.randn(1, size[0] * size[1], width, generator=generator)}


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


def image_id(config) -> int:
    """The config's image placeholder id, under either of its two names."""
    return config.image_token_id if getattr(config, "image_token_id", None) is not None else config.image_token_index


def _plain(config, ids, count, fields, size):
    return [image_id(config)] * count


def _wrapped(start, end):
    """`<start> <image> x count <end>`, with `start`/`end` naming config attributes or layout tokens."""

    def block(config, ids, count, fields, size):
        first, last = (getattr(config, name) if hasattr(config, name) else ids[name] for name in (start, end))
        return [first, *[image_id(config)] * count, last]

    return block


def _pixtral_rows(config, ids, count, fields, size):
    """Mistral 3: rows of [IMG] each closed by [IMG_BREAK], the last by [IMG_END]."""
    merge = config.vision_config.patch_size * config.spatial_merge_size
    height, width = (int(s) for s in fields["image_sizes"][0])
    rows, cols = height // merge, width // merge
    if rows * cols != count:
        raise ValueError(f"mistral3: {rows} x {cols} [IMG] rows for {count} image features")
    block = ([image_id(config)] * cols + [ids["img_break"]]) * rows
    return [*block[:-1], ids["img_end"]]


def _fuyu_rows(config, ids, count, fields, size):
    """Fuyu: a row of image tokens per row of patches, each closed by a newline token."""
    rows, cols = size
    if rows * cols != count:
        raise ValueError(f"fuyu: {rows} x {cols} patches for {count} image features")
    return ([image_id(config)] * cols + [ids["image_newline"]]) * rows


def _idefics_tiles(config, ids, count, fields, size):
    """Idefics3 / SmolVLM: `<fake><row_r_col_c><image> x n` per tile, then `<fake><global-img><image> x n<fake>`."""
    tiles = fields["pixel_values"].shape[1]
    per_tile = count // tiles
    image, fake = [image_id(config)] * per_tile, ids["fake_token_around_image"]
    if tiles == 1:
        return [fake, ids["global_img"], *image, fake]
    rows, cols = (2, tiles // 2) if tiles > 3 else (1, tiles - 1)
    out = []
    for r in range(rows):  # one block per tile: at most a few
        for c in range(cols):
            out += [fake, ids[f"row_{r + 1}_col_{c + 1}"], *image]
        out.append(ids["newline"])
    return [*out, ids["newline"], fake, ids["global_img"], *image, fake]


def image_token_types(is_image: torch.Tensor, answer_length: int) -> torch.Tensor:
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
_PATCHES = {"merge": _cat, "sizes": ((4, 4), (4, 6), (8, 4), (2, 6))}  # patches; merged 2 x 2
# LLaVA takes the second-to-last vision layer's output; with one layer that is the embeddings, and the layer would
# never run. The last layer's output runs it.
_LAST_LAYER = {"vision_feature_layer": -1}
_QWEN = {"pixels": _qwen_pixels, **_PATCHES}
_ANYRES = {
    "pixels": _anyres_pixels,
    "merge": _cat_padded,
    "block": _plain,
    "sizes": ((32, 32), (32, 64), (64, 32), (48, 40)),
    "top": {"image_grid_pinpoints": [[32, 64], [64, 32], [64, 64]], "image_seq_length": 16, **_LAST_LAYER},
}
_NO_POOLING_HEAD = {"vision_use_head": False}  # SigLIP's pooled vector: these families take the patch features
_GEMMA3 = {
    "pixels": _square_pixels,
    "merge": _cat,
    "block": _wrapped("boi_token_index", "eoi_token_index"),
    "top": {"mm_tokens_per_image": 4},
    "vision": _NO_POOLING_HEAD,
}
_PIXTRAL = {
    "pixels": _sized_pixels,
    "merge": _cat_padded,
    "block": _pixtral_rows,
    "sizes": ((16, 16), (16, 24), (8, 32), (24, 16)),
    "vision": {"patch_size": 4, "image_size": 32},
    "layout": ("img_break", "img_end"),
}
_PERCEIVER = {  # Idefics2's resampler: 4 latents per image
    "hidden_size": 64,
    "resampler_n_latents": 4,
    "resampler_depth": 1,
    "resampler_n_heads": 2,
    "resampler_head_dim": 16,
    "num_key_value_heads": 1,
}
_SAM = {
    "output_channels": 32,
    "mlp_dim": 64,
    "window_size": 2,
    "image_size": 64,
}  # GOT-OCR2: SAM encoder, neck; 4 tokens
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

FAMILIES: dict[str, Family] = {
    "qwen2_vl": Family(
        **_QWEN,
        block=_wrapped("vision_start_token_id", "vision_end_token_id"),
        vision={"hidden_size": 64, "patch_size": 4},
        text={"rope_parameters": _MROPE},
    ),
    "qwen2_5_vl": Family(
        **_QWEN2_5, block=_wrapped("vision_start_token_id", "vision_end_token_id"), vision=_QWEN2_5_VISION
    ),
    "qwen3_vl": Family(**_QWEN3),
    "qwen3_vl_moe": Family(**_QWEN3),
    "glm4v": Family(**_GLM4V, text={"rope_parameters": _MROPE}),
    "glm4v_moe": Family(**_GLM4V, text={"rope_parameters": {"mrope_section": [1, 1, 2]}}),  # rotary on half a head
    "llava_next": Family(**_ANYRES),
    "paligemma": Family(
        pixels=_square_pixels,
        merge=_cat,
        block=_plain,
        images_first=True,
        token_types=_suffix_token_types,
        vision={"projection_dim": 64},  # the projector's output is the text width
    ),
    "aya_vision": Family(
        **_SQUARE, block=_wrapped("start_of_img", "end_of_img"), layout=("start_of_img", "end_of_img")
    ),
    "cohere2_vision": Family(**_SQUARE, block=_wrapped("boi", "eoi"), layout=("boi", "eoi"), vision=_NO_POOLING_HEAD),
    "internvl": Family(
        **_SQUARE,
        block=_wrapped("img_start", "img_end"),
        layout=("img_start", "img_end"),
        vision={"image_size": [32, 32], "patch_size": [8, 8]},
        top={"image_seq_length": 4},
    ),
    "llava_onevision": Family(
        pixels=_anyres_pixels,
        merge=_cat_padded,
        block=_plain,
        sizes=((32, 32), (32, 64), (64, 32), (40, 24)),
        top={"image_grid_pinpoints": [[32, 32], [32, 64], [64, 32]]},
    ),
    "vipllava": Family(**_SQUARE, block=_plain, top={"vision_feature_layers": [-2, -1]}),
    "lfm2_vl": Family(
        pixels=_siglip2_pixels,
        merge=_cat_padded,
        block=_wrapped("image_start", "image_end"),
        layout=("image_start", "image_end"),
        sizes=((4, 4), (4, 6), (6, 2)),
        vision={"num_patches": 16, **_NO_POOLING_HEAD},
    ),
    "cosmos3_omni": Family(**_QWEN3),
    "cosmos3_edge": Family(**_QWEN3),
    "qwen3_5": Family(**_QWEN3_5),
    "qwen3_5_moe": Family(**_QWEN3_5),
    "glm46v": Family(**_GLM4V, text={"rope_parameters": _MROPE}),
    "glmga": Family(**_GLM4V, text={"rope_parameters": _MROPE}),
    "glm_ocr": Family(**_GLM4V, text={"rope_parameters": _MROPE}),
    "video_llava": Family(**_SQUARE, block=_plain, top=_LAST_LAYER),
    "hyperclovax_vision_v2": Family(**_QWEN2_5, block=_plain, vision=_QWEN2_5_VISION),
    "exaone4_5": Family(**_QWEN2_5, block=_plain, vision={**_QWEN2_5_VISION, "num_key_value_heads": 2}),
    "lfm3_vl": Family(
        **{
            **_QWEN3,
            "text": {**_QWEN3["text"], "layer_types": ["conv", "full_attention"]},
            "vision": {**_QWEN3["vision"], "layer_types": ["full_attention"], "num_key_value_heads": 2},
        }
    ),
    "idefics2": Family(
        pixels=_tile_pixels,
        merge=_cat_tiles,
        block=_wrapped("fake_token_around_image", "fake_token_around_image"),
        sizes=((1, 1),),  # one tile per image
        layout=("fake_token_around_image",),
        nested={"perceiver_config": _PERCEIVER},
    ),
    "aria": Family(
        **_SQUARE,
        block=_plain,
        top={"projector_patch_to_query_dict": {16: 4}, "max_value_projector_patch_to_query_dict": 4},
    ),
    "minimax_m3_vl": Family(
        **_QWEN,
        block=_plain,
        vision={"patch_size": 4, "image_size": 32},
        top={"merged_hidden_size": 256},  # 2 x 2 merged patches of 2 frames, vision width 32
        text={"shared_intermediate_size": 64, "dense_intermediate_size": 128},
    ),
    "granite_docling": Family(
        **{**_IDEFICS, "pixels": _docling_pixels},
        vision={"out_hidden_size": 64, "scale_factor": 2, "deepstack_visual_indexes": [0]},
    ),
    "kimi_k25": Family(
        **_PATCHES,
        pixels=_patch_image_pixels,
        block=_wrapped("vision_start_token_id", "vision_end_token_id"),
        vision={"patch_size": 4, "pos_emb_height": 8, "pos_emb_width": 8},
        top={"projection_hidden_size": 32},
    ),
    "paddleocr_vl": Family(
        **_PATCHES,
        pixels=_patch_image_pixels,
        block=_wrapped("vision_start_token_id", "vision_end_token_id"),
        vision={"patch_size": 4},
        text={"rope_parameters": _MROPE},
    ),
    "video_llama_3": Family(**_PATCHES, pixels=_merge_size_pixels, block=_plain, vision={"patch_size": 4}),
    "muse_glimmer": Family(
        **_PATCHES,
        pixels=_qwen_pixels,
        block=_plain,
        vision={"patch_size": 4, "pos_emb_height": 8, "pos_emb_width": 8, "layer_types": ["full_attention"]},
        top={"out_hidden_size": 128},  # 2 x 2 merged patches of vision width 32
    ),
    "llama4": Family(
        **_SQUARE,
        block=_wrapped("boi_token_index", "eoi_token_index"),
        vision={
            "intermediate_size": 128,
            "vision_output_dim": 64,
            "projector_input_dim": 64,
            "projector_output_dim": 64,
        },
    ),
    "got_ocr2": Family(**_SQUARE, block=_plain, vision=_SAM),
    "pp_chart2table": Family(**_SQUARE, block=_plain, vision=_SAM),
    "fuyu": Family(
        pixels=_fuyu_pixels,
        merge=_cat_tiles,
        block=_fuyu_rows,
        sizes=((2, 2), (2, 3), (3, 1), (1, 4)),  # patches
        top={"patch_size": 4},
        layout=("image_newline",),
    ),
    "gemma3": Family(**_GEMMA3),
    "llava": Family(pixels=_square_pixels, merge=_cat, block=_plain, top={"image_seq_length": 16, **_LAST_LAYER}),
    "idefics3": Family(**_IDEFICS),
    "smolvlm": Family(**_IDEFICS),
    "llava_next_video": Family(**_ANYRES),
    "shieldgemma2": Family(**_GEMMA3),
    "mistral3": Family(**_PIXTRAL),
    "lighton_ocr": Family(**_PIXTRAL),
    "mistral_large4": Family(**_PIXTRAL),
}
