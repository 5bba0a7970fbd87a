"""DPO (`flatcollate bench --task dpo`): `trl.DPOTrainer` on padded batches against `FlatDPOTrainer` on flattened
rows, on preference pairs whose lengths follow a real pair profile (`flatcollate.bench.pairs`).

A worker builds the model from the seed (a tiny random-weight causal LM by default), its reference copy and the
offline word-level tokenizer, writes the drawn pairs as text and trains `warmup_steps + steps` optimizer steps with a
constant-rate AdamW, the batches in dataset order (`flatcollate.bench.trainers`). Both trainers see the same batches
from the same weights, so their losses must agree step by step.
"""

import numpy as np
import torch

from ...synthetic.pairs import pair_texts
from ..config import PairBenchConfig
from ..pairs import draw_pairs, pair_task, timed_lengths
from ..trainers import policy_and_reference, train_pairs


def measure(config: PairBenchConfig, mode: str, device: torch.device) -> dict:
    """Worker: train `DPOTrainer` (`padded`) or `FlatDPOTrainer` (`flattened`); `FlatDPOTrainer` prepares its own
    copy of the model."""
    models = policy_and_reference(config, device)
    draw = draw_pairs(config)
    lengths = timed_lengths(config, draw)
    return train_pairs(
        config,
        mode,
        device,
        trainers=("DPOTrainer", "FlatDPOTrainer", "DPOConfig"),
        trained=lengths,
        scored=lengths,  # the reference's forward
        rows=pair_texts(draw, vocab_size=models["model"].config.vocab_size, seed=config.seed),
        keys=("prompt_ids", "chosen_ids", "rejected_ids"),
        expected=np.stack([draw.prompt, draw.chosen + 1, draw.rejected + 1], axis=1),  # eos after each reply
        **models,
    )


TASK = pair_task(
    "dpo",
    padded="DPOTrainer",
    flattened="FlatDPOTrainer",
    measure=measure,
    whole=False,
    step="collation, reference and policy forwards, backward, optimizer; the policy starts as its reference copy; "
    "gradient checkpointing as DPOConfig's default",
)
