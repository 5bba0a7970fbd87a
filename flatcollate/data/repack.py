"""Repack the least-full packs of a best-fit-decreasing packing into one pack fewer, by subset sums of bounded cost.

Best-fit decreasing can stop above the lower bound `ceil(total / pack_len)` when every gap it leaves is shorter than
every sequence left (GSM8K at 4096: 333 packs against 332). A round pools the sequences of the `t` least-full packs
and refills `t - 1` packs, each with the subset of the pool whose sum comes closest to `pack_len`::

    pack_len 10, t = 3    least-full packs [6 3] [5 2] [4]    pool 6 5 4 3 2 (20 tokens <= 2 packs)
    refill                pack a: 6 4 = 10    pack b: 5 3 2 = 10    nothing left -> one pack saved

A round that leaves part of the pool over changes nothing.

A subset sum is a bitset over `0 .. capacity` shifted once per pool sequence, so it costs about
`pool size x pack_len` bit operations (2 Gbit/s in CPython). Unbounded, pack_len 10,000,000 took minutes. The work is
bounded three ways:

- a round stops as soon as the rest of the pool cannot fit the packs left (more tokens than they hold, or more
  sequences longer than half a pack than there are packs): such a round could not save a pack, so stopping it early
  changes no result;
- one subset sum handles at most `SUBSET_SUM_BITS` bits: above that, sizes are rounded up and the capacity down to a
  coarser unit `q` (`ceil(l / q)`, `capacity // q`). Every subset found still fits, since
  `sum(l) <= q * sum(ceil(l / q)) <= q * (capacity // q) <= capacity`; only some near-perfect fills may be missed;
- the whole repack stops before a subset sum would take it past its budget, keeping the packs saved so far. The
  budget grows with the tokens packed (`repack_budget`: `REPACK_BITS_PER_TOKEN` bits a token, at least
  `REPACK_MIN_BITS`, at most `REPACK_BITS`, 1-2 s on one CPU core), so the repack stays a small share of packing the
  token columns: 200k GSM8K-like sequences spent 2.1 Gbit (0.85 s) to save 6 of 8,903 packs, more than the rest of
  `pack_dataset`.
"""

import numpy as np

SUBSET_SUM_BITS = 1 << 26
"""Most `pool size x (capacity + 1)` bits of one exact subset sum; 4096 sequences at pack_len 4096 stay exact."""

REPACK_BITS = 1 << 31
"""Most subset-sum bits of one whole repack; a subset sum that would exceed it is not started and the repack ends."""

REPACK_BITS_PER_TOKEN = 8
"""Default repack budget per token packed: about 4 ns a token, against tens of ns to gather it into a packed row."""

REPACK_MIN_BITS = 1 << 24
"""Smallest default repack budget (about 10 ms), so that small datasets still get every round they need."""


def repack_budget(num_tokens: int) -> int:
    """Default subset-sum bits of a repack of `num_tokens` tokens: `REPACK_BITS_PER_TOKEN` each, clipped to
    `[REPACK_MIN_BITS, REPACK_BITS]`.

    >>> repack_budget(1_000), repack_budget(36_000_000), repack_budget(10**10) == REPACK_BITS
    (16777216, 288000000, True)
    """
    return int(min(REPACK_BITS, max(REPACK_MIN_BITS, REPACK_BITS_PER_TOKEN * num_tokens)))


def largest_subset_sum(sizes: list[int], capacity: int) -> list[int]:
    """Positions of a subset of `sizes` whose sum is the largest one not above `capacity` (exact, bitset DP).

    >>> sorted(largest_subset_sum([6, 5, 4, 3], 10))
    [0, 2]
    """
    return _subset_sum(sizes, capacity)[0]


def _subset_sum(sizes: list[int], capacity: int) -> tuple[list[int], int]:
    """`largest_subset_sum` and the number of sizes its scan went through.

    Bit `s` of `reach[k]` says whether some subset of the first `k` sizes sums to `s`; walking back from the best sum
    recovers one such subset, preferring earlier sizes, so the scan stops at the first `k` that reaches `capacity`.
    Costs about `scanned * capacity` bit operations.
    """
    mask = (1 << (capacity + 1)) - 1
    reach = [1]
    for size in sizes:
        reach.append((reach[-1] | (reach[-1] << size)) & mask)
        if reach[-1].bit_length() == capacity + 1:  # a full pack: later sizes would not be chosen anyway
            break
    target = reach[-1].bit_length() - 1
    chosen = []
    for k in range(len(reach) - 1, 0, -1):
        if not (reach[k - 1] >> target) & 1:
            chosen.append(k - 1)
            target -= sizes[k - 1]
    return chosen, len(reach) - 1


