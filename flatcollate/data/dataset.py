"""Pack a tokenized `datasets.Dataset` into rows of at most `pack_len` tokens, on pyarrow offsets.

Every packed row carries restarting `position_ids` and the lengths of the sequences it holds (`seq_lengths`), so
the flattening collator emits `cu_seq_lens` at every inner boundary and nothing attends across sequences::

    input_ids    [a a a a a | b b | c c c]      one packed row, pack_len 10
    labels       [. a a a a | . b | . c c]      completion masks already folded in (-100 where 0)
    position_ids [0 1 2 3 4 | 0 1 | 0 1 2]
    seq_lengths  [5, 2, 3]

`position_ids` is what survives `transformers.Trainer`'s default `remove_unused_columns=True` (it keeps only the
model's forward arguments: `input_ids`, `labels`, `position_ids`); `seq_lengths` is kept for TRL. Masks are folded
into `labels` for the same reason. Every other per-token column is packed like `input_ids`; columns that are not per
token are left out and named (`flatcollate.data.columns`).

Tokens are never copied in Python: the packed order of every token is computed with `np.repeat` over sequence
offsets and gathered with one `pyarrow` `take` per column, then wrapped with `ListArray.from_arrays`.
"""

import logging
from dataclasses import asdict, dataclass, field

import datasets
import numpy as np
import pyarrow as pa
import torch

from ..boundaries import cu_seqlens_to_position_ids
from .columns import describe_left_out, flat_values, fold_masks, list_array, row_lengths, split_columns
from .packing import check_lengths, group_by_pack, pack_ids, split_lengths

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PackingStats:
    """What packing did: counts, fill and padding, over-long sequences, and what happened to each column.

    `fill` is real tokens over `num_packs * pack_len`; `padding_saved` compares with one sequence per row of `pack_len`.
    `carried_columns` were packed token by token, `folded_masks` were folded into `labels`, `dropped_columns` were
    left out (not per token, or an all-ones `attention_mask`).
    """

    num_sequences: int
    num_packs: int
    pack_len: int
    strategy: str
    num_tokens: int
    fill: float
    mean_pack_tokens: float
    max_pack_tokens: int
    min_pack_tokens: int
    mean_sequences_per_pack: float
    padding_tokens_unpacked: int
    padding_tokens_packed: int
    padding_saved: int
    overlong: str
    num_overlong: int
    num_split_pieces: int
    num_truncated_tokens: int
    dropped_columns: tuple[str, ...] = field(default=())
    folded_masks: tuple[str, ...] = field(default=())
    carried_columns: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        lines = [
            f"{self.num_sequences:,} sequences ({self.num_tokens:,} tokens) -> {self.num_packs:,} packs of "
            f"<= {self.pack_len} tokens ({self.strategy})",
            f"fill {self.fill:.4%}, mean pack {self.mean_pack_tokens:.1f} tokens (min {self.min_pack_tokens}, max "
            f"{self.max_pack_tokens}), {self.mean_sequences_per_pack:.2f} sequences per pack",
            f"padding {self.padding_tokens_packed:,} tokens packed vs {self.padding_tokens_unpacked:,} with one "
            f"sequence per row: {self.padding_saved:,} saved",
            f"over-long: {self.num_overlong} ({self.overlong}; {self.num_split_pieces} extra pieces, "
            f"{self.num_truncated_tokens:,} tokens truncated)",
        ]
        if self.folded_masks:
            lines.append(f"labels: {', '.join(self.folded_masks)} folded in (-100 where 0)")
        if self.dropped_columns:
            lines.append(describe_left_out(self.dropped_columns))
        return "\n".join(lines)


def _gather(column: pa.ChunkedArray, token_index: np.ndarray, offsets: np.ndarray) -> pa.Array:
    """Rows of `offsets` over the tokens of `column` taken in `token_index` order."""
    return list_array(offsets, flat_values(column).take(pa.array(token_index)))


