"""Split a flattened row over the ranks of a sequence-parallel group: each rank gets one contiguous slice.

The row is padded to a multiple of the group size with a padding sequence of its own, next-token labels are taken
over the whole row, and only then is it cut. Boundaries stay the whole row's: attention runs over the whole row
after the all-to-all (`flatcollate.parallel.attention`). A row of two sequences (9 tokens) over 2 ranks::

    input_ids      [a0 a1 a2 a3 a4 a5 | b0 b1 b2 | p]      p: padding, a sequence of its own
    position_ids   [0  1  2  3  4  5  | 0  1  2  | 0]
    shift_labels   [a1 a2 a3 a4 a5 -  | b1 b2 -  | -]      -: -100 (last token of a sequence, padding)
                    rank 0: tokens 0-4   | rank 1: tokens 5-9
    cu_seq_lens    [0, 6, 9, 10] on both ranks, max_length 6

Rank 0's last label is `a5`: the first token of rank 1's slice, which rank 0 could not see had the labels been
shifted after the cut. `shift_labels` is the name transformers' loss functions take for labels already shifted.
"""

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from .._conventions import IDS_DTYPE
from ..boundaries import cu_seqlens_to_position_ids, max_length, next_token_labels
from ..collate.flattening import DataCollatorWithFlattening
from ..collate.padding import pad_as_own_segment

SPLIT_KEYS = ("input_ids", "position_ids", "shift_labels")
"""Per-token fields each rank gets its slice of, `(1, T / world_size)` int64."""

_READ_KEYS = frozenset({"input_ids", "labels", "position_ids", "seq_idx", "cu_seq_lens_q", "cu_seq_lens_k"})
_ROW_KEYS = frozenset({"max_length_q", "max_length_k"})


def _as_numpy(value: Any, key: str) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    if isinstance(value, np.ndarray):
        return value
    raise TypeError(f"`{key}` must be a torch tensor or numpy array (as the flattening collator emits), got {value!r}.")


def _check_batch(batch: Mapping[str, Any], rank: int, world_size: int) -> None:
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"`world_size` must be a positive int (the sequence-parallel group's size), got {world_size}.")
    if not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside the group: pass 0 <= rank < world_size={world_size}.")
    if batch.get("attention_mask") is not None:
        raise ValueError(
            "The batch has an `attention_mask`: sequence parallelism splits flattened rows, which take none. Collate "
            "with `flatcollate.DataCollatorWithFlattening`."
        )
    for key in ("input_ids", "labels", "cu_seq_lens_q"):
        if batch.get(key) is None:
            raise ValueError(
                f"The batch has no `{key}`; the split needs `input_ids`, `labels` and the row's boundaries "
                "`cu_seq_lens_q`. Collate with `flatcollate.DataCollatorWithFlattening(return_flash_attn_kwargs=True)`."
            )
    unknown = sorted(set(batch) - _READ_KEYS - _ROW_KEYS)
    if unknown:
        raise ValueError(
            f"The batch has {unknown}, which the sequence-parallel split does not know how to cut; remove them "
            "before splitting (keep example ids and other metadata aside)."
        )
    if batch["input_ids"].shape[0] != 1 or batch["input_ids"].ndim != 2:
        raise ValueError(
            f"`input_ids` has shape {tuple(batch['input_ids'].shape)}; sequence parallelism splits one row (1, T). "
            "Flatten the mini-batch into one row (`DataCollatorWithFlattening`)."
        )


