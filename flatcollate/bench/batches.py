"""The batches each mode of the text SFT benchmark trains on, from the synthetic sequences of
`flatcollate.synthetic.sequences`.

Every mode sees exactly the same sequences (random token ids, prompt tokens labelled -100); only the grouping and
the layout differ. Three sequences of lengths 3, 1 and 2 with batch size 3 (`.` is padding, `|` a boundary)::

    padded        [a a a]  [b . .]  [c c .]     (3, 3) + attention_mask, padded to the longest in the batch
    padded_max    [a a a . . . .] ... x3        (3, max_length) + attention_mask, the pad-everything baseline
    hf_flattened  [a a a | b | c c]             (1, 6) from transformers' own `DataCollatorWithFlattening`:
                                                restarting position_ids only, for the model's own `sdpa`
    flattened     [a a a | b | c c]             (1, 6), restarting position_ids, cu_seq_lens, no attention_mask
    packed        [a a a | c c | b ...]         (1, <= pack_len) per step: best-fit-decreasing packs, flattened

`hf_flattened` is the padding-free path a user gets without flatcollate (what TRL's `padding_free=True` uses
without flash-attn): transformers detects the boundaries from `position_ids` and builds a dense block mask.
"""

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import transformers
from torch.nn.utils.rnn import pad_sequence

from .._conventions import IGNORE_INDEX
from ..data.packing import pack_lengths
from ..synthetic.sequences import SyntheticSequences
from .config import BATCHED_MODE, MODES, PEER_MODE

PAD_VALUES = {"input_ids": 0, "labels": IGNORE_INDEX, "mm_token_type_ids": 0}
"""Per-token fields a padded batch pads, with their pad value (`input_ids`' is the model's pad id)."""


def pad_examples(examples: list[dict], *, pad_token_id: int = 0, pad_to: int | None = None) -> dict[str, torch.Tensor]:
    """The processor-style padded batch of per-example fields (1-D int arrays or tensors): every field of `PAD_VALUES`
    right padded to the longest example (or to `pad_to`), an `attention_mask`, and the other fields (`pixel_values`,
    `image_grid_thw`) concatenated in example order.

    Returns:
        `input_ids` (pad `pad_token_id`), `labels` (pad -100), `mm_token_type_ids` (pad 0) where the examples have it,
        `attention_mask`, each `(B, L)` int64; the concatenated fields where any example has them.

    >>> pad_examples([{"input_ids": np.array([1, 2, 3])}, {"input_ids": np.array([4])}])["input_ids"].tolist()
    [[1, 2, 3], [4, 0, 0]]
    """
    lengths = torch.tensor([len(e["input_ids"]) for e in examples])
    width = int(lengths.max()) if pad_to is None else pad_to
    if width < lengths.max():
        raise ValueError(f"pad_to={pad_to} is shorter than the longest example of the batch ({int(lengths.max())}).")
    pads = {**PAD_VALUES, "input_ids": pad_token_id}
    batch = {}
    for key, pad in pads.items():
        if key in examples[0]:
            rows = [torch.as_tensor(e[key]) for e in examples]
            padded = pad_sequence(rows, batch_first=True, padding_value=pad)
            batch[key] = torch.nn.functional.pad(padded, (0, width - padded.shape[1]), value=pad)
    batch["attention_mask"] = (torch.arange(width) < lengths[:, None]).long()
    for key in sorted({key for e in examples for key in e} - set(pads)):
        batch[key] = torch.cat([torch.as_tensor(e[key]) for e in examples if key in e])
    return batch


def default_pack_len(seqs: SyntheticSequences, *, batch_size: int, max_length: int) -> int:
    """Tokens per pack so that packs carry about as many tokens as a batch: `batch_size` x mean length, rounded up
    to a multiple of 64, and never below `max_length` (every sequence must fit)."""
    target = int(np.ceil(batch_size * seqs.lengths.mean() / 64) * 64)
    return max(target, max_length)