def pack_table(
    table: pa.Table,
    pack_len: int,
    *,
    strategy: str = "bfd",
    overlong: str = "error",
    shuffle_seed: int | None = None,
) -> tuple[pa.Table, PackingStats]:
    """Pack an arrow table of token rows; see `pack_dataset` for the arguments. Returns the packed table and stats."""
    if "input_ids" not in table.column_names:
        raise ValueError(f"cannot pack: no 'input_ids' column (columns: {table.column_names}); tokenize first.")
    if "seq_lengths" in table.column_names:
        raise ValueError("the rows already have 'seq_lengths' (already packed); pack the unpacked rows instead.")
    lengths = check_lengths(row_lengths(table["input_ids"]), pack_len, overlong=overlong)
    table, folded = fold_masks(table, lengths)
    names, left_out = split_columns(table, lengths)
    if left_out:
        logger.warning("pack_dataset: %s", describe_left_out(left_out).replace("\n", "; "))

    if overlong == "split":
        source, start, piece = split_lengths(lengths, pack_len)
    else:
        source, start, piece = np.arange(len(lengths)), np.zeros(len(lengths), np.int64), np.minimum(lengths, pack_len)
    packs = group_by_pack(pack_ids(piece, pack_len, strategy=strategy))
    if shuffle_seed is not None:
        packs = [packs[i] for i in np.random.default_rng(shuffle_seed).permutation(len(packs))]
    order = np.concatenate(packs) if packs else np.zeros(0, np.int64)
    pieces_per_pack = np.array([len(p) for p in packs], dtype=np.int64)

    # Flat index of every packed token: each piece's first token, repeated over the piece, plus a running offset.
    row_start = np.concatenate([[0], np.cumsum(lengths)])
    piece_len = piece[order]
    piece_out_start = np.concatenate([[0], np.cumsum(piece_len)])
    first = row_start[source[order]] + start[order]
    token_index = np.repeat(first - piece_out_start[:-1], piece_len) + np.arange(piece_out_start[-1])

    piece_offsets = np.concatenate([[0], np.cumsum(pieces_per_pack)])
    pack_offsets = piece_out_start[piece_offsets]
    arrays = {name: _gather(table[name], token_index, pack_offsets) for name in names}
    # Positions restart at every piece: piece_out_start are the pieces' boundaries in the packed token order.
    arrays["position_ids"] = list_array(pack_offsets, cu_seqlens_to_position_ids(piece_out_start))
    arrays["seq_lengths"] = pa.ListArray.from_arrays(pa.array(piece_offsets, pa.int32()), pa.array(piece_len))
    packed = pa.table(arrays)

    pack_tokens = np.diff(pack_offsets)
    num_tokens = int(piece_len.sum())
    n = len(lengths)
    unpacked_padding = int(n * pack_len - num_tokens)
    packed_padding = int(len(packs) * pack_len - num_tokens)
    stats = PackingStats(
        num_sequences=n,
        num_packs=len(packs),
        pack_len=pack_len,
        strategy=strategy,
        num_tokens=num_tokens,
        fill=num_tokens / (len(packs) * pack_len) if packs else 0.0,
        mean_pack_tokens=float(pack_tokens.mean()) if packs else 0.0,
        max_pack_tokens=int(pack_tokens.max(initial=0)),
        min_pack_tokens=int(pack_tokens.min()) if packs else 0,
        mean_sequences_per_pack=len(piece) / len(packs) if packs else 0.0,
        padding_tokens_unpacked=unpacked_padding,
        padding_tokens_packed=packed_padding,
        padding_saved=unpacked_padding - packed_padding,
        overlong=overlong,
        num_overlong=int((lengths > pack_len).sum()),
        num_split_pieces=len(piece) - n,
        num_truncated_tokens=int(lengths.sum()) - num_tokens,
        dropped_columns=tuple(left_out),
        folded_masks=folded,
        carried_columns=tuple(names),
    )
    return packed, stats


