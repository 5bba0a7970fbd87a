"""`pack_table`: pack an arrow table of token rows into rows of at most `pack_len` tokens, on pyarrow offsets.

The packed layout (restarting `position_ids`, `seq_lengths`, masks folded into `labels`) is drawn in
`flatcollate.data.dataset`, whose `pack_dataset` runs this on a whole dataset or on each chunk of a stream.

Tokens are never copied in Python: the packed order of every token is computed with `np.repeat` over sequence
offsets and gathered with one `pyarrow` `take` per column, then wrapped with `ListArray.from_arrays`.
"""

import logging

import numpy as np
import pyarrow as pa

from ..boundaries import cu_seqlens_to_position_ids
from ..profiles.load import padded_batches
from .columns import (
    describe_left_out,
    drop_empty_rows,
    flat_values,
    fold_masks,
    list_array,
    one_array,
    row_lengths,
    split_columns,
)
from .packing import PackingStats, check_lengths, pack_ids, split_lengths
from .vision_packing import cap_vision, check_overlong_images, gather_examples, vision_columns

logger = logging.getLogger("flatcollate.data.dataset")  # the logger of pack_dataset, whose warnings these are


def _gather(column: pa.ChunkedArray, token_index: np.ndarray, offsets: np.ndarray) -> pa.Array:
    """Rows of `offsets` over the tokens of `column` taken in `token_index` order."""
    return list_array(offsets, flat_values(column).take(pa.array(token_index)))


def _gather_rows(column: pa.ChunkedArray, order: np.ndarray, offsets: np.ndarray) -> pa.Array:
    """Rows of `offsets` over the whole rows of `column` taken in `order`.

    Arrow's list `take` copies the tokens without an index per token (1.9 GB of int64 for 243M tokens otherwise).
    """
    return list_array(offsets, one_array(column).take(pa.array(order)).flatten())


