"""Pack a tokenized `datasets.Dataset` into rows of at most `pack_len` tokens, on pyarrow offsets.

Every packed row keeps the lengths of the sequences it holds in `seq_lengths`, so the flattening collator restarts
`position_ids` and emits `cu_seq_lens` at every inner boundary; nothing attends across sequences::

    input_ids    [a a a a a | b b | c c c]      one packed row, pack_len 10
    seq_lengths  [5, 2, 3]
    position_ids [0 1 2 3 4 | 0 1 | 0 1 2]      (made by the collator)

Tokens are never copied in Python: the packed order of every token is computed with `np.repeat` over sequence
offsets and gathered with one `pyarrow` `take` per column, then wrapped with `ListArray.from_arrays`.
"""

from dataclasses import asdict, dataclass, field

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from .packing import check_lengths, group_by_pack, pack_ids, split_lengths

TOKEN_COLUMNS = ("input_ids", "labels", "completion_mask", "assistant_masks")
"""Columns packed token by token next to `input_ids`; each must have the same length as `input_ids` in every row."""


@dataclass(frozen=True)
class PackingStats:
    """What packing did: counts, fill and padding, and how over-long sequences were handled.

    `fill` is real tokens over `num_packs * pack_len`; `padding_saved` compares with one sequence per row of `pack_len`.
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
        if self.dropped_columns:
            lines.append(f"columns not packed (not token-aligned): {', '.join(self.dropped_columns)}")
        return "\n".join(lines)


def _token_columns(table: pa.Table, lengths: np.ndarray) -> list[str]:
    """Token-aligned columns present in `table`, checked row by row against `input_ids`."""
    names = [name for name in TOKEN_COLUMNS if name in table.column_names]
    for name in names[1:]:
        other = pc.list_value_length(table[name]).to_numpy(zero_copy_only=False)
        bad = np.flatnonzero(other != lengths)
        if bad.size:
            i = int(bad[0])
            raise ValueError(
                f"row {i}: field {name!r} has {other[i]} values but 'input_ids' has {lengths[i]} tokens; "
                f"token-aligned columns must match input_ids ({bad.size} rows differ)."
            )
    return names


def _gather(column: pa.ChunkedArray, token_index: np.ndarray, offsets: np.ndarray) -> pa.Array:
    """Rows of `offsets` over the tokens of `column` taken in `token_index` order."""
    values = column.combine_chunks().flatten().take(pa.array(token_index))
    if offsets[-1] > np.iinfo(np.int32).max:
        return pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), values)
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values)


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
    lengths = pc.list_value_length(table["input_ids"]).to_numpy(zero_copy_only=False).astype(np.int64)
    lengths = check_lengths(lengths, pack_len, overlong=overlong)
    names = _token_columns(table, lengths)

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
        min_pack_tokens=int(pack_tokens.min(initial=0)),
        mean_sequences_per_pack=len(piece) / len(packs) if packs else 0.0,
        padding_tokens_unpacked=unpacked_padding,
        padding_tokens_packed=packed_padding,
        padding_saved=unpacked_padding - packed_padding,
        overlong=overlong,
        num_overlong=int((lengths > pack_len).sum()),
        num_split_pieces=len(piece) - n,
        num_truncated_tokens=int(lengths.sum()) - num_tokens,
        dropped_columns=tuple(c for c in table.column_names if c not in names),
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
    """Pack tokenized rows into rows of at most `pack_len` tokens that remember their sequence lengths.

    Args:
        dataset (`datasets.Dataset`): rows with `input_ids` and optionally `labels`, `completion_mask`,
            `assistant_masks` (token-aligned: same length as `input_ids`). Other columns are not packed; their names
            are listed in the stats.
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
        `datasets.Dataset` with the packed token columns and `seq_lengths` (list of int64 per row, summing to the
        row's length), and the `PackingStats` when `return_stats=True`.

    >>> ds = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3], [4, 5], [6, 7, 8, 9]]})
    >>> pack_dataset(ds, 6)[:]
    {'input_ids': [[4, 5, 6, 7, 8, 9], [1, 2, 3]], 'seq_lengths': [[2, 4], [3]]}
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

    Items are dicts of lists: `input_ids`, `labels` (where given) and `seq_lengths`, ready for
    `DataCollatorWithFlattening`.
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