def step_batches(
    seqs: SyntheticSequences,
    mode: str,
    *,
    batch_size: int,
    max_length: int,
    pack_len: int,
    flattening_collator,
) -> list[dict]:
    """The batches of one pass over `seqs` in `mode` (see the module docstring).

    `padded`, `padded_max`, `hf_flattened` and `flattened` take consecutive groups of `batch_size` sequences, so they
    run the same number of optimizer steps; `packed` runs one step per best-fit-decreasing pack of at most `pack_len`
    tokens.
    """
    if mode not in MODES:
        raise ValueError(f"Unknown mode {mode!r}; choose from {MODES}.")
    order = np.arange(len(seqs.lengths))
    if mode == "packed":
        groups = pack_lengths(seqs.lengths, pack_len, strategy="bfd")
    else:
        groups = np.split(order, np.arange(batch_size, len(order), batch_size))
    batches = []
    hf_collator = transformers.DataCollatorWithFlattening(return_position_ids=True) if mode == PEER_MODE else None
    # One collation per optimizer step.
    for group in groups:
        if mode == "padded":
            batches.append(pad_examples(seqs.features(group)))
        elif mode == "padded_max":
            batches.append(pad_examples(seqs.features(group), pad_to=max_length))
        elif mode == PEER_MODE:
            batches.append(hf_collator(seqs.features(group)))
        elif mode in ("flattened", BATCHED_MODE):
            batches.append(flattening_collator(seqs.features(group)))
        else:
            features = seqs.features(group)
            packed = {
                "input_ids": np.concatenate([f["input_ids"] for f in features]),
                "labels": np.concatenate([f["labels"] for f in features]),
                "seq_lengths": seqs.lengths[group].tolist(),
            }
            batches.append(flattening_collator([packed]))
    return batches


@dataclass(frozen=True)
class Plan:
    """What the modes of a task train on: the drawn pool, each mode's timed and warm-up batches and the seconds its
    collation took."""

    pool: object
    batches: dict[str, list[dict]]
    warm_batches: dict[str, list[dict]]
    collate_s: dict[str, float]


def plan_modes(modes: Sequence[str], collate: Callable, pool, warm, *, max_length: int, warmup_steps: int) -> Plan:
    """Every mode's batches of `pool` (`collate(mode, pool)`, timed; checked by `check_labelled`) and the first
    `warmup_steps` of its batches of `warm`, drawn apart so that no warm-up step trains a timed batch."""
    batches, warm_batches, collate_s = {}, {}, {}
    for mode in modes:
        start = time.perf_counter()
        batches[mode] = collate(mode, pool)
        collate_s[mode] = time.perf_counter() - start
        check_labelled(batches[mode], mode, max_length=max_length)
        warm_batches[mode] = collate(mode, warm)[:warmup_steps]
    return Plan(pool, batches, warm_batches, collate_s)


def real_tokens(batch: dict) -> int:
    """Non-pad tokens of a batch: the attention mask's ones, or every token of a flattened row."""
    mask = batch.get("attention_mask")
    return int(mask.sum()) if mask is not None else int(batch["input_ids"].numel())


class UnlabelledBatch(ValueError):
    """A benchmark step whose batch has no labelled token (`check_labelled`)."""


def check_labelled(batches: list[dict], mode: str, *, max_length: int) -> None:
    """Raise `UnlabelledBatch` (a `ValueError`) for a step whose batch has no labelled token: its loss would be NaN in
    every mode, and every loss comparison NaN with it (prompts longer than `max_length` lose their completions)."""
    for step, batch in enumerate(batches):
        if not bool((batch["labels"] != IGNORE_INDEX).any()):
            raise UnlabelledBatch(
                f"{mode} step {step}: no example of the batch keeps a labelled token after truncation to max_length "
                f"{max_length} (the prompts are longer), so its loss is not defined. Raise --max-length."
            )


def slot_tokens(batch: dict) -> int:
    """Tokens the model computes on, padding included."""
    return int(batch["input_ids"].numel())
