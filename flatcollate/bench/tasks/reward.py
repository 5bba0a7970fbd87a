"""Reward modelling (`flatcollate bench --task reward`): `trl.RewardTrainer` on padded batches against
`FlatRewardTrainer` on flattened rows, on the preference pairs of the DPO task (`flatcollate.bench.pairs`).

A worker builds a random-weight sequence-classification model with one score (`num_labels=1`) from the seed, writes
the drawn pairs as TRL's `chosen` / `rejected` texts (prompt + reply) and trains as the DPO task does
(`flatcollate.bench.trainers`). `RewardTrainer` drops pairs longer than `max_length` instead of truncating them, so
only pairs whose two sequences fit are drawn.
"""

import numpy as np
import torch
from transformers import AutoModelForSequenceClassification

from ...synthetic.pairs import reward_texts
from ..build import build_on_device, model_config
from ..config import PairBenchConfig
from ..pairs import draw_pairs, pair_task, timed_lengths
from ..trainers import train_pairs


def measure(config: PairBenchConfig, mode: str, device: torch.device) -> dict:
    """Worker: train `RewardTrainer` (`padded`) or `FlatRewardTrainer` (`flattened`), which prepares its own
    backbone."""
    from ...synthetic import offline_tokenizer

    score_config = model_config(config)
    score_config.num_labels = 1
    model = build_on_device(
        AutoModelForSequenceClassification, score_config, device=device, dtype=config.dtype, seed=config.seed
    )
    tokenizer = offline_tokenizer(model.config.vocab_size)
    model.config.pad_token_id = tokenizer.pad_token_id
    draw = draw_pairs(config, whole=True)
    return train_pairs(
        config,
        mode,
        device,
        trainers=("RewardTrainer", "FlatRewardTrainer", "RewardConfig"),
        trained=timed_lengths(config, draw),
        rows=reward_texts(draw, vocab_size=model.config.vocab_size, seed=config.seed),
        keys=("chosen_ids", "rejected_ids"),
        expected=np.stack(draw.sequence_lengths(), axis=1),
        model=model,
        processing_class=tokenizer,
    )


TASK = pair_task(
    "reward",
    padded="RewardTrainer",
    flattened="FlatRewardTrainer",
    measure=measure,
    whole=True,
    step="collation, forward, backward, optimizer; one score per sequence (num_labels=1)",
)
