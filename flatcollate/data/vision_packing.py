"""The vision fields of image-text rows in packs: each example's fields kept whole, one entry per packed example.

A processor-encoded example (`make_supervised_dataset(processor, ...)`) holds its image placeholders already expanded
in `input_ids` and its images in vision fields (`pixel_values`, `image_grid_thw`, ...). Packing keeps an example whole
(its placeholders and its images stay together) and gives every vision field of a pack one entry per example, in the
pack's example order, `None` for an example without images::

    examples     0: [t <i i i i> t]   pixel_values (16, D)   image_grid_thw [[1 4 4]]
                 1: [t t t]           none
                 2: [<i i> t]         pixel_values (8, D)    image_grid_thw [[1 2 4]]
    pack         input_ids      [t <i i i i> t | t t t | <i i> t]      seq_lengths [6, 3, 3]
                 pixel_values   [(16, D), None, (8, D)]                one entry per example
                 image_grid_thw [[[1 4 4]], None, [[1 2 4]]]

The examples' image counts are those of their entries: `VisionDataCollatorWithFlattening` splits a pack back into its
examples and checks each one's placeholders against its own images (`flatcollate.vision.packs`). Nothing here knows a
family: the entries are the processor's arrays as they were, whatever their shape (tiles on dimension 1, padded
crops, grids).
"""

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .._conventions import IMAGE_FIELDS
from .columns import list_array, one_array


def vision_columns(table: pa.Table) -> list[str]:
    """The vision fields (`IMAGE_FIELDS`) among the table's columns, in the table's order.

    >>> vision_columns(pa.table({"input_ids": [[1]], "image_grid_thw": [[[1, 2, 2]]], "pixel_values": [[[0.0]]]}))
    ['image_grid_thw', 'pixel_values']
    """
    return [name for name in table.column_names if name in IMAGE_FIELDS]


def rows_with_images(table: pa.Table, names: list[str]) -> np.ndarray:
    """`(num_rows,)` bool: rows where any of the vision columns `names` holds a value (not null)."""
    has = np.zeros(table.num_rows, dtype=bool)
    for name in names:
        has |= pc.is_valid(table[name]).to_numpy(zero_copy_only=False)
    return has


def check_overlong_images(
    table: pa.Table, names: list[str], lengths: np.ndarray, pack_len: int, *, overlong: str, first_row: int = 0
) -> None:
    """Raise for an over-long row with images when `overlong` would cut it (`"truncate"`, `"split"`).

    Cutting an image-text example would separate its placeholders from its images (a piece with placeholders and
    no images, or the reverse), so an example with images is never cut; over-long rows without images are cut as
    text rows are. With `overlong="error"` every over-long row already raises (`packing.check_lengths`).

    Args:
        table (`pa.Table`): the rows, empty ones dropped.
        names (`list[str]`): its vision columns (`vision_columns`).
        lengths (`np.ndarray` of shape `(num_rows,)`, int64): tokens of every row, image placeholders included.
        pack_len (`int`), overlong (`str`): as for `pack_dataset`.
        first_row (`int`, *optional*, defaults to 0): number of the table's first row in the message.

    Raises:
        `ValueError`: naming the first such row, its length, the vision field it carries and the fixes.
    """
    if overlong == "error" or not names:
        return
    found = long_image_rows(table, names, lengths, pack_len)
    if found is not None:
        i, field, bad = found
        raise ValueError(
            f"row {first_row + i} is {lengths[i]} tokens > pack_len {pack_len} (image placeholders included) and "
            f"carries images (`{field}`); overlong={overlong!r} would cut it and separate its image placeholders from "
            f"its images ({bad.size} such rows). Raise pack_len to at least {int(lengths[bad].max())}, or filter "
            "these rows out before packing; an example with images is never cut."
        )


def long_image_rows(table: pa.Table, names: list[str], lengths: np.ndarray, limit: int):
    """`(first row, its vision field, every such row)` of the rows with images longer than `limit` tokens (`lengths`
    `(num_rows,)` int64, placeholders included), or None: such a row is never cut."""
    if not names:
        return None
    bad = np.flatnonzero((lengths > limit) & rows_with_images(table, names))
    if not bad.size:
        return None
    i = int(bad[0])
    return i, next(name for name in names if table[name][i].is_valid), bad


PER_IMAGE_ROWS = ("image_grid_thw", "video_grid_thw", "image_sizes", "spatial_shapes")
"""Vision fields with one row per image (or video) of an example, whatever the family: what `images_per_row` counts."""