def split_for_sequence_parallel(
    batch: Mapping[str, Any], *, rank: int, world_size: int, pad_token_id: int = 0
) -> dict[str, torch.Tensor | int]:
    """Rank `rank`'s part of a flattened row: its contiguous slice of tokens, with the whole row's boundaries.

    Args:
        batch (`Mapping`): one flattened row as `DataCollatorWithFlattening` emits it: `input_ids` `(1, T)` int64,
            `labels` `(1, T)` int64, `cu_seq_lens_q` `(N + 1,)` int32, and optionally `position_ids` `(1, T)`
            (derived from the boundaries when absent), `cu_seq_lens_k`, `max_length_q/k`, `seq_idx` (dropped:
            sequence-normalized losses and state-carrying layers are not supported under sequence parallelism).
        rank (`int`): this process's rank in the sequence-parallel group.
        world_size (`int`): the group's size.
        pad_token_id (`int`): token of the padding sequence added to reach a multiple of `world_size`.

    Returns:
        `dict` with `input_ids`, `position_ids`, `shift_labels` (`(1, T' / world_size)` int64, `T'` the padded
        length), `cu_seq_lens_q/k` (`(N' + 1,)` int32, the whole padded row) and `max_length_q/k` (`int`). Pass all
        of it to a model prepared with `prepare_model_for_sequence_parallel` except `shift_labels`, which goes to
        `sequence_parallel_loss`.

    >>> from flatcollate import DataCollatorWithFlattening
    >>> row = DataCollatorWithFlattening()([{"input_ids": [1, 2, 3, 4, 5]}, {"input_ids": [6, 7]}])
    >>> part = split_for_sequence_parallel(row, rank=1, world_size=2)
    >>> part["input_ids"].tolist(), part["shift_labels"].tolist(), part["cu_seq_lens_q"].tolist()
    ([[5, 6, 7, 0]], [[-100, 7, -100, -100]], [0, 5, 7, 8])
    """
    _check_batch(batch, rank, world_size)
    input_ids = _as_numpy(batch["input_ids"], "input_ids")[0].astype(np.int64, copy=False)
    labels = _as_numpy(batch["labels"], "labels")[0].astype(np.int64, copy=False)
    cu_seqlens = _as_numpy(batch["cu_seq_lens_q"], "cu_seq_lens_q")
    total = input_ids.shape[0]
    if labels.shape[0] != total or int(cu_seqlens[-1]) != total:
        raise ValueError(
            f"`input_ids` has {total} tokens, `labels` {labels.shape[0]} and `cu_seq_lens_q` ends at "
            f"{int(cu_seqlens[-1])}; collate them together (`DataCollatorWithFlattening`)."
        )
    padded_ids, padded_labels, padded_cu = pad_as_own_segment(
        input_ids, labels, cu_seqlens, multiple=world_size, pad_token_id=pad_token_id
    )
    pad = padded_ids.shape[0] - total
    if batch.get("position_ids") is None:
        positions = cu_seqlens_to_position_ids(padded_cu)
    else:
        given = _as_numpy(batch["position_ids"], "position_ids").reshape(-1).astype(np.int64, copy=False)
        start = int(given[0]) if total else 0  # the collator's `position_ids_start`: padding restarts there too
        positions = np.concatenate([given, np.arange(pad, dtype=np.int64) + start])
    shifted = next_token_labels(padded_labels, padded_cu.astype(np.int64))
    local = padded_ids.shape[0] // world_size
    part = slice(rank * local, (rank + 1) * local)
    out: dict[str, torch.Tensor | int] = {
        key: torch.from_numpy(np.ascontiguousarray(value[part])).to(IDS_DTYPE)[None]
        for key, value in zip(SPLIT_KEYS, (padded_ids, positions, shifted), strict=True)
    }
    cu = torch.from_numpy(np.ascontiguousarray(padded_cu))
    out["cu_seq_lens_q"], out["cu_seq_lens_k"] = cu, cu.clone()
    out["max_length_q"] = out["max_length_k"] = max_length(padded_cu)
    return out


class DataCollatorForSequenceParallel:
    """A flattening collator followed by `split_for_sequence_parallel`: each rank collates the same examples and
    keeps its own slice.

    Every rank of a sequence-parallel group must be given the same examples in the same order (the same sampler
    seed and data-parallel rank); ranks of different groups get different examples, as in data parallelism.

    Args:
        collator (`Callable`): builds one flattened row from a list of examples, e.g.
            `flatcollate.DataCollatorWithFlattening()` (default) or `DataCollatorForCompletionOnlyLM`.
        rank (`int`): this process's rank in the sequence-parallel group.
        world_size (`int`): the group's size.
        pad_token_id (`int`, *optional*): token of the padding sequence; defaults to the collator's
            `pad_token_id`, else 0.

    >>> collator = DataCollatorForSequenceParallel(rank=0, world_size=2)
    >>> collator([{"input_ids": [1, 2, 3]}])["input_ids"].tolist()
    [[1, 2]]
    """

    def __init__(
        self,
        collator: Callable[[Sequence[Mapping[str, Any]]], Mapping[str, Any]] | None = None,
        *,
        rank: int,
        world_size: int,
        pad_token_id: int | None = None,
    ):
        self.collator = DataCollatorWithFlattening() if collator is None else collator
        self.rank, self.world_size = rank, world_size
        self.pad_token_id = getattr(self.collator, "pad_token_id", 0) if pad_token_id is None else pad_token_id

    def __call__(self, features: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor | int]:
        return split_for_sequence_parallel(
            self.collator(features), rank=self.rank, world_size=self.world_size, pad_token_id=self.pad_token_id
        )
