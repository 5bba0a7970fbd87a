"""Vision fields of one tiny image, per layout, and how the images of one example are joined.

A pixel function `(model, size, generator)` returns the vision fields a family's processor gives for one image of
`size` (pixels, patches or tiles, as the function reads it); a merge function joins the fields of an example's images.
The recipes of `flatcollate.testing.vision_recipes` pick one of each per family.
"""

import torch

# ---- vision fields of one image -------------------------------------------------------------------------------


def square_pixels(model, size, generator):
    """`pixel_values: (1, C, H, W) float32` at the vision tower's fixed image size."""
    side = model.config.vision_config.image_size
    height, width = side if isinstance(side, (list, tuple)) else (side, side)
    return {"pixel_values": torch.randn(1, 3, height, width, generator=generator)}


def sized_pixels(model, size, generator):
    """`pixel_values: (1, C, H, W) float32` of the drawn size, `image_sizes: (1, 2) int64` (Pixtral, LLaVA-NeXT)."""
    return {"pixel_values": torch.randn(1, 3, *size, generator=generator), "image_sizes": torch.tensor([size])}


def anyres_pixels(model, size, generator):
    """`pixel_values: (1, 1 + tiles, C, s, s)`, `image_sizes: (1, 2) int64`: LLaVA-NeXT's base image and tiles."""
    from transformers.models.llava_next.modeling_llava_next import image_size_to_num_patches

    side = model.config.vision_config.image_size
    patches = image_size_to_num_patches(size, model.config.image_grid_pinpoints, side)
    return {
        "pixel_values": torch.randn(1, patches, 3, side, side, generator=generator),
        "image_sizes": torch.tensor([size]),
    }


def qwen_pixels(model, size, generator):
    """`pixel_values: (h * w, C * T * P * P)` flattened patches, `image_grid_thw: (1, 3) int64` = (1, h, w)."""
    vision = model.config.vision_config
    h, w = size  # in patches
    channels = getattr(vision, "in_channels", None) or getattr(vision, "num_channels", 3)
    frames = getattr(vision, "temporal_patch_size", None) or getattr(vision, "patch_temporal", 1)
    width = channels * frames * vision.patch_size**2
    return {"pixel_values": torch.randn(h * w, width, generator=generator), "image_grid_thw": torch.tensor([[1, h, w]])}


def patch_image_pixels(model, size, generator):
    """`pixel_values: (h * w, C, P, P)`: Qwen's patches kept as small images (Kimi-K2.5, PaddleOCR-VL)."""
    fields = qwen_pixels(model, size, generator)
    patch = model.config.vision_config.patch_size
    return {**fields, "pixel_values": fields["pixel_values"].view(-1, 3, patch, patch)}


def merge_size_pixels(model, size, generator):
    """Qwen's patches and `image_merge_sizes: (1,) int64` (VideoLLaMA 3 merges images 2 x 2)."""
    return {**qwen_pixels(model, size, generator), "image_merge_sizes": torch.tensor([2])}


def siglip2_pixels(model, size, generator):
    """`pixel_values: (1, h * w, C * P * P)`, `pixel_attention_mask: (1, h * w) int64`, `spatial_shapes: (1, 2)`."""
    patch = model.config.vision_config.patch_size
    h, w = size  # in patches
    return {
        "pixel_values": torch.randn(1, h * w, 3 * patch * patch, generator=generator),
        "pixel_attention_mask": torch.ones(1, h * w, dtype=torch.int64),
        "spatial_shapes": torch.tensor([[h, w]]),
    }


def docling_pixels(model, size, generator):
    """Idefics3's tiles with one mask flag per tile: `pixel_attention_mask: (1, tiles) bool` (Granite Docling)."""
    fields = tile_pixels(model, size, generator)
    return {**fields, "pixel_attention_mask": fields["pixel_attention_mask"].flatten(2).all(-1)}


def fuyu_pixels(model, size, generator):
    """`pixel_values: (1, h * w, P * P * C)`: Fuyu's patches of one image row by row, no vision tower."""
    config = model.config
    width = config.patch_size**2 * config.num_channels
    return {"pixel_values": torch.randn(1, size[0] * size[1], width, generator=generator)}


def tile_pixels(model, size, generator):
    """`pixel_values: (1, tiles, C, s, s)`, `pixel_attention_mask: (1, tiles, s, s) bool`; `size` = (rows, cols)."""
    side = model.config.vision_config.image_size
    tiles = size[0] * size[1] + (1 if size != (1, 1) else 0)  # a split image also carries its global view
    return {
        "pixel_values": torch.randn(1, tiles, 3, side, side, generator=generator),
        "pixel_attention_mask": torch.ones(1, tiles, side, side, dtype=torch.bool),
    }


# ---- joining the images of one example --------------------------------------------------------------------------


def cat_images(parts):
    """Images stacked along dim 0 (one row per image, or per patch for Qwen)."""
    return {key: torch.cat([p[key] for p in parts]) for key in parts[0]}


def cat_tiles(parts):
    """Idefics3 / SmolVLM: all tiles of the example's images along dim 1 of a batch of one."""
    return {key: torch.cat([p[key] for p in parts], dim=1) for key in parts[0]}


def cat_padded(parts):
    """Images zero-padded to the largest in every trailing dim, as the processors pad them (Pixtral, LLaVA-NeXT)."""
    return {key: _pad_cat([p[key] for p in parts]) for key in parts[0]}


def _pad_cat(tensors):
    """`(1, *dims)` tensors -> `(n, *max dims)`, zero (False) where a tensor is smaller."""
    shape = [max(sizes) for sizes in zip(*(t.shape[1:] for t in tensors), strict=True)]
    out = tensors[0].new_zeros(len(tensors), *shape)
    for i, t in enumerate(tensors):  # one copy per image
        out[(i, *(slice(0, s) for s in t.shape[1:]))] = t[0]
    return out
