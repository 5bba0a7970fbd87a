"""Bin packing of sequence lengths into packs of at most `pack_len` tokens.

A pack is one row of whole sequences back to back; the collator restarts positions in it (its `seq_lengths`)::

    lengths   [5, 2, 3, 6, 4]            pack_len 8
    bfd       pack 0: [3]    6 + 2 = 8   -> sequences 1, 3
              pack 1: [0, 2] 5 + 3 = 8
              pack 2: [4]    4

Strategies:

- `"bfd"` best-fit decreasing: longest first, each into the fullest pack that still fits; equal lengths placed in
  bulk, packs bucketed by remaining capacity (1M sequences in about a second); above `ceil(total / pack_len)` packs,
  the least-full are repacked into one fewer by subset sums, in bounded work (`flatcollate.data.repack`).
- `"first_fit"`: in data order, each into the first pack that fits; `"next_fit"`: a new pack whenever the next
  sequence does not fit the current one.

Over-long sequences raise by default; `overlong="truncate"` packs their first `pack_len` tokens, `"split"` cuts them
into `pack_len` pieces (`split_lengths`). `PackingStats` reports what packing did (`pack_dataset`).
"""

from bisect import bisect_left, insort
from dataclasses import asdict, dataclass, field

import numpy as np

from .columns import describe_left_out
from .repack import repack_least_full

STRATEGIES = ("bfd", "first_fit", "next_fit")
OVERLONG = ("error", "truncate", "split")