def images_per_row(table: pa.Table, names: list[str]) -> np.ndarray:
    """`(num_rows,)` int64 images (and videos) of every row: the rows of its per-image fields (`PER_IMAGE_ROWS`).

    Raises:
        `ValueError`: the rows have vision fields but none with one row per image (`pixel_values` alone lays out
            images, tiles or patches by family), naming them.

    >>> table = pa.table({"image_grid_thw": [[[1, 4, 4], [1, 2, 2]], None, [[1, 2, 4]]]})
    >>> images_per_row(table, ["image_grid_thw"]).tolist()
    [2, 0, 1]
    """
    grids = [name for name in PER_IMAGE_ROWS[:2] if name in names]  # images and videos of grid families
    counted = grids or [name for name in PER_IMAGE_ROWS[2:] if name in names][:1]
    if not counted:
        raise ValueError(
            "max_images_per_pack counts each row's images by a field with one row per image "
            f"({', '.join(PER_IMAGE_ROWS)}); these rows have {', '.join(names) or 'no vision fields'}, whose first "
            "dimension is images, tiles or patches depending on the family. Leave max_images_per_pack out, or keep "
            "such a field in the rows."
        )
    counts = np.zeros(table.num_rows, dtype=np.int64)
    for name in counted:
        counts += pc.fill_null(pc.list_value_length(one_array(table[name])), 0).to_numpy().astype(np.int64)
    return counts


PATCH_GRIDS = ("image_grid_thw", "video_grid_thw")
"""Vision fields that state each image's (or video's) patches, `t * h * w` per row: what `patches_per_row` counts.
Their families' `pixel_values` hold one row per patch; other fields (`image_sizes`, `spatial_shapes` with padded
`pixel_values`) do not state what the tower encodes."""


def patches_per_row(table: pa.Table, names: list[str]) -> np.ndarray:
    """`(num_rows,)` int64 vision patches of every row: `t * h * w` summed over the rows of its grids (`PATCH_GRIDS`).

    Raises:
        `ValueError`: the rows have no grid (their fields do not state patch counts), or a grid row is not
            `(t, h, w)`, naming the field.

    >>> table = pa.table({"image_grid_thw": [[[1, 4, 4], [1, 2, 2]], None, [[2, 2, 4]]]})
    >>> patches_per_row(table, ["image_grid_thw"]).tolist()
    [20, 0, 16]
    """
    grids = [name for name in PATCH_GRIDS if name in names]
    if not grids:
        raise ValueError(
            "max_patches_per_pack counts each row's vision patches as t*h*w of its grids "
            f"({', '.join(PATCH_GRIDS)}); these rows have {', '.join(names) or 'no vision fields'}, which do not "
            "state patch counts (pixel_values' first dimension is images, tiles or patches depending on the family). "
            "Leave max_patches_per_pack out (max_images_per_pack counts images), or keep the grid in the rows."
        )
    counts = np.zeros(table.num_rows, dtype=np.int64)
    for name in grids:
        grid = one_array(table[name])
        images = pc.fill_null(pc.list_value_length(grid), 0).to_numpy().astype(np.int64)
        rows = grid.flatten()  # one (t, h, w) list per image, null rows skipped
        if len(rows) and not (pc.list_value_length(rows).to_numpy(zero_copy_only=False) == 3).all():
            raise ValueError(f"max_patches_per_pack reads `{name}` as one (t, h, w) row per image; some row is not.")
        thw = rows.flatten().to_numpy(zero_copy_only=False).astype(np.int64).reshape(-1, 3)
        counts += np.bincount(np.repeat(np.arange(table.num_rows), images), thw.prod(axis=1), table.num_rows).astype(
            np.int64
        )
    return counts


VISION_CAPS = {
    "max_images_per_pack": (images_per_row, "images"),
    "max_patches_per_pack": (patches_per_row, "vision patches"),
}
"""Each cap on a pack's vision content: how it counts every row, and the unit its messages name."""


def cap_vision(
    pack_of: np.ndarray, table: pa.Table, names: list[str], rows: np.ndarray, caps: dict, *, first_row: int = 0
) -> np.ndarray:
    """`pack_of` with every cap of `caps` (`VISION_CAPS` option -> int or None) held: each counted on the vision
    columns `names` of `table` for the example of every piece (`rows`: `(E,)` int64 row of each piece, -1 for a
    piece that is not a whole row, which holds no images), then split by `cap_packs`; splitting for one cap keeps
    the others held."""
    for option, cap in caps.items():
        if cap is not None:
            count, unit = VISION_CAPS[option]
            counts = np.where(rows >= 0, count(table, names)[rows], 0)
            pack_of = cap_packs(pack_of, counts, cap, option=option, unit=unit, first_row=first_row)
    return pack_of


