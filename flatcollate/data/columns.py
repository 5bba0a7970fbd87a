"""Which columns of a tokenized arrow table are per token, and the labels packing writes from masks.

Packing carries every column with one value per token of `input_ids` in every row, folds label masks into `labels`,
and leaves the rest out, by name, in the stats and a warning::

    input_ids        [5 6 7]   [8 9]      per token                 -> packed
    loss_weights     [1 1 .5]  [1 1]      per token                 -> packed the same way
    completion_mask  [0 1 1]   [0 1]      folded: labels -100 where 0, then removed
    attention_mask   [1 1 1]   [1 1]      all ones                  -> left out (zeros raise: padded rows)
    position_ids     [0 1 2]   [0 1]      counting from 0           -> replaced by the packed rows' own
    id               3         4          one value per row         -> left out
    scores           [.1 .2]   [.3 .4]    lists of another length   -> left out

Rows with no tokens are dropped and counted (`drop_empty_rows`), or raise with `empty="error"`. A column that is per
token in some rows but not in others raises. Checks run on `pc.list_value_length` and the
flattened values, never token by token; an error names the first bad row and the column.
"""

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .._conventions import IGNORE_INDEX, IMAGE_FIELDS, NP_IDS_DTYPE
from ..collate.features import MASK_KEYS


def is_list(kind: pa.DataType) -> bool:
    """Whether an arrow type holds one list per row."""
    return pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)


def row_lengths(column: pa.ChunkedArray) -> np.ndarray:
    """Values per row of a list column, `(num_rows,)` int64; a null row counts -1."""
    return pc.fill_null(pc.list_value_length(column), -1).to_numpy(zero_copy_only=False).astype(np.int64)


def one_array(column: pa.ChunkedArray) -> pa.Array:
    """The column as one array: its only chunk as it is (`combine_chunks` copies even a single chunk)."""
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def flat_values(column: pa.ChunkedArray) -> pa.Array:
    """The values of every row of a list column back to back (slices and chunks taken into account)."""
    return one_array(column).flatten()


def list_array(offsets: np.ndarray, values: pa.Array | np.ndarray) -> pa.Array:
    """Rows `values[offsets[i]:offsets[i + 1]]`; 64-bit offsets only where 32 bits cannot hold them."""
    if offsets[-1] > np.iinfo(np.int32).max:
        return pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), values)
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values)


EMPTY = ("drop", "error")


def drop_empty_rows(
    table: pa.Table, lengths: np.ndarray, *, empty: str = "drop", first_row: int = 0
) -> tuple[pa.Table, np.ndarray, np.ndarray]:
    """Remove rows whose `input_ids` hold no tokens, or raise on the first one with `empty="error"`.

    Args:
        table (`pa.Table`): rows with `input_ids`.
        lengths (`np.ndarray` of shape `(num_rows,)`, int64): tokens of every row.
        empty (`str`, *optional*, defaults to `"drop"`): `"drop"` or `"error"`.
        first_row (`int`, *optional*, defaults to 0): number of the table's first row in error messages.

    Returns:
        The table and lengths without the empty rows, and the positions of the dropped rows, `(num_empty,)` int64.

    >>> table, lengths, dropped = drop_empty_rows(pa.table({"input_ids": [[1], [], [2, 3]]}), np.array([1, 0, 2]))
    >>> table["input_ids"].to_pylist(), lengths.tolist(), dropped.tolist()
    ([[1], [2, 3]], [1, 2], [1])
    """
    if empty not in EMPTY:
        raise ValueError(f"empty={empty!r} is not one of {EMPTY}.")
    dropped = np.flatnonzero(lengths == 0)
    if not dropped.size:
        return table, lengths, dropped
    if empty == "error":
        raise ValueError(
            f"row {first_row + int(dropped[0])} has no tokens ({dropped.size} empty rows); pass empty='drop' to drop "
            "them, or remove them before packing."
        )
    keep = lengths != 0
    return table.filter(pa.array(keep)), lengths[keep], dropped


def check_aligned(table: pa.Table, name: str, lengths: np.ndarray) -> None:
    """Raise unless column `name` has one value per token of `input_ids` in every row."""
    kind = table.schema.field(name).type
    if not is_list(kind):
        raise ValueError(
            f"field {name!r} must hold one value per token (a list per row), got {kind} values; rename it if it is "
            "not per token (e.g. a class label), or tokenize it into a list."
        )
    other = row_lengths(table[name])
    bad = np.flatnonzero(other != lengths)
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"row {i}: field {name!r} has {other[i]} values but 'input_ids' has {lengths[i]} tokens; "
            f"token-aligned columns must match input_ids ({bad.size} rows differ)."
        )


def _first_row(lengths: np.ndarray, flat_index: int) -> int:
    """Row of the token at `flat_index` of the flattened column."""
    return int(np.searchsorted(np.cumsum(lengths), flat_index, side="right"))


