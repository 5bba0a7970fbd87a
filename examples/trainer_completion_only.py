"""Completion-only training with `transformers.Trainer`: the collator finds the response template and masks prompts.

    python examples/trainer_completion_only.py

Works on raw token ids: the response template is given as ids, the exact form that never depends on how a tokenizer
merges text in context. With a tokenizer, pass the template string and `tokenizer=`.
"""

import argparse
import tempfile

from transformers import Trainer, TrainingArguments

from flatcollate import DataCollatorForCompletionOnlyLM
from flatcollate.modeling import prepare_model_for_flattening
from flatcollate.synthetic import synthetic_sft_dataset
from flatcollate.testing import tiny_causal_lm

RESPONSE_TEMPLATE = [250, 251]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-examples", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    # Only the ids are kept: the collator rebuilds the labels from the template.
    dataset = synthetic_sft_dataset(
        args.num_examples, response_template=RESPONSE_TEMPLATE, seed=args.seed, max_tokens=256
    ).remove_columns("labels")
    collator = DataCollatorForCompletionOnlyLM(response_template=RESPONSE_TEMPLATE)
    batch = collator([dataset[i] for i in range(min(args.batch_size, len(dataset)))])
    trained = int((batch["labels"] != -100).sum())
    model = prepare_model_for_flattening(tiny_causal_lm("llama", seed=args.seed).train())
    with tempfile.TemporaryDirectory() as tmp:
        training_args = TrainingArguments(
            output_dir=tmp, per_device_train_batch_size=args.batch_size, num_train_epochs=1, logging_steps=1,
            save_strategy="no", report_to=[], use_cpu=True, seed=args.seed, disable_tqdm=True,
        )
        trainer = Trainer(model=model, args=training_args, train_dataset=dataset, data_collator=collator)
        trainer.train()
    result = {
        "optimizer_steps": trainer.state.global_step,
        "first_batch_trained_tokens": trained,
        "first_batch_tokens": int(batch["input_ids"].numel()),
        "losses": [log["loss"] for log in trainer.state.log_history if "loss" in log],
    }
    print(f"trained on {trained} of {result['first_batch_tokens']} tokens of the first batch; "
          f"{result['optimizer_steps']} optimizer steps")
    return result


if __name__ == "__main__":
    main()