def subset_sum_unit(num_sizes: int, capacity: int, *, max_bits: int = SUBSET_SUM_BITS) -> int:
    """Tokens per unit that keep a subset sum over `num_sizes` sizes within `max_bits` bits (1: exact).

    >>> subset_sum_unit(4096, 4096), subset_sum_unit(5000, 1_000_000)
    (1, 75)
    """
    return max(1, -(-num_sizes * (capacity + 1) // max_bits))


def bounded_subset_sum(sizes: list[int], capacity: int, *, max_bits: int = SUBSET_SUM_BITS) -> list[int]:
    """Positions of a subset of `sizes` that fits `capacity`, as full as a subset sum of at most `max_bits` bits finds.

    Exact (`largest_subset_sum`) when `len(sizes) * (capacity + 1) <= max_bits`; otherwise sizes and capacity are
    counted in units of `subset_sum_unit` tokens (sizes rounded up, capacity down), so the subset always fits.

    Five sizes and a capacity of 1M cost 5M bits exactly; within 100k bits they are counted in units of 51 tokens,
    the perfect fill 700k + 300k no longer fits (13726 + 5883 > 19607 units) and the next best is found:

    >>> sizes = [700_000, 600_000, 300_000, 250_000, 150_000]
    >>> [sum(sizes[k] for k in bounded_subset_sum(sizes, 1_000_000, max_bits=b)) for b in (5_000_005, 100_000)]
    [1000000, 950000]
    """
    return _bounded_subset_sum(sizes, capacity, max_bits=max_bits)[0]


def _bounded_subset_sum(sizes: list[int], capacity: int, *, max_bits: int) -> tuple[list[int], int]:
    """`bounded_subset_sum` and the bits its scan went through."""
    unit = subset_sum_unit(len(sizes), capacity, max_bits=max_bits)
    if unit > 1:
        sizes = [-(-size // unit) for size in sizes]
    chosen, scanned = _subset_sum(sizes, capacity // unit)
    return chosen, scanned * (capacity // unit + 1)


def _refill(sizes: list[int], num_packs: int, pack_len: int, budget: int) -> tuple[list[list[int]] | None, int]:
    """Positions of `sizes` (descending) for each of up to `num_packs` packs, or None when they cannot all be placed.

    Returns the fills (one list of positions per pack, as many as were needed) and the budget left.
    """
    left = list(range(len(sizes)))  # positions not placed yet, still in descending size order
    tokens_left = sum(sizes)
    over_half = sum(2 * size > pack_len for size in sizes)
    fills = []
    for packs_left in range(num_packs, 0, -1):
        if not left:
            break
        # Early stop: the rest needs more tokens than the packs left hold, or more packs than are left for the
        # sequences over half a pack (no two of them share one); the round would fail at its end anyway.
        if tokens_left > packs_left * pack_len or over_half > packs_left:
            return None, budget
        # The next subset sum's worst case must fit the budget; its real cost is counted after it ran.
        if len(left) * (pack_len // subset_sum_unit(len(left), pack_len) + 1) > budget:
            return None, 0
        rest = [sizes[k] for k in left]
        chosen, bits = _bounded_subset_sum(rest, pack_len, max_bits=SUBSET_SUM_BITS)
        budget -= bits
        taken = sorted(left[k] for k in chosen)
        tokens_left -= sum(sizes[k] for k in taken)
        over_half -= sum(2 * sizes[k] > pack_len for k in taken)
        fills.append(taken)
        taken_set = set(taken)
        left = [k for k in left if k not in taken_set]
    return (fills if not left else None), budget


def repack_least_full(
    lengths: np.ndarray, pack_of: np.ndarray, pack_len: int, *, max_pool: int = 4096, max_bits: int | None = None
) -> np.ndarray:
    """Save packs above the lower bound `ceil(total / pack_len)` by repacking the least-full packs into one fewer.

    Each round pools the sequences of the `t` least-full packs (t = 8, 16, ... while their gaps add up to at least
    one pack and the pool has at most `max_pool` sequences) and fills `t - 1` packs one after the other
    (`bounded_subset_sum`). A round that places the whole pool saves a pack; otherwise the packing is left as it was.
    Rounds stop at the lower bound, when no `t` saves a pack, or when `max_bits` of subset sums are spent.

    Args:
        lengths (`np.ndarray` of shape `(N,)`, int64): every length in `[1, pack_len]`.
        pack_of (`np.ndarray` of shape `(N,)`, int64): pack id of every sequence, `0 .. num_packs - 1`, every id used.
        pack_len (`int`).
        max_pool (`int`, *optional*, defaults to 4096): most sequences pooled in one round.
        max_bits (`int`, *optional*, defaults to `repack_budget(lengths.sum())`): work budget of the whole repack.

    Returns:
        `np.ndarray` of shape `(N,)`, int64: pack ids, still `0 .. num_packs - 1` with every id used.
    """
    lower_bound = -(-int(lengths.sum()) // pack_len)
    num_packs = int(pack_of.max()) + 1
    budget = repack_budget(int(lengths.sum())) if max_bits is None else max_bits
    while num_packs > lower_bound and budget > 0:
        load = np.bincount(pack_of, weights=lengths, minlength=num_packs).astype(np.int64)
        least_full = np.argsort(load, kind="stable")
        saved = False
        for t in (8, 16, 32, 64, 128, 256, 512):
            t = min(t, num_packs)
            chosen = np.sort(least_full[:t])
            members = np.flatnonzero(np.isin(pack_of, chosen))
            if members.size > max_pool:
                break
            if int(load[chosen].sum()) <= (t - 1) * pack_len:
                pool = members[np.argsort(-lengths[members], kind="stable")]
                fills, budget = _refill(lengths[pool].tolist(), t - 1, pack_len, budget)
                if fills is not None:
                    new_ids = pack_of.copy()
                    for pack, fill in zip(chosen.tolist(), fills, strict=False):
                        new_ids[pool[fill]] = pack
                    # Packs of the round left empty (at least the last) give up their ids; the others keep their order.
                    pack_of = np.unique(new_ids, return_inverse=True)[1].astype(np.int64)
                    num_packs = int(pack_of.max()) + 1
                    saved = True
                    break
            if t == num_packs or budget <= 0:
                break
        if not saved:
            break
    return pack_of