def pack_dataset(
    dataset: datasets.Dataset,
    pack_len: int,
    *,
    strategy: str = "bfd",
    overlong: str = "error",
    shuffle_seed: int | None = None,
    return_stats: bool = False,
) -> datasets.Dataset | tuple[datasets.Dataset, PackingStats]:
    """Pack tokenized rows into rows of at most `pack_len` tokens that remember where their sequences start.

    Args:
        dataset (`datasets.Dataset`): rows with `input_ids` and optionally `labels`, `completion_mask`,
            `assistant_masks` and other per-token columns (lists as long as `input_ids` in every row, e.g.
            `loss_weights`, `token_type_ids`). Masks are folded into `labels` (-100 where 0; `labels` start from
            `input_ids` when absent) and not kept; other per-token columns are packed like `input_ids`. Columns that
            are not per token (text, ids, lists of another length) and an all-ones `attention_mask` are left out
            and named in a warning and in the stats.
        pack_len (`int`): most tokens in one packed row.
        strategy (`str`, *optional*, defaults to `"bfd"`): `"bfd"` (best-fit decreasing over the whole dataset),
            `"first_fit"` or `"next_fit"`.
        overlong (`str`, *optional*, defaults to `"error"`): sequences longer than `pack_len` raise (`"error"`), keep
            their first `pack_len` tokens (`"truncate"`), or are cut into `pack_len` pieces that are packed as
            separate sequences (`"split"`).
        shuffle_seed (`int`, *optional*): shuffle the order of packed rows (best-fit decreasing opens packs longest
            sequence first).
        return_stats (`bool`, *optional*, defaults to `False`): also return the `PackingStats`.

    Returns:
        `datasets.Dataset` with the packed per-token columns (`input_ids` first, then `labels`), `position_ids`
        (list of int64 per row, restarting at 0 at every packed sequence) and `seq_lengths` (list of int64 per row,
        summing to the row's length), and the `PackingStats` when `return_stats=True`.

    Raises:
        `ValueError`: no `input_ids`, rows already packed, an over-long sequence with `overlong="error"`, a mask
            with values other than 0/1, a column per token in some rows only, a padded `attention_mask`, or
            `position_ids` that do not count from 0; the message names the row and the column.

    >>> ds = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3], [4, 5], [6, 7, 8, 9]]})
    >>> for name, rows in pack_dataset(ds, 6)[:].items():
    ...     print(name, rows)
    input_ids [[4, 5, 6, 7, 8, 9], [1, 2, 3]]
    position_ids [[0, 1, 0, 1, 2, 3], [0, 1, 2]]
    seq_lengths [[2, 4], [3]]
    """
    packed, stats = pack_table(
        dataset.with_format("arrow")[:], pack_len, strategy=strategy, overlong=overlong, shuffle_seed=shuffle_seed
    )
    out = datasets.Dataset(packed)
    return (out, stats) if return_stats else out


class PackedDataset(torch.utils.data.Dataset):
    """A map-style dataset of packed rows, with the signature DART-Math users know.

    Args:
        dataset (`datasets.Dataset`): tokenized rows with `input_ids` (and `labels`).
        tokenizer (`PreTrainedTokenizerBase`, *optional*): kept as `self.tokenizer`; packing needs no padding.
        pack_len (`int`, *optional*, defaults to 4096): most tokens per packed row.
        shuffle_seed (`int`, *optional*, defaults to 42): seed for the order of packed rows; `None` keeps it.
        strategy (`str`, *optional*, defaults to `"bfd"`), overlong (`str`, *optional*, defaults to `"error"`): as
            in `pack_dataset`.

    Items are dicts of lists: `input_ids`, `labels` (where given, or where masks were folded in), other per-token
    columns, `position_ids` and `seq_lengths`, ready for `DataCollatorWithFlattening`.
    """

    def __init__(
        self,
        dataset: datasets.Dataset,
        tokenizer=None,
        pack_len: int = 4096,
        shuffle_seed: int | None = 42,
        *,
        strategy: str = "bfd",
        overlong: str = "error",
    ):
        self.tokenizer = tokenizer
        self.pack_len = pack_len
        self.packed, self._stats = pack_dataset(
            dataset, pack_len, strategy=strategy, overlong=overlong, shuffle_seed=shuffle_seed, return_stats=True
        )

    def __len__(self) -> int:
        return len(self.packed)

    def __getitem__(self, index: int) -> dict[str, list[int]]:
        return self.packed[index]

    def stats(self, *, verbose: bool = True) -> PackingStats:
        """Print (unless `verbose=False`) and return the `PackingStats`."""
        if verbose:
            print(self._stats)
        return self._stats

    def stat(self) -> PackingStats:
        """DART-Math name for `stats()`."""
        return self.stats()
