"""A batch sampler that balances tokens per batch and per data-parallel rank (multipack-style).

With a flattening collator a batch costs what its tokens cost, not `batch_size` rows. This sampler keeps the number
of optimizer steps of a plain sampler (`ceil(ceil(n / replicas) / batch_size)` batches per rank per epoch) but
groups sequences so every batch carries nearly the same number of tokens, at most `max_tokens`::

    lengths          [900, 40, 30, 950, 60, 20]       batch_size 2 -> 3 batches
    plain sampler    [900, 40] [30, 950] [60, 20]     tokens 940, 980, 80
    token budget     [950] [900] [40, 30, 60, 20]     tokens 950, 900, 150 (largest first into the lightest)

Ranks of one step get the batches closest in tokens, so no rank waits long for another. Either the sampler gives each
rank its batches (`shard=True`, a plain DataLoader per rank) or accelerate deals them (`shard=False`, a DataLoader
passed to `accelerator.prepare` or built by `transformers.Trainer`), never both (`flatcollate.data.shard_check`).
"""

import heapq
import math
import sys

import numpy as np
import torch

from .columns import row_lengths
from .sampler_state import EpochIterator, check_resume, lengths_fingerprint
from .shard_check import check_one_sharder, sharding_wrapper
from .vision_packing import check_image_rows_fit


