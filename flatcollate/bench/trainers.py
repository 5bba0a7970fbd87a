"""How the preference tasks run by TRL's trainers (`dpo`, `kto`, `reward`) train one mode in a worker: TRL's trainer on
padded batches against flatcollate's on flattened rows, with the same options, batches, weights and seed, each step
timed by `timing.TrainerClock`. trl is imported here only, inside the worker that trains.

A step's time runs from the end of the step before to the end of this one, so it holds what the trainer does per
step: collating the batch, the forwards (the reference model's too, in DPO and KTO), the backward and the optimizer
step.
"""

import copy
import tempfile

import numpy as np
import torch

from .build import build_on_device, model_config, model_summary
from .config import PairBenchConfig
from .flops import step_flops
from .timing import TrainerClock


def trainer_options(config: PairBenchConfig, out: str, device: torch.device) -> dict:
    """The TRL config options both trainers of a task train with: the same steps, batch, optimizer and seed."""
    return {
        "output_dir": out,
        "per_device_train_batch_size": config.batch_size,
        "max_steps": config.warmup_steps + config.steps,
        "max_length": config.max_length,
        "learning_rate": config.lr,
        "optim": "adamw_torch",
        "lr_scheduler_type": "constant",
        "train_sampling_strategy": "sequential",
        "logging_strategy": "no",
        "save_strategy": "no",
        "report_to": [],
        "use_cpu": device.type == "cpu",
        "bf16": False,
        "seed": config.seed,
        "disable_tqdm": True,
    }


def recording(trainer_class):
    """`trainer_class` that keeps every optimizer step's loss (one batch per step), unrounded."""

    class Recording(trainer_class):
        losses: list[float]

        def training_step(self, *args, **kwargs):
            loss = super().training_step(*args, **kwargs)
            self.losses = [*getattr(self, "losses", []), loss.item()]
            return loss

    return Recording


def train(
    trainer_class,
    args_class,
    config: PairBenchConfig,
    device: torch.device,
    *,
    rows,
    check,
    trained,
    scored=(),
    options: dict | None = None,
    **kwargs,
) -> dict:
    """Train `trainer_class` (with `args_class(**trainer_options(...))`, `options` on top) on the text `rows`, check
    its tokenized dataset with `check(dataset)`, and return the figures `harness.Task.measure` returns. `kwargs` go to
    the trainer (`model`, `ref_model`, `processing_class`).

    The figures' `pass_flops` are `flops.step_flops` of the timed steps: the sequence lengths `trained` with gradients
    and `scored` without (a reference model's forward, KTO's KL pass).
    """
    import datasets
    import transformers

    datasets.disable_progress_bars()
    transformers.logging.set_verbosity_error()
    model = kwargs["model"]
    summary = model_summary(model)  # before the trainer prepares its copy
    with tempfile.TemporaryDirectory() as out:
        clock = TrainerClock(config.warmup_steps, device)
        trainer = recording(trainer_class)(
            args=args_class(**(trainer_options(config, out, device) | (options or {}))),
            train_dataset=datasets.Dataset.from_list(rows),
            callbacks=[clock],
            **kwargs,
        )
        trainer.remove_callback(transformers.PrinterCallback)  # the worker's last stdout line is its figures
        check(trainer.train_dataset)
        trainer.train()
    return {
        **clock.figures(),
        "losses": trainer.losses,
        "attn": trainer.model.base_model.config._attn_implementation,  # a reward model's backbone is prepared apart
        "pass_flops": step_flops(model, trained=trained, scored=scored),
        "model": summary,
        "environment": {"gradient_checkpointing": bool(trainer.args.gradient_checkpointing)},
    }


def train_pairs(
    config: PairBenchConfig,
    mode: str,
    device: torch.device,
    *,
    trainers: tuple[str, str, str],
    rows: list[dict],
    keys: tuple[str, ...],
    expected: np.ndarray,
    **kwargs,
) -> dict:
    """Worker of a preference task: `train` `trl.<trainers[0]>` (`padded`) or flatcollate's `<trainers[1]>`
    (`flattened`), both with `trl.<trainers[2]>` options, on the text `rows`, after checking that TRL tokenized each
    row's `keys` to the `expected` `(N, len(keys))` lengths. `kwargs` go to `train` (`trained`, `scored`, `options`)
    and the trainer (`model`, `ref_model`, `processing_class`)."""
    import trl

    from ..integrations import trl as flat_trl

    padded, flattened, args = trainers
    return train(
        getattr(trl, padded) if mode == "padded" else getattr(flat_trl, flattened),
        getattr(trl, args),
        config,
        device,
        rows=rows,
        check=lambda dataset: check_lengths(dataset, keys, expected),
        **kwargs,
    )


def policy_and_reference(config: PairBenchConfig, device: torch.device) -> dict:
    """The trainer arguments of a task with a reference model (DPO, KTO): the causal LM of `config` built from its
    seed on `device` (`model`), a copy of it (`ref_model`) and the offline tokenizer of its vocabulary
    (`processing_class`)."""
    from transformers import AutoModelForCausalLM

    from ..synthetic import offline_tokenizer

    model = build_on_device(
        AutoModelForCausalLM, model_config(config), device=device, dtype=config.dtype, seed=config.seed
    )
    tokenizer = offline_tokenizer(model.config.vocab_size)
    return {"model": model, "ref_model": copy.deepcopy(model), "processing_class": tokenizer}


def check_lengths(dataset, keys: tuple[str, ...], expected: np.ndarray) -> None:
    """TRL's tokenization of the texts gives the drawn lengths (an internal invariant of the data): `expected` is
    `(N, len(keys))`, the length of each key's ids in each row."""
    got = np.array([[len(row[key]) for key in keys] for row in dataset])
    assert got.shape == expected.shape and (got == expected).all(), "TRL tokenized the pairs to other lengths"