def pack_table(
    table: pa.Table,
    pack_len: int,
    *,
    strategy: str = "bfd",
    overlong: str = "error",
    shuffle_seed: int | None = None,
    empty: str = "drop",
    max_images_per_pack: int | None = None,
    max_patches_per_pack: int | None = None,
    first_row: int = 0,
    log_left_out: bool = True,
) -> tuple[pa.Table, PackingStats]:
    """Pack an arrow table of token rows; see `pack_dataset` for the arguments. Returns the packed table and stats.

    `first_row` numbers the table's first row in messages (a chunk of a stream); `log_left_out=False` leaves the
    warning about columns left out to the caller.
    """
    if "input_ids" not in table.column_names:
        raise ValueError(f"cannot pack: no 'input_ids' column (columns: {table.column_names}); tokenize first.")
    if "seq_lengths" in table.column_names:
        raise ValueError("the rows already have 'seq_lengths' (already packed); pack the unpacked rows instead.")
    table, lengths, empties = drop_empty_rows(table, row_lengths(table["input_ids"]), empty=empty, first_row=first_row)
    if empties.size:
        logger.warning(
            "pack_dataset: %d empty sequences dropped (first: row %d); pass empty='error' to raise instead.",
            empties.size,
            first_row + int(empties[0]),
        )
    lengths = check_lengths(lengths, pack_len, overlong=overlong)
    images = vision_columns(table)  # kept whole, one entry per packed example (`vision_packing`)
    check_overlong_images(table, images, lengths, pack_len, overlong=overlong, first_row=first_row)
    vision, table = table.select(images), table.drop_columns(images)
    table, folded = fold_masks(table, lengths)
    names, left_out = split_columns(table, lengths)
    if left_out and log_left_out:
        logger.warning("pack_dataset: %s", describe_left_out(left_out).replace("\n", "; "))

    if overlong == "split":
        source, start, piece = split_lengths(lengths, pack_len)
    else:
        source, start, piece = np.arange(len(lengths)), np.zeros(len(lengths), np.int64), np.minimum(lengths, pack_len)
    pack_of = pack_ids(piece, pack_len, strategy=strategy)
    caps = {"max_images_per_pack": max_images_per_pack, "max_patches_per_pack": max_patches_per_pack}
    if any(cap is not None for cap in caps.values()):  # an image row is never cut: its pieces are whole rows
        pack_of = cap_vision(pack_of, vision, images, np.where(start == 0, source, -1), caps, first_row=first_row)
    num_packs = int(pack_of.max()) + 1 if len(pack_of) else 0
    if shuffle_seed is not None:  # packed row j is pack permutation[j]
        rank = np.empty(num_packs, dtype=np.int64)
        rank[np.random.default_rng(shuffle_seed).permutation(num_packs)] = np.arange(num_packs)
        pack_of = rank[pack_of]
    order = np.argsort(pack_of, kind="stable")  # pieces pack by pack, ascending inside a pack
    pieces_per_pack = np.bincount(pack_of, minlength=num_packs)

    piece_len = piece[order]
    piece_out_start = np.concatenate([[0], np.cumsum(piece_len)])
    piece_offsets = np.concatenate([[0], np.cumsum(pieces_per_pack)])
    pack_offsets = piece_out_start[piece_offsets]
    if np.array_equal(piece, lengths):  # every piece is a whole row (nothing split or truncated)
        arrays = {name: _gather_rows(table[name], source[order], pack_offsets) for name in names}
    else:
        # Flat index of every packed token: each piece's first token, repeated over the piece, plus a running offset.
        row_start = np.concatenate([[0], np.cumsum(lengths)])
        first = row_start[source[order]] + start[order]
        token_index = np.repeat(first - piece_out_start[:-1], piece_len) + np.arange(piece_out_start[-1])
        arrays = {name: _gather(table[name], token_index, pack_offsets) for name in names}
    # Positions restart at every piece: piece_out_start are the pieces' boundaries in the packed token order.
    arrays["position_ids"] = list_array(pack_offsets, cu_seqlens_to_position_ids(piece_out_start))
    arrays["seq_lengths"] = pa.ListArray.from_arrays(pa.array(piece_offsets, pa.int32()), pa.array(piece_len))
    arrays |= {name: gather_examples(vision[name], source[order], piece_offsets) for name in images}
    packed = pa.table(arrays)

    pack_tokens = np.diff(pack_offsets)
    num_tokens = int(piece_len.sum())
    n = len(lengths)
    batch_size = max(1, round(len(piece) / num_packs)) if num_packs else 1  # the baseline: a pack's sequences
    unpacked_padding = int(padded_batches(piece, batch_size=batch_size)[1].sum()) - num_tokens if n else 0
    packed_padding = int(num_packs * pack_len - num_tokens)
    stats = PackingStats(
        num_sequences=n,
        num_packs=num_packs,
        pack_len=pack_len,
        strategy=strategy,
        num_tokens=num_tokens,
        fill=num_tokens / (num_packs * pack_len) if num_packs else 0.0,
        mean_pack_tokens=float(pack_tokens.mean()) if num_packs else 0.0,
        max_pack_tokens=int(pack_tokens.max(initial=0)),
        min_pack_tokens=int(pack_tokens.min()) if num_packs else 0,
        mean_sequences_per_pack=len(piece) / num_packs if num_packs else 0.0,
        padding_tokens_unpacked=unpacked_padding,
        padded_batch_size=batch_size,
        padding_tokens_packed=packed_padding,
        padding_saved=unpacked_padding - packed_padding,
        overlong=overlong,
        num_overlong=int((lengths > pack_len).sum()),
        num_split_pieces=len(piece) - n,
        num_truncated_tokens=int(lengths.sum()) - num_tokens,
        num_empty=int(empties.size),
        dropped_columns=tuple(left_out),
        folded_masks=folded,
        carried_columns=tuple(names),
        vision_columns=tuple(images),
    )
    return packed, stats