def balanced_batches(lengths: np.ndarray, num_batches: int, *, seed: int = 0) -> list[np.ndarray]:
    """Split sequences into `num_batches` groups of near-equal token count (largest first into the lightest group).

    Args:
        lengths (`np.ndarray` of shape `(N,)`, integer): tokens per sequence.
        num_batches (`int`): number of groups, at most `N`.
        seed (`int`): breaks ties between equal lengths at random.

    Returns:
        `list[np.ndarray]`: `num_batches` int64 index arrays (ascending), every index in exactly one; the heaviest
        group exceeds the lightest by at most the longest sequence.

    >>> [b.tolist() for b in balanced_batches(np.array([900, 40, 30, 950, 60, 20]), 3)]
    [[3], [0], [1, 2, 4, 5]]
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    shuffled = np.random.default_rng(seed).permutation(len(lengths))
    order = shuffled[np.argsort(-lengths[shuffled], kind="stable")]
    heap = [(0, b) for b in range(num_batches)]
    batch_of = np.empty(len(lengths), dtype=np.int64)
    # One heap step per sequence: each placement depends on the loads left by the ones before it.
    for i, size in zip(order.tolist(), lengths[order].tolist(), strict=True):
        load, b = heapq.heappop(heap)
        batch_of[i] = b
        heapq.heappush(heap, (load + size, b))
    by_batch = np.argsort(batch_of, kind="stable")
    return np.split(by_batch, np.cumsum(np.bincount(batch_of, minlength=num_batches))[:-1])


def _check_int(name: str, value, *, minimum: int | None = None) -> None:
    """Raise unless `value` is an int (numpy ints too, bools not) of at least `minimum`."""
    noun = "a positive int" if minimum == 1 else "an int"
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{name} must be {noun}, got {value!r} ({type(value).__name__}).")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be {noun}, got {value}.")


def _first_non_integer(values: list) -> int:
    """Index of the first value that is not a whole number (a bool, a fractional float, None, text), else 0."""
    # Error path only: one pass over the examples to name the culprit.
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, int | float) or (isinstance(v, float) and not v.is_integer()):
            return i
    return 0


def check_example_lengths(lengths) -> np.ndarray:
    """Token counts of every example as a 1-D int64 array, each at least 1.

    Args:
        lengths (`Sequence[int]`, `np.ndarray` or `torch.Tensor` of shape `(N,)`, integer).

    Returns:
        `np.ndarray` of shape `(N,)`, int64.

    Raises:
        `TypeError`: for a shape other than `(N,)` or values that are not integers (floats, bools).
        `ValueError`: for an example of fewer than 1 token, naming the first one.

    >>> check_example_lengths([4, 0, 2])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: example 1 has 0 tokens; every example needs at least 1 token. Filter empty examples out first, ...
    """
    fix = "pass one token count per example, e.g. `[len(ids) for ids in dataset['input_ids']]`."
    try:
        array = np.asarray(lengths)
    except ValueError as err:  # ragged nested lists
        raise TypeError(f"lengths must be 1-D (one token count per example), got a ragged nested list; {fix}") from err
    if array.ndim != 1:
        raise TypeError(f"lengths must be 1-D (one token count per example), got shape {array.shape}; {fix}")
    if array.dtype.kind not in "iu" and array.size:
        values = array.tolist()
        i = _first_non_integer(values)
        raise TypeError(f"lengths must hold integers, got {array.dtype} (example {i}: {values[i]!r}); {fix}")
    array = array.astype(np.int64)
    empty = np.flatnonzero(array < 1)
    if empty.size:
        i = int(empty[0])
        raise ValueError(
            f"example {i} has {array[i]} tokens; every example needs at least 1 token. Filter empty examples out "
            'first, e.g. `dataset.filter(lambda row: len(row["input_ids"]) > 0)`.'
        )
    return array


class TokenBudgetBatchSampler(torch.utils.data.Sampler[list[int]]):
    """Batches of at most `max_tokens` tokens with near-equal token counts, as many per epoch as a plain sampler.

    Args:
        lengths (`Sequence[int]` or `np.ndarray` of shape `(N,)`): tokens of every example.
        batch_size (`int`): the plain per-rank batch size; sets the number of batches per epoch.
        max_tokens (`int`): most tokens in one batch.
        seed (`int`, *optional*, defaults to 0): seed of the grouping and of the batch order (plus the epoch).
        drop_last (`bool`, *optional*, defaults to `False`): use `floor(N / (replicas * batch_size))` batches per
            rank and leave the remaining examples (chosen at random each epoch) out.
        num_replicas (`int`, *optional*): data-parallel world size; defaults to `torch.distributed`'s, else 1.
        rank (`int`, *optional*): this process's rank; defaults to `torch.distributed`'s, else 0. Not used with
            `shard=False`.
        shard (`bool`, *optional*, defaults to `True`): who splits the batches among ranks.
            - `True`: the sampler; it yields this rank's batches only, one per step. For a plain DataLoader on every
              rank (torchrun); refused under accelerate's `BatchSamplerShard`, which would split them again.
            - `False`: accelerate; the sampler yields every rank's batch of every step, step by step in rank order
              (`steps x num_replicas` batches), and accelerate's `BatchSamplerShard` (`accelerator.prepare(loader)`,
              `transformers.Trainer`) deals batch `i` to process `i % num_processes`: each rank gets exactly the
              batches `shard=True` would give it. `batch_size` is then `None`, accelerate's mark of batches of
              varying size (it would keep only batches of exactly `batch_size` examples otherwise). Refused when
              iterated without that wrapper while `num_replicas > 1`, or dealt among another number of processes.

    Yields `list[int]` of dataset indices: one list per step for this rank (`shard=True`), or one per step and rank.
    Resumes mid-epoch: `state_dict()` holds the epoch and the options the batches depend on, and a state saved with
    other options is refused (`flatcollate.data.sampler_state`).

    Raises:
        `TypeError`: `lengths` not 1-D integers, or an option of the wrong type (floats, bools).
        `ValueError`: an example of fewer than 1 token or more than `max_tokens` (naming it), a non-positive
            `batch_size`/`max_tokens`/`num_replicas`, a `rank` outside `[0, num_replicas)` or given with
            `shard=False`; when iterated, batches split among ranks twice or not at all (see `shard`).

    >>> sampler = TokenBudgetBatchSampler([900, 40, 30, 950, 60, 20], batch_size=2, max_tokens=1000)
    >>> len(sampler), sorted(i for batch in sampler for i in batch)
    (3, [0, 1, 2, 3, 4, 5])
    """

    def __init__(
        self,
        lengths,
        *,
        batch_size: int,
        max_tokens: int,
        seed: int = 0,
        drop_last: bool = False,
        num_replicas: int | None = None,
        rank: int | None = None,
        shard: bool = True,
    ):
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        if num_replicas is None:
            num_replicas = torch.distributed.get_world_size() if distributed else 1
        if not isinstance(shard, bool):
            raise TypeError(f"shard must be a bool, got {shard!r} ({type(shard).__name__}).")
        if not shard and rank is not None:
            raise ValueError(
                f"`rank` is not used with shard=False (got rank={rank}): the sampler yields the batches of every rank "
                "and accelerate deals each rank its own. Leave `rank` out, or pass shard=True to yield one rank's."
            )
        if rank is None:
            rank = torch.distributed.get_rank() if distributed and shard else 0
        for name, value in (("batch_size", batch_size), ("max_tokens", max_tokens), ("num_replicas", num_replicas)):
            _check_int(name, value, minimum=1)
        _check_int("rank", rank)
        _check_int("seed", seed)
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} is not in [0, num_replicas={num_replicas}).")
        self.num_replicas, self.rank, self.shard = int(num_replicas), int(rank) if shard else None, shard
        self.lengths = check_example_lengths(lengths)
        self._fingerprint = lengths_fingerprint(self.lengths)  # once: a StatefulDataLoader saves a state per batch
        self.plain_batch_size, self.max_tokens, self.seed = int(batch_size), int(max_tokens), int(seed)
        self.batch_size = self.plain_batch_size if shard else None  # None: accelerate keeps batches of any size
        self.drop_last = drop_last
        self.epoch = 0
        n = len(self.lengths)
        if drop_last:
            self.num_steps = n // (self.num_replicas * batch_size)
        else:
            self.num_steps = math.ceil(math.ceil(n / self.num_replicas) / batch_size)
        if n and self.num_steps * self.num_replicas > n:
            raise ValueError(
                f"{n} examples cannot fill {self.num_steps} steps x {self.num_replicas} replicas with at least one "
                "example per batch; use fewer replicas or a larger batch_size."
            )
        too_long = np.flatnonzero(self.lengths > max_tokens)
        if too_long.size:
            i = int(too_long[0])
            raise ValueError(
                f"example {i} has {self.lengths[i]} tokens > max_tokens {max_tokens}; raise max_tokens, or truncate "
                "the example if it is text only (an example with images is never cut)."
            )

    @classmethod
    def from_dataset(cls, dataset, **options) -> "TokenBudgetBatchSampler":
        """A sampler over the rows of a tokenized `datasets.Dataset`, each counted as `len(input_ids)` (read from the
        arrow offsets). Image-text rows from `make_supervised_dataset(processor, ...)` hold their image placeholders
        already expanded (one per merged patch, tile feature, ...), so an example's images count in the budget as
        the tokens the language model runs them as; a packed row counts its examples' tokens.

        Args:
            dataset (`datasets.Dataset`): rows with `input_ids` (packed or not).
            options: the sampler's keyword arguments (`batch_size`, `max_tokens`, ...).

        >>> import datasets
        >>> ds = datasets.Dataset.from_dict({"input_ids": [[1, 9, 9, 9, 2], [3, 4]]})
        >>> TokenBudgetBatchSampler.from_dataset(ds, batch_size=1, max_tokens=8).lengths.tolist()
        [5, 2]
        """
        if "input_ids" not in getattr(dataset, "column_names", ()):
            raise ValueError(
                f"the dataset has no `input_ids` (columns: {getattr(dataset, 'column_names', None)}); encode it first "
                "(`flatcollate.data.make_supervised_dataset`), or pass `lengths` to TokenBudgetBatchSampler."
            )
        lengths = row_lengths(dataset.with_format("arrow")[:]["input_ids"])
        check_image_rows_fit(dataset, lengths, options.get("max_tokens"))
        return cls(lengths, **options)

    def set_epoch(self, epoch: int) -> None:
        """Reshuffle for `epoch` (call before iterating, as with `DistributedSampler`)."""
        self.epoch = epoch

    def __len__(self) -> int:
        return self.num_steps if self.shard else self.num_steps * self.num_replicas

    def epoch_batches(self) -> list[list[np.ndarray]]:
        """All batches of this epoch: `steps x replicas` index arrays, the same on every rank."""
        rng = np.random.default_rng((self.seed, self.epoch))
        n_batches = self.num_steps * self.num_replicas
        if n_batches == 0:
            return []
        chosen = np.arange(len(self.lengths))
        if self.drop_last:
            chosen = np.sort(rng.permutation(chosen)[: n_batches * self.plain_batch_size])
        groups = [chosen[g] for g in balanced_batches(self.lengths[chosen], n_batches, seed=int(rng.integers(2**31)))]
        loads = np.array([self.lengths[g].sum() for g in groups])
        heaviest = int(loads.max())
        if heaviest > self.max_tokens:
            need = math.ceil(int(loads.sum()) / n_batches)
            raise ValueError(
                f"max_tokens {self.max_tokens} cannot hold {len(chosen)} examples ({int(loads.sum())} tokens) in "
                f"{self.num_steps} steps x {self.num_replicas} replicas: the balanced batches need up to {heaviest} "
                f"tokens (at least {need} on average); raise max_tokens or batch_size."
            )
        # Ranks of one step get neighbouring loads so none waits long; steps then come in random order.
        by_load = np.argsort(loads, kind="stable").reshape(self.num_steps, self.num_replicas)
        return [[groups[b] for b in by_load[s]] for s in rng.permutation(self.num_steps)]

    def __iter__(self) -> EpochIterator:
        # Checked here, not in the iterator, so that the frame below is the one that called `iter()`.
        wrapper = sharding_wrapper(sys._getframe(1))
        check_one_sharder(wrapper, shard=self.shard, num_replicas=self.num_replicas, rank=self.rank)
        return EpochIterator(self._handed_out, length=len(self))

    def _handed_out(self) -> list[np.ndarray]:
        """This epoch's batches in the order `__iter__` yields them."""
        steps = self.epoch_batches()
        return [step[self.rank] for step in steps] if self.shard else [batch for step in steps for batch in step]

    def state_dict(self) -> dict:
        """The epoch and what its batches depend on; no rank and no position, so the same on every rank.

        Resume mid-epoch with `StatefulDataLoader` (it saves the position, `iter(sampler).state_dict()`, beside this)
        or, under accelerate, with `accelerator.register_for_checkpointing(sampler)` and
        `accelerator.skip_first_batches(loader, steps_done_in_epoch)`; see `flatcollate.data.sampler_state`.

        >>> sampler = TokenBudgetBatchSampler([900, 40, 30, 950, 60, 20], batch_size=2, max_tokens=1000)
        >>> sampler.set_epoch(1)
        >>> sampler.state_dict()  # doctest: +NORMALIZE_WHITESPACE
        {'epoch': 1, 'config': {'batch_size': 2, 'max_tokens': 1000, 'num_replicas': 1, 'seed': 0, 'drop_last': False,
         'lengths': '6 examples, sha256 95875a28e1759fca'}}
        """
        config = {
            "batch_size": self.plain_batch_size,
            "max_tokens": self.max_tokens,
            "num_replicas": self.num_replicas,
            "seed": self.seed,
            "drop_last": bool(self.drop_last),
            "lengths": self._fingerprint,
        }
        return {"epoch": int(self.epoch), "config": config}

    def load_state_dict(self, state: dict) -> None:
        """Go on in `state`'s epoch; a `ValueError` names every option the state was saved with that differs here."""
        self.epoch = check_resume(state, config=self.state_dict()["config"])