@dataclass(frozen=True)
class PackingStats:
    """What packing did: counts, fill and padding, over-long sequences, and what happened to each column.

    `fill`: real tokens over `num_packs * pack_len`. `padding_saved`: the packs (each padded to `pack_len`) against
    the sequences in data order, `padded_batch_size` (a pack's mean) at a time, each padded to its longest
    (`padding_tokens_unpacked`, as `flatcollate bench` pads); negative when the packs pad more. `carried_columns`
    were packed token by token, `folded_masks` folded into `labels`, `dropped_columns` left out, `vision_columns` kept
    one entry per packed example; `num_empty` counts the empty rows dropped.
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
    padded_batch_size: int
    padding_tokens_packed: int
    padding_saved: int
    overlong: str
    num_overlong: int
    num_split_pieces: int
    num_truncated_tokens: int
    num_empty: int = 0
    dropped_columns: tuple[str, ...] = field(default=())
    folded_masks: tuple[str, ...] = field(default=())
    carried_columns: tuple[str, ...] = field(default=())
    vision_columns: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        saved = self.padding_saved
        saving = f"{saved:,} saved" if saved >= 0 else f"{-saved:,} more when packed"
        lines = [
            f"{self.num_sequences:,} sequences ({self.num_tokens:,} tokens) -> {self.num_packs:,} packs of "
            f"<= {self.pack_len} tokens ({self.strategy})",
            f"fill {self.fill:.4%}, mean pack {self.mean_pack_tokens:.1f} tokens (min {self.min_pack_tokens}, max "
            f"{self.max_pack_tokens}), {self.mean_sequences_per_pack:.2f} sequences per pack",
            f"padding {self.padding_tokens_packed:,} tokens packed vs {self.padding_tokens_unpacked:,} in padded "
            f"mini-batches of {self.padded_batch_size} sequence{'s' * (self.padded_batch_size > 1)} (a pack's mean, in "
            f"data order, each padded to its longest): {saving}",
            f"over-long: {self.num_overlong} ({self.overlong}; {self.num_split_pieces} extra pieces, "
            f"{self.num_truncated_tokens:,} tokens truncated)",
        ]
        if self.num_empty:
            lines.append(f"{self.num_empty:,} empty sequences dropped")
        if self.folded_masks:
            lines.append(f"labels: {', '.join(self.folded_masks)} folded in (-100 where 0)")
        if self.dropped_columns:
            lines.append(describe_left_out(self.dropped_columns))
        if self.vision_columns:
            lines.append(f"vision fields, one entry per packed example: {', '.join(self.vision_columns)}")
        return "\n".join(lines)


def check_lengths(lengths: np.ndarray, pack_len: int, *, overlong: str = "error") -> np.ndarray:
    """Validate lengths for packing and return them as a 1-D int64 array.

    Raises:
        `ValueError`: for an empty sequence, a non-positive `pack_len`, an unknown `overlong`, or (with
            `overlong="error"`) a sequence longer than `pack_len`, naming the first offending index.
    """
    if overlong not in OVERLONG:
        raise ValueError(f"overlong={overlong!r} is not one of {OVERLONG}.")
    if not isinstance(pack_len, int | np.integer) or pack_len < 1:
        raise ValueError(f"pack_len must be a positive int, got {pack_len!r}.")
    lengths = np.asarray(lengths)
    if lengths.ndim != 1 or not np.issubdtype(lengths.dtype, np.integer):
        raise TypeError(f"lengths must be a 1-D integer array, got shape {lengths.shape} and dtype {lengths.dtype}.")
    lengths = lengths.astype(np.int64)
    empty = np.flatnonzero(lengths < 1)
    if empty.size:
        raise ValueError(f"sequence {empty[0]} has length {lengths[empty[0]]}; every sequence needs at least 1 token.")
    if overlong == "error":
        over = np.flatnonzero(lengths > pack_len)
        if over.size:
            i = int(over[0])
            raise ValueError(
                f"sequence {i} is {lengths[i]} tokens > pack_len {pack_len} ({over.size} sequences are over-long); "
                "pass overlong='split' or 'truncate', or raise pack_len."
            )
    return lengths


def split_lengths(lengths: np.ndarray, pack_len: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Cut every sequence into pieces of at most `pack_len` tokens.

    Args:
        lengths (`np.ndarray` of shape `(N,)`, integer).
        pack_len (`int`).

    Returns:
        `(source, start, length)`, each `np.ndarray` of shape `(P,)`, int64: piece `p` is tokens
        `[start[p], start[p] + length[p])` of sequence `source[p]`. Pieces of one sequence are consecutive.

    >>> [a.tolist() for a in split_lengths(np.array([3, 10]), 4)]
    [[0, 1, 1, 1], [0, 0, 4, 8], [3, 4, 4, 2]]
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    counts = -(-lengths // pack_len)
    source = np.repeat(np.arange(len(lengths), dtype=np.int64), counts)
    first_piece = np.concatenate([[0], np.cumsum(counts)[:-1]])
    piece_rank = np.arange(len(source), dtype=np.int64) - np.repeat(first_piece, counts)
    start = piece_rank * pack_len
    return source, start, np.minimum(lengths[source] - start, pack_len)


def _best_fit_decreasing(lengths: np.ndarray, pack_len: int) -> np.ndarray:
    """Pack id of every sequence under best-fit decreasing; pack ids count up in the order packs are opened."""
    order = np.argsort(-lengths, kind="stable")
    sorted_len = lengths[order]
    group_starts = np.flatnonzero(np.diff(sorted_len, prepend=-1))
    group_ends = np.append(group_starts[1:], len(sorted_len))
    pack_of_sorted = np.empty(len(lengths), dtype=np.int64)
    buckets: dict[int, list[int]] = {}  # remaining capacity -> ids of packs with exactly that room left
    capacities: list[int] = []  # sorted keys of `buckets`
    n_packs = 0

    def add(capacity: int, ids: list[int]) -> None:
        if capacity not in buckets:
            buckets[capacity] = []
            insort(capacities, capacity)
        buckets[capacity].extend(ids)

    def fill(ids: list[int], room: int, size: int, pos: int, count: int) -> None:
        """Sorted sequences pos..pos+count, all `size` long, into packs `ids` with `room` left, as many as fit each."""
        per_pack = room // size
        pack_of_sorted[pos : pos + count] = np.repeat(np.asarray(ids, dtype=np.int64), per_pack)[:count]
        full, rest = divmod(count, per_pack)
        if full:
            add(room - per_pack * size, ids[:full])
        if rest:
            add(room - rest * size, ids[full:])

    # Loop over distinct lengths, then over the buckets that fit them: equal sequences are placed in bulk.
    for start, end in zip(group_starts.tolist(), group_ends.tolist(), strict=True):
        size = int(sorted_len[start])
        pos = start
        while pos < end:
            k = bisect_left(capacities, size)
            if k == len(capacities):
                break
            capacity = capacities[k]
            # The fullest fitting pack keeps taking equal sequences until it has less room than one of them.
            per_pack = capacity // size
            bucket = buckets[capacity]
            n_used = min(len(bucket), -(-(end - pos) // per_pack))
            used = bucket[len(bucket) - n_used :]
            del bucket[len(bucket) - n_used :]
            if not bucket:
                del buckets[capacity]
                capacities.pop(k)
            placed = min(n_used * per_pack, end - pos)
            fill(used, capacity, size, pos, placed)
            pos += placed
        if pos < end:
            n_new = -(-(end - pos) // (pack_len // size))
            fill(list(range(n_packs, n_packs + n_new)), pack_len, size, pos, end - pos)
            n_packs += n_new
    pack_of = np.empty_like(pack_of_sorted)
    pack_of[order] = pack_of_sorted
    return pack_of


def _first_fit(lengths: np.ndarray, pack_len: int) -> np.ndarray:
    """Pack id of every sequence under first-fit in data order (a max segment tree over pack capacities)."""
    n = len(lengths)
    leaves = 1
    while leaves < max(n, 1):
        leaves *= 2
    tree = [pack_len] * (2 * leaves)  # every leaf starts as an unopened, empty pack
    pack_of = [0] * n
    # One descent per sequence: first-fit depends on every earlier placement, so it cannot be batched.
    for i, size in enumerate(lengths.tolist()):
        node = 1
        while node < leaves:
            node = 2 * node if tree[2 * node] >= size else 2 * node + 1
        pack_of[i] = node - leaves
        tree[node] -= size
        node //= 2
        while node:
            tree[node] = max(tree[2 * node], tree[2 * node + 1])
            node //= 2
    # Leaves are opened left to right, so leaf indices are already consecutive pack ids.
    return np.asarray(pack_of, dtype=np.int64)


def _next_fit(lengths: np.ndarray, pack_len: int) -> np.ndarray:
    """Pack id of every sequence under next-fit in data order: one `searchsorted` per pack."""
    cu = np.concatenate([[0], np.cumsum(lengths)])
    pack_of = np.empty(len(lengths), dtype=np.int64)
    start, pack = 0, 0
    # Loop over packs: each pack's end is where the running total first exceeds its start plus pack_len.
    while start < len(lengths):
        end = int(np.searchsorted(cu, cu[start] + pack_len, side="right")) - 1
        pack_of[start:end] = pack
        start, pack = end, pack + 1
    return pack_of


def pack_ids(lengths: np.ndarray, pack_len: int, *, strategy: str = "bfd") -> np.ndarray:
    """Pack id of every sequence (all lengths already in `[1, pack_len]`).

    Args:
        lengths (`np.ndarray` of shape `(N,)`, integer).
        pack_len (`int`).
        strategy (`str`): one of `"bfd"`, `"first_fit"`, `"next_fit"`.

    Returns:
        `np.ndarray` of shape `(N,)`, int64: ids `0 .. num_packs - 1`, every id used.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy={strategy!r} is not one of {STRATEGIES}.")
    if len(lengths) == 0:
        return np.zeros(0, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    if strategy == "bfd":
        return repack_least_full(lengths, _best_fit_decreasing(lengths, pack_len), pack_len)
    return {"first_fit": _first_fit, "next_fit": _next_fit}[strategy](lengths, pack_len)


def group_by_pack(pack_of: np.ndarray) -> list[np.ndarray]:
    """Indices of each pack, ascending inside a pack, packs in id order.

    >>> [p.tolist() for p in group_by_pack(np.array([1, 0, 1, 0, 2]))]
    [[1, 3], [0, 2], [4]]
    """
    order = np.argsort(pack_of, kind="stable")
    counts = np.bincount(pack_of) if len(pack_of) else np.zeros(0, dtype=np.int64)
    return np.split(order, np.cumsum(counts)[:-1]) if len(counts) else []


def pack_lengths(
    lengths: np.ndarray, pack_len: int, *, strategy: str = "bfd", overlong: str = "error"
) -> list[np.ndarray]:
    """Group sequences into packs of at most `pack_len` tokens.

    Args:
        lengths (`np.ndarray` of shape `(N,)`, integer): token count of every sequence, each at least 1.
        pack_len (`int`): most tokens in one pack.
        strategy (`str`, *optional*, defaults to `"bfd"`): `"bfd"`, `"first_fit"` or `"next_fit"`.
        overlong (`str`, *optional*, defaults to `"error"`): what to do with sequences longer than `pack_len`:
            `"error"` raises, `"truncate"` packs their first `pack_len` tokens, `"split"` packs the pieces of
            `split_lengths(lengths, pack_len)` and the returned indices refer to those pieces.

    Returns:
        `list[np.ndarray]`: one int64 array of sequence (or piece) indices per pack, ascending inside a pack.

    >>> [p.tolist() for p in pack_lengths(np.array([5, 2, 3, 6, 4]), 8)]
    [[1, 3], [0, 2], [4]]
    >>> [p.tolist() for p in pack_lengths(np.array([5, 2, 3, 6, 4]), 8, strategy="next_fit")]
    [[0, 1], [2], [3], [4]]
    """
    lengths = check_lengths(lengths, pack_len, overlong=overlong)
    if overlong == "truncate":
        lengths = np.minimum(lengths, pack_len)
    elif overlong == "split":
        lengths = split_lengths(lengths, pack_len)[2]
    return group_by_pack(pack_ids(lengths, pack_len, strategy=strategy))
