"""Token blocks of one tiny image, per layout, and the `token_type_ids` of families that take them.

A block function `(config, ids, count, fields, size)` returns the token ids a family's processor lays out for one
image of `count` features (`ids`: the layout tokens by name); a token-type function `(is_image, answer_length)` returns
an example's `token_type_ids`. The recipes of `flatcollate.testing.vision_recipes` pick them per family.
"""

import torch


def image_id(config) -> int:
    """The config's image placeholder id, under either of its two names."""
    return config.image_token_id if getattr(config, "image_token_id", None) is not None else config.image_token_index


def plain_block(config, ids, count, fields, size):
    """`<image> x count`: the placeholder once per image feature, nothing around it."""
    return [image_id(config)] * count


def wrapped_block(start, end):
    """`<start> <image> x count <end>`, with `start`/`end` naming config attributes or layout tokens."""

    def block(config, ids, count, fields, size):
        first, last = (getattr(config, name) if hasattr(config, name) else ids[name] for name in (start, end))
        return [first, *[image_id(config)] * count, last]

    return block


def pixtral_rows(config, ids, count, fields, size):
    """Mistral 3: rows of [IMG] each closed by [IMG_BREAK], the last by [IMG_END]."""
    merge = config.vision_config.patch_size * config.spatial_merge_size
    height, width = (int(s) for s in fields["image_sizes"][0])
    rows, cols = height // merge, width // merge
    if rows * cols != count:
        raise ValueError(f"mistral3: {rows} x {cols} [IMG] rows for {count} image features")
    block = ([image_id(config)] * cols + [ids["img_break"]]) * rows
    return [*block[:-1], ids["img_end"]]


def fuyu_rows(config, ids, count, fields, size):
    """Fuyu: a row of image tokens per row of patches, each closed by a newline token."""
    rows, cols = size
    if rows * cols != count:
        raise ValueError(f"fuyu: {rows} x {cols} patches for {count} image features")
    return ([image_id(config)] * cols + [ids["image_newline"]]) * rows


def idefics_tiles(config, ids, count, fields, size):
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


def suffix_token_types(is_image: torch.Tensor, answer_length: int) -> torch.Tensor:
    """`token_type_ids: (L,) int64`, 1 on the answer (PaliGemma: images and prompt form a bidirectional prefix)."""
    types = torch.zeros_like(is_image)
    types[types.numel() - answer_length :] = 1
    return types
