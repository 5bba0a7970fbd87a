"""Reward-model training throughput and peak memory: `trl.RewardTrainer` on padded batches against
`FlatRewardTrainer` on flattened rows, on the preference pairs of `flatcollate.bench.dpo`.

Every run of a trainer is a fresh process (`python -m flatcollate.bench.reward --worker <payload>`): it builds a
random-weight sequence-classification model with one score (`num_labels=1`) from the seed, writes the drawn pairs as
TRL's `chosen` / `rejected` texts (prompt + reply, `dpo_data.reward_texts`) and trains `warmup_steps + steps` optimizer
steps with a constant-rate AdamW, the batches in dataset order. `RewardTrainer` drops pairs longer than `max_length`
instead of truncating them, so only pairs whose two sequences fit are drawn. Timing, repeats, the ratio and the loss
agreement are those of the DPO benchmark (`dpo.StepClock`, `dpo_summary.summarize_dpo`).
"""

import sys
import tempfile

import numpy as np
import torch
from transformers import AutoModelForSequenceClassification

from .build import build_on_device
from .config import DPO_MODES, DPOBenchConfig
from .dpo import (
    StepClock,
    check_dpo_config,
    config_from_json,
    recording,
    run_pair_task,
    trainer_figures,
    trainer_options,
)
from .dpo_data import draw_pairs, reward_texts
from .memory import PeakMemory
from .repeats import Runner, serve_worker
from .throughput import bench_threads, model_config, resolve_device

WORKER = ("-m", "flatcollate.bench.reward")
"""How the parent starts a worker: `python -m flatcollate.bench.reward --worker <payload>`."""


def measure_reward_mode(config: DPOBenchConfig, mode: str) -> dict:
    """Worker: train `mode` (`"padded"`: `trl.RewardTrainer`; `"flattened"`: `FlatRewardTrainer`) alone in this
    process.

    Returns:
        `dict` (JSON-ready): the fields of `dpo.measure_dpo_mode`.
    """
    import datasets
    import transformers
    import trl

    from ..integrations.trl import FlatRewardTrainer
    from ..synthetic import offline_tokenizer

    if mode not in DPO_MODES:
        raise ValueError(f"Unknown reward benchmark mode {mode!r}; choose from {DPO_MODES}.")
    check_dpo_config(config)
    datasets.disable_progress_bars()
    transformers.logging.set_verbosity_error()
    device = resolve_device(config.device)
    with bench_threads(config.threads, device), tempfile.TemporaryDirectory() as out:
        model = build_reward_model(config, device=device)
        tokenizer = offline_tokenizer(model.config.vocab_size)
        model.config.pad_token_id = tokenizer.pad_token_id
        draw = draw_pairs(config, whole=True)
        texts = reward_texts(draw, vocab_size=model.config.vocab_size, seed=config.seed)
        args = trl.RewardConfig(**trainer_options(config, out, device))
        clock = StepClock(config.warmup_steps, PeakMemory(device))
        trainer_class = recording({"padded": trl.RewardTrainer, "flattened": FlatRewardTrainer}[mode])
        trainer = trainer_class(
            model=model,
            args=args,
            train_dataset=datasets.Dataset.from_list(texts),
            processing_class=tokenizer,
            callbacks=[clock],
        )
        _check_tokenized_lengths(trainer.train_dataset, draw)
        trainer.train()
        return trainer_figures(trainer, clock, model)


def build_reward_model(config: DPOBenchConfig, *, device: torch.device):
    """Random-weight sequence-classification model with one score from the config's seed (no download), `sdpa`,
    no KV cache; `FlatRewardTrainer` prepares its own backbone."""
    model_config_ = model_config(config)
    model_config_.use_cache = False
    model_config_.num_labels = 1
    return build_on_device(
        AutoModelForSequenceClassification, model_config_, device=device, dtype=config.dtype, seed=config.seed
    )


def _check_tokenized_lengths(dataset, draw) -> None:
    """TRL's tokenization gives every drawn pair, at the drawn lengths (an internal invariant of the data)."""
    expected = np.stack(draw.sequence_lengths(), axis=1)
    got = np.array([[len(row[key]) for key in ("chosen_ids", "rejected_ids")] for row in dataset])
    assert got.shape == expected.shape and (got == expected).all(), "TRL tokenized the pairs to other lengths"


def run_reward_bench(config: DPOBenchConfig, *, progress: bool = True, runner: Runner | None = None) -> dict:
    """Train both reward trainers `config.repeats` times each, every run a fresh process, and summarize.

    Args:
        config (`DPOBenchConfig`): what to measure (`batch_size` pairs per step, `2 * batch_size` sequences).
        progress (`bool`): a progress bar over the runs on stderr.
        runner (`Runner`, *optional*): carries out one run (default: a worker process).

    Returns:
        `dict` (JSON-ready): as `dpo.run_dpo_bench`, with `task` `"reward"`.
    """
    return run_pair_task(config, WORKER, "reward", progress=progress, runner=runner)


if __name__ == "__main__":
    serve_worker(sys.argv[1:], lambda case, mode: measure_reward_mode(config_from_json(case["config"]), mode))