def fold_masks(table: pa.Table, lengths: np.ndarray) -> tuple[pa.Table, tuple[str, ...]]:
    """Fold `completion_mask` / `assistant_masks` into `labels` (-100 where a mask is 0) and drop the masks.

    `labels` start from `input_ids` where the table has none. Training code that keeps only the model's forward
    arguments (`transformers.Trainer`'s `remove_unused_columns=True`) would drop mask columns and train on prompts.

    Args:
        table (`pa.Table`): rows with `input_ids` and optionally `labels` and the masks.
        lengths (`np.ndarray` of shape `(num_rows,)`, int64): tokens of every row.

    Returns:
        The table with `labels` (lists of int64) right after `input_ids` and no mask columns, and the masks folded.

    Raises:
        `ValueError`: a mask or `labels` not aligned with `input_ids`, or a mask value other than 0 and 1.
    """
    masks = tuple(name for name in MASK_KEYS if name in table.column_names)  # the masks the collator folds
    if not masks:
        return table, ()
    source = "labels" if "labels" in table.column_names else "input_ids"
    check_aligned(table, source, lengths)
    labels = flat_values(table[source]).to_numpy(zero_copy_only=False).astype(NP_IDS_DTYPE)
    for name in masks:
        check_aligned(table, name, lengths)
        mask = flat_values(table[name]).to_numpy(zero_copy_only=False)
        bad = np.flatnonzero((mask != 0) & (mask != 1))  # NaN (a null value) is bad too
        if bad.size:
            value = mask[bad[0]].item()
            raise ValueError(
                f"row {_first_row(lengths, int(bad[0]))}: column {name!r} must hold only 0 and 1, found {value}; "
                "1 marks the tokens to train on."
            )
        labels = np.where(mask == 0, IGNORE_INDEX, labels)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    column = list_array(offsets, pa.array(labels, pa.int64()))
    table = table.drop_columns([*masks, *(["labels"] if source == "labels" else [])])
    return table.add_column(table.column_names.index("input_ids") + 1, "labels", column), masks


def _check_attention_mask(table: pa.Table, lengths: np.ndarray) -> None:
    """An `attention_mask` must be all ones: packing takes unpadded rows."""
    check_aligned(table, "attention_mask", lengths)
    zeros = np.flatnonzero(flat_values(table["attention_mask"]).to_numpy(zero_copy_only=False) == 0)
    if zeros.size:
        raise ValueError(
            f"row {_first_row(lengths, int(zeros[0]))}: 'attention_mask' has zeros, so the row is padded; pack "
            "unpadded rows (tokenize with padding=False)."
        )


def _check_position_ids(table: pa.Table, lengths: np.ndarray) -> None:
    """Incoming `position_ids` must count 0, 1, 2, ... in every row; packing writes the packed rows' own."""
    check_aligned(table, "position_ids", lengths)
    positions = flat_values(table["position_ids"]).to_numpy(zero_copy_only=False)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    plain = np.arange(int(lengths.sum())) - np.repeat(starts, lengths)
    bad = np.flatnonzero(positions != plain)
    if bad.size:
        raise ValueError(
            f"row {_first_row(lengths, int(bad[0]))}: 'position_ids' do not count 0, 1, 2, ... (the row may hold "
            "several sequences already); packing writes its own, so remove the column or pack unpacked rows."
        )


def split_columns(table: pa.Table, lengths: np.ndarray) -> tuple[list[str], list[str]]:
    """Columns to pack token by token, and columns left out.

    Args:
        table (`pa.Table`): rows with `input_ids`, masks already folded (`fold_masks`).
        lengths (`np.ndarray` of shape `(num_rows,)`, int64): tokens of every row.

    Returns:
        `(carried, left_out)`: `input_ids`, `labels` (when present) and every other list column with one value per
        token in every row, in table order; and the columns with one value per row, lists of other lengths, or an
        all-ones `attention_mask`. Incoming `position_ids` are in neither: packing replaces them.

    Raises:
        `ValueError`: an image column (`pixel_values`, ...), `labels` not aligned with `input_ids`, a column per
            token in some rows but not in others (naming the first row that is not), a padded `attention_mask` or
            `position_ids` that do not count from 0.
    """
    images = [name for name in IMAGE_FIELDS if name in table.column_names]
    if images:
        raise ValueError(
            f"`{images[0]}` is an image column; packing keeps per-token columns only, so the image placeholders of "
            "`input_ids` would be trained without their images. Train image-text rows unpacked, collated by "
            "`flatcollate.vision.VisionDataCollatorWithFlattening.from_model(model)`."
        )
    carried, left_out = ["input_ids"], []
    if "labels" in table.column_names:
        check_aligned(table, "labels", lengths)
        carried.append("labels")
    if "attention_mask" in table.column_names:
        _check_attention_mask(table, lengths)
        left_out.append("attention_mask")
    if "position_ids" in table.column_names:
        _check_position_ids(table, lengths)
    for name in table.column_names:
        if name in ("input_ids", "labels", "attention_mask", "position_ids"):
            continue
        if not is_list(table.schema.field(name).type):
            left_out.append(name)
            continue
        per_token = row_lengths(table[name]) == lengths
        if per_token.all():
            carried.append(name)
        elif per_token.any():
            i = int(np.flatnonzero(~per_token)[0])
            raise ValueError(
                f"column {name!r} has one value per token in {int(per_token.sum())} rows but not in row {i} "
                f"({row_lengths(table[name])[i]} values, 'input_ids' has {lengths[i]} tokens); give it one value per "
                f"token in every row, or remove it (`dataset.remove_columns({name!r})`)."
            )
        else:
            left_out.append(name)
    return carried, left_out


def describe_left_out(names: tuple[str, ...] | list[str]) -> str:
    """One line per reason a column was left out of the packed rows (empty when none was).

    >>> print(describe_left_out(["id", "attention_mask"]))
    columns left out (not per token: one value per row, or lists of another length): id
    attention_mask left out: all ones; packed rows mark their sequences with position_ids and seq_lengths
    """
    lines = []
    other = [name for name in names if name != "attention_mask"]
    if other:
        lines.append(
            f"columns left out (not per token: one value per row, or lists of another length): {', '.join(other)}"
        )
    if "attention_mask" in names:
        lines.append(
            "attention_mask left out: all ones; packed rows mark their sequences with position_ids and seq_lengths"
        )
    return "\n".join(lines)
