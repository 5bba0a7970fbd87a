"""What the throughput benchmark trains on, drawn once and the same for every mode: the sequences, each mode's batches
(timed and warm-up) and the pack length; and the padded real-token share over the whole length profile.

Both the in-process benchmark and its fresh-process workers build their batches here, so every process of a run
trains on exactly the same batches.
"""

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

import flatcollate

from ..profiles.load import load_profile, padded_fill
from .batches import (
    SyntheticSequences,
    check_labelled,
    default_pack_len,
    has_packing,
    step_batches,
    synthetic_sequences,
)
from .config import ThroughputConfig

PROFILE_FILL_SAMPLE = 20_000
"""Sequences drawn to estimate the profile's own padded real-token share."""


@dataclass(frozen=True)
class Plan:
    """What every mode trains on: the drawn sequences, each mode's timed and warm-up batches, the pack length."""

    pool: SyntheticSequences
    pack_len: int
    modes: list[str]
    skipped: dict[str, str]
    batches: dict[str, list[dict]]
    warm_batches: dict[str, list[dict]]
    collate_s: dict[str, float]


def plan_batches(config: ThroughputConfig, *, vocab_size: int, modes: Sequence[str]) -> Plan:
    """Draw the sequences (the same for every mode) and collate each of `modes`' batches, timing the collation."""
    profile = load_profile(config.profile)
    draw = {"max_length": config.max_length, "vocab_size": vocab_size}
    pool = synthetic_sequences(profile, config.steps * config.batch_size, seed=config.seed, **draw)
    warm = synthetic_sequences(profile, config.batch_size, seed=config.seed + 1, **draw)
    pack_len = config.pack_len or default_pack_len(pool, batch_size=config.batch_size, max_length=config.max_length)
    skipped = {} if has_packing() else {"packed": "flatcollate.data.packing is not available"}
    modes = [m for m in modes if m not in skipped]
    collator = flatcollate.DataCollatorWithFlattening()
    kwargs = {"batch_size": config.batch_size, "max_length": config.max_length, "pack_len": pack_len}
    batches, warm_batches, collate_s = {}, {}, {}
    for mode in modes:
        start = time.perf_counter()
        batches[mode] = step_batches(pool, mode, flattening_collator=collator, **kwargs)
        collate_s[mode] = time.perf_counter() - start
        check_labelled(batches[mode], mode, max_length=config.max_length)
        warm_batches[mode] = step_batches(warm, mode, flattening_collator=collator, **kwargs)[: config.warmup_steps]
    return Plan(pool, pack_len, modes, skipped, batches, warm_batches, collate_s)


def profile_fill(config: ThroughputConfig) -> dict[str, float]:
    """The real-token share a padded batch of this size has over the whole profile, not only the sequences drawn."""
    prompt, completion = load_profile(config.profile).sample(PROFILE_FILL_SAMPLE, seed=config.seed)
    return {
        "truncated": padded_fill(np.minimum(prompt + completion, config.max_length), batch_size=config.batch_size),
        "untruncated": padded_fill(prompt + completion, batch_size=config.batch_size),
    }
