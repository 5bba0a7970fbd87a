"""Train a tiny Llama with `transformers.Trainer` on flattened batches, beside the padded run of the same data.

    python examples/trainer_flattening.py                                   # gsm8k lengths, 64 examples
    python examples/trainer_flattening.py --profile flan --num-examples 64 --batch-size 8

Both runs see the same examples in the same order, so they take the same optimizer steps and log the same losses;
the flattened run just computes no padding.
"""

import argparse
import tempfile

import torch
from torch.nn.utils.rnn import pad_sequence
from transformers import Trainer, TrainingArguments

from flatcollate import IGNORE_INDEX, DataCollatorWithFlattening
from flatcollate.modeling import prepare_model_for_flattening
from flatcollate.synthetic import synthetic_sft_dataset
from flatcollate.testing import tiny_causal_lm


def pad_collate(features: list[dict]) -> dict[str, torch.Tensor]:
    """Right-padded batch: `input_ids` (pad 0), `labels` (pad -100) and `attention_mask`, each `(B, L)` int64."""
    input_ids = [torch.tensor(f["input_ids"]) for f in features]
    labels = [torch.tensor(f["labels"]) for f in features]
    return {
        "input_ids": pad_sequence(input_ids, batch_first=True, padding_value=0),
        "labels": pad_sequence(labels, batch_first=True, padding_value=IGNORE_INDEX),
        "attention_mask": pad_sequence([torch.ones_like(ids) for ids in input_ids], batch_first=True),
    }


def train(mode: str, dataset, *, batch_size: int, epochs: int, output_dir: str, seed: int) -> Trainer:
    """One run: `mode` is `"padded"` (pad to the batch max, attention mask) or `"flattened"`."""
    model = tiny_causal_lm("llama", seed=seed).train()
    if mode == "flattened":
        prepare_model_for_flattening(model)
        collator = DataCollatorWithFlattening()
    else:
        collator = pad_collate
    args = TrainingArguments(
        output_dir=f"{output_dir}/{mode}",
        per_device_train_batch_size=batch_size,
        num_train_epochs=epochs,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=seed,
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=dataset, data_collator=collator)
    trainer.train()
    return trainer


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="gsm8k")
    parser.add_argument("--num-examples", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-dir", default=None)
    args = parser.parse_args(argv)
    dataset = synthetic_sft_dataset(args.num_examples, profile=args.profile, seed=args.seed, max_tokens=512)
    with tempfile.TemporaryDirectory() as tmp:
        runs = {
            mode: train(mode, dataset, batch_size=args.batch_size, epochs=args.epochs,
                        output_dir=args.output_dir or tmp, seed=args.seed)
            for mode in ("padded", "flattened")
        }
    losses = {mode: [log["loss"] for log in t.state.log_history if "loss" in log] for mode, t in runs.items()}
    result = {
        "optimizer_steps": {mode: t.state.global_step for mode, t in runs.items()},
        "losses": losses,
        "max_abs_loss_diff": max(abs(a - b) for a, b in zip(losses["padded"], losses["flattened"], strict=True)),
    }
    print(f"optimizer steps: padded {result['optimizer_steps']['padded']}, "
          f"flattened {result['optimizer_steps']['flattened']}")
    print(f"max |loss padded - loss flattened| over {len(losses['padded'])} steps: {result['max_abs_loss_diff']:.2e}")
    return result


if __name__ == "__main__":
    main()
