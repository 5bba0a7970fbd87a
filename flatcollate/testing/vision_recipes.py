"""Per-family recipes of the tiny vision-language models: vision sizes, vision fields of one image, how an example's
images are joined, and the token block a family's processor lays out for one image.

A recipe is a `Family` entry of `FAMILIES`; layouts shared by several families (Qwen patches, LLaVA-NeXT tiles,
Pixtral rows, Idefics tiles) are dicts unpacked into each entry. The functions a recipe picks live in
`vision_pixels` (vision fields of one image, joining an example's images) and `vision_blocks` (token block of one
image, `token_type_ids`).
"""

from collections.abc import Callable
from dataclasses import dataclass, field

from .vision_blocks import (
    fuyu_rows,
    idefics_tiles,
    pixtral_rows,
    plain_block,
    suffix_token_types,
    wrapped_block,
)
from .vision_pixels import (
    anyres_pixels,
    cat_images,
    cat_padded,
    cat_tiles,
    docling_pixels,
    fuyu_pixels,
    merge_size_pixels,
    patch_image_pixels,
    qwen_pixels,
    siglip2_pixels,
    sized_pixels,
    square_pixels,
    tile_pixels,
)


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


_IDEFICS_LAYOUT = ("fake_token_around_image", "global_img", "newline", "row_1_col_1", "row_1_col_2")
_IDEFICS = {
    "pixels": tile_pixels,
    "merge": cat_tiles,
    "block": idefics_tiles,
    "sizes": ((1, 1), (1, 2)),
    "top": {"scale_factor": 2},
    "layout": _IDEFICS_LAYOUT,
}
_PATCHES = {"merge": cat_images, "sizes": ((4, 4), (4, 6), (8, 4), (2, 6))}  # patches; merged 2 x 2
# LLaVA takes the second-to-last vision layer's output; with one layer that is the embeddings, and the layer would
# never run. The last layer's output runs it.
_LAST_LAYER = {"vision_feature_layer": -1}
_QWEN = {"pixels": qwen_pixels, **_PATCHES}
_ANYRES = {
    "pixels": anyres_pixels,
    "merge": cat_padded,
    "block": plain_block,
    "sizes": ((32, 32), (32, 64), (64, 32), (48, 40)),
    "top": {"image_grid_pinpoints": [[32, 64], [64, 32], [64, 64]], "image_seq_length": 16, **_LAST_LAYER},
}
_NO_POOLING_HEAD = {"vision_use_head": False}  # SigLIP's pooled vector: these families take the patch features
_GEMMA3 = {
    "pixels": square_pixels,
    "merge": cat_images,
    "block": wrapped_block("boi_token_index", "eoi_token_index"),
    "top": {"mm_tokens_per_image": 4},
    "vision": _NO_POOLING_HEAD,
}
_PIXTRAL = {
    "pixels": sized_pixels,
    "merge": cat_padded,
    "block": pixtral_rows,
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
_SQUARE = {"pixels": square_pixels, "merge": cat_images}
_MROPE = {"mrope_section": [2, 3, 3]}  # sums to head_dim // 2 = 8
_QWEN2_5 = {**_QWEN, "text": {"rope_parameters": _MROPE}}
_QWEN2_5_VISION = {"patch_size": 4, "out_hidden_size": 64, "window_size": 16, "fullatt_block_indexes": [0]}
_QWEN3 = {
    **_QWEN,
    "block": wrapped_block("vision_start_token_id", "vision_end_token_id"),
    "vision": {"patch_size": 4, "out_hidden_size": 64, "num_position_embeddings": 16, "deepstack_visual_indexes": [0]},
    "text": {"rope_parameters": _MROPE},
}
_LINEAR_ATTENTION = {  # narrow heads of the gated delta-net layers (laid out by `tiny_hybrids`)
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
}
_QWEN3_5 = {**_QWEN3, "text": {**_QWEN3["text"], **_LINEAR_ATTENTION}}
_GLM4V = {
    **_QWEN,
    "block": wrapped_block("image_start_token_id", "image_end_token_id"),
    "vision": {"patch_size": 4, "image_size": 16, "out_hidden_size": 64},
}

FAMILIES: dict[str, Family] = {
    "qwen2_vl": Family(
        **_QWEN,
        block=wrapped_block("vision_start_token_id", "vision_end_token_id"),
        vision={"hidden_size": 64, "patch_size": 4},
        text={"rope_parameters": _MROPE},
    ),
    "qwen2_5_vl": Family(
        **_QWEN2_5, block=wrapped_block("vision_start_token_id", "vision_end_token_id"), vision=_QWEN2_5_VISION
    ),
    "qwen3_vl": Family(**_QWEN3),
    "qwen3_vl_moe": Family(**_QWEN3),
    "glm4v": Family(**_GLM4V, text={"rope_parameters": _MROPE}),
    "glm4v_moe": Family(**_GLM4V, text={"rope_parameters": {"mrope_section": [1, 1, 2]}}),  # rotary on half a head
    "llava_next": Family(**_ANYRES),
    "paligemma": Family(
        pixels=square_pixels,
        merge=cat_images,
        block=plain_block,
        images_first=True,
        token_types=suffix_token_types,
        vision={"projection_dim": 64},  # the projector's output is the text width
    ),
    "aya_vision": Family(
        **_SQUARE, block=wrapped_block("start_of_img", "end_of_img"), layout=("start_of_img", "end_of_img")
    ),
    "cohere2_vision": Family(
        **_SQUARE, block=wrapped_block("boi", "eoi"), layout=("boi", "eoi"), vision=_NO_POOLING_HEAD
    ),
    "internvl": Family(
        **_SQUARE,
        block=wrapped_block("img_start", "img_end"),
        layout=("img_start", "img_end"),
        vision={"image_size": [32, 32], "patch_size": [8, 8]},
        top={"image_seq_length": 4},
    ),
    "llava_onevision": Family(
        pixels=anyres_pixels,
        merge=cat_padded,
        block=plain_block,
        sizes=((32, 32), (32, 64), (64, 32), (40, 24)),
        top={"image_grid_pinpoints": [[32, 32], [32, 64], [64, 32]]},
    ),
    "vipllava": Family(**_SQUARE, block=plain_block, top={"vision_feature_layers": [-2, -1]}),
    "lfm2_vl": Family(
        pixels=siglip2_pixels,
        merge=cat_padded,
        block=wrapped_block("image_start", "image_end"),
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
    "video_llava": Family(**_SQUARE, block=plain_block, top=_LAST_LAYER),
    "hyperclovax_vision_v2": Family(**_QWEN2_5, block=plain_block, vision=_QWEN2_5_VISION),
    "exaone4_5": Family(**_QWEN2_5, block=plain_block, vision={**_QWEN2_5_VISION, "num_key_value_heads": 2}),
    "lfm3_vl": Family(  # its language model: convolutions around attention (`tiny_hybrids`)
        **{**_QWEN3, "vision": {**_QWEN3["vision"], "layer_types": ["full_attention"], "num_key_value_heads": 2}}
    ),
    "idefics2": Family(
        pixels=tile_pixels,
        merge=cat_tiles,
        block=wrapped_block("fake_token_around_image", "fake_token_around_image"),
        sizes=((1, 1),),  # one tile per image
        layout=("fake_token_around_image",),
        nested={"perceiver_config": _PERCEIVER},
    ),
    "aria": Family(
        **_SQUARE,
        block=plain_block,
        top={"projector_patch_to_query_dict": {16: 4}, "max_value_projector_patch_to_query_dict": 4},
    ),
    "minimax_m3_vl": Family(
        **_QWEN,
        block=plain_block,
        vision={"patch_size": 4, "image_size": 32},
        top={"merged_hidden_size": 256},  # 2 x 2 merged patches of 2 frames, vision width 32
        text={"shared_intermediate_size": 64, "dense_intermediate_size": 128},
    ),
    "granite_docling": Family(
        **{**_IDEFICS, "pixels": docling_pixels},
        vision={"out_hidden_size": 64, "scale_factor": 2, "deepstack_visual_indexes": [0]},
    ),
    "kimi_k25": Family(
        **_PATCHES,
        pixels=patch_image_pixels,
        block=wrapped_block("vision_start_token_id", "vision_end_token_id"),
        vision={"patch_size": 4, "pos_emb_height": 8, "pos_emb_width": 8},
        top={"projection_hidden_size": 32},
    ),
    "paddleocr_vl": Family(
        **_PATCHES,
        pixels=patch_image_pixels,
        block=wrapped_block("vision_start_token_id", "vision_end_token_id"),
        vision={"patch_size": 4},
        text={"rope_parameters": _MROPE},
    ),
    "video_llama_3": Family(**_PATCHES, pixels=merge_size_pixels, block=plain_block, vision={"patch_size": 4}),
    "muse_glimmer": Family(
        **_PATCHES,
        pixels=qwen_pixels,
        block=plain_block,
        vision={"patch_size": 4, "pos_emb_height": 8, "pos_emb_width": 8, "layer_types": ["full_attention"]},
        top={"out_hidden_size": 128},  # 2 x 2 merged patches of vision width 32
    ),
    "llama4": Family(
        **_SQUARE,
        block=wrapped_block("boi_token_index", "eoi_token_index"),
        vision={
            "intermediate_size": 128,
            "vision_output_dim": 64,
            "projector_input_dim": 64,
            "projector_output_dim": 64,
        },
    ),
    "got_ocr2": Family(**_SQUARE, block=plain_block, vision=_SAM),
    "pp_chart2table": Family(**_SQUARE, block=plain_block, vision=_SAM),
    "fuyu": Family(
        pixels=fuyu_pixels,
        merge=cat_tiles,
        block=fuyu_rows,
        sizes=((2, 2), (2, 3), (3, 1), (1, 4)),  # patches
        top={"patch_size": 4},
        layout=("image_newline",),
    ),
    "gemma3": Family(**_GEMMA3),
    "llava": Family(
        pixels=square_pixels, merge=cat_images, block=plain_block, top={"image_seq_length": 16, **_LAST_LAYER}
    ),
    "idefics3": Family(**_IDEFICS),
    "smolvlm": Family(**_IDEFICS),
    "llava_next_video": Family(**_ANYRES),
    "shieldgemma2": Family(**_GEMMA3),
    "mistral3": Family(**_PIXTRAL),
    "lighton_ocr": Family(**_PIXTRAL),
    "mistral_large4": Family(**_PIXTRAL),
}