def cap_packs(
    pack_of: np.ndarray, counts: np.ndarray, cap: int, *, option: str, unit: str, first_row: int = 0
) -> np.ndarray:
    """Pack ids with every pack's examples holding at most `cap` images (or patches, ...): a pack over the cap is
    split into new packs (first-fit decreasing on its examples' counts; its tokens already fit, and so do a subset's).

    Args:
        pack_of (`np.ndarray` of shape `(E,)`, int64): the pack of every example (`packing.pack_ids`).
        counts (`np.ndarray` of shape `(E,)`, int64): images (`images_per_row`), patches, ... of every example.
        cap (`int`): most of them in one pack.
        option (`str`), unit (`str`): the option and what it counts, for messages.
        first_row (`int`, *optional*, defaults to 0): number of the first example in messages.

    Returns:
        `np.ndarray` of shape `(E,)`, int64: pack ids, those of packs within the cap unchanged, new ones after them.

    Raises:
        `ValueError`: an example with more than `cap`, naming it, its count and the fix.

    >>> cap_packs(np.array([0, 0, 0, 1]), np.array([2, 1, 2, 1]), 3, option="max_images_per_pack", unit="images")
    array([0, 0, 2, 1])
    """
    over = np.flatnonzero(counts > cap)
    if over.size:
        i = int(over[0])
        raise ValueError(
            f"row {first_row + i} carries {counts[i]} {unit} > {option} {cap}; an example is never cut. Raise {option} "
            f"to at least {int(counts[over].max())}, or filter such rows out ({over.size} of them)."
        )
    pack_of = np.array(pack_of, dtype=np.int64)
    totals = np.bincount(pack_of, weights=counts, minlength=int(pack_of.max(initial=-1)) + 1)
    next_pack = len(totals)
    for pack in np.flatnonzero(totals > cap):  # one pass per pack over the cap; the bin packing needs a loop
        members = np.flatnonzero(pack_of == pack)
        room: list[int] = []  # left in each sub-pack; the first keeps the pack's id
        for member in members[np.argsort(-counts[members], kind="stable")]:
            slot = next((k for k, left in enumerate(room) if left >= counts[member]), len(room))
            if slot == len(room):
                room.append(cap)
            room[slot] -= int(counts[member])
            pack_of[member] = pack if slot == 0 else next_pack + slot - 1
        next_pack += len(room) - 1
    return pack_of


def gather_examples(column: pa.ChunkedArray, order: np.ndarray, offsets: np.ndarray) -> pa.Array:
    """Packs of whole per-example values: pack `p` holds `column[order[offsets[p]:offsets[p + 1]]]`.

    Args:
        column (`pa.ChunkedArray`): one value (an example's array as nested lists, or null) per row.
        order (`np.ndarray` of shape `(E,)`, int64): the row of every packed example, pack by pack.
        offsets (`np.ndarray` of shape `(num_packs + 1,)`, int64): where each pack's examples start in `order`.

    Returns:
        `pa.Array`: one list per pack of its examples' values, nulls kept.

    >>> column = pa.chunked_array([[[[1, 2]], None, [[3, 4], [5, 6]]]])
    >>> gather_examples(column, np.array([2, 0, 1]), np.array([0, 2, 3])).to_pylist()
    [[[[3, 4], [5, 6]], [[1, 2]]], [None]]
    """
    return list_array(np.asarray(offsets, dtype=np.int64), one_array(column).take(pa.array(order)))


def check_image_rows_fit(dataset, lengths: np.ndarray, max_tokens) -> None:
    """Raise for a row with images longer than `max_tokens` (`TokenBudgetBatchSampler.from_dataset`): such a row is
    never cut (its image placeholders would part from its images), so the sampler's advice to truncate does not
    apply. `dataset`: a `datasets.Dataset`; `lengths`: `(num_rows,)` int64 tokens of its rows, placeholders included."""
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or not (lengths > max_tokens).any():
        return  # the constructor checks `max_tokens` and names text rows
    table = dataset.with_format("arrow")[:]
    found = long_image_rows(table, vision_columns(table), lengths, max_tokens)
    if found is not None:
        i, field, bad = found
        raise ValueError(
            f"example {i} has {lengths[i]} tokens > max_tokens {max_tokens} (image placeholders included) and carries "
            f"images (`{field}`; {bad.size} such rows); an example with images is never cut, which would separate its "
            f"placeholders from its images. Raise max_tokens to at least {int(lengths[bad].max())}, or filter these "
            "rows out."
        )
