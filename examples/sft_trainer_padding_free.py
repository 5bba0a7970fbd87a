"""TRL `SFTTrainer` with `padding_free=True`, collated by flatcollate through `FlatSFTTrainer`.

    python examples/sft_trainer_padding_free.py                              # offline, a word-level stand-in
    python examples/sft_trainer_padding_free.py --tokenizer path/to/tokenizer  # any local tokenizer folder

TRL refuses a custom collator when `padding_free=True`; `FlatSFTTrainer` lets TRL prepare the dataset (here
pre-tokenized prompt/completion ids with a `completion_mask`, folded into labels by TRL), then collates with
`DataCollatorWithFlattening` and prepares the model so no sequence attends to another.
"""

import argparse
import tempfile

from transformers import AutoTokenizer
from trl import SFTConfig

from flatcollate.integrations.trl import FlatSFTTrainer
from flatcollate.synthetic import offline_tokenizer, synthetic_sft_dataset
from flatcollate.testing import tiny_causal_lm


def to_completion_mask(row: dict) -> dict:
    """TRL's pre-tokenized prompt/completion form: `input_ids` and a `completion_mask` (1 on completion tokens)."""
    return {"completion_mask": [int(label != -100) for label in row["labels"]]}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--tokenizer", default=None, help="a local tokenizer folder (default: an offline word-level tokenizer)"
    )
    parser.add_argument("--num-examples", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    tokenizer = offline_tokenizer() if args.tokenizer is None else AutoTokenizer.from_pretrained(args.tokenizer)
    vocab = len(tokenizer)
    dataset = synthetic_sft_dataset(args.num_examples, vocab_size=vocab, seed=args.seed, max_tokens=256)
    dataset = dataset.map(to_completion_mask).remove_columns("labels")
    model = tiny_causal_lm("llama", vocab_size=vocab, seed=args.seed).train()
    with tempfile.TemporaryDirectory() as tmp:
        config = SFTConfig(
            output_dir=tmp,
            padding_free=True,
            max_length=None,
            completion_only_loss=True,
            per_device_train_batch_size=args.batch_size,
            num_train_epochs=1,
            logging_steps=1,
            save_strategy="no",
            report_to=[],
            use_cpu=True,
            bf16=False,
            seed=args.seed,
            disable_tqdm=True,
        )
        trainer = FlatSFTTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer)
        trainer.train()
    result = {
        "optimizer_steps": trainer.state.global_step,
        "collator": type(trainer.data_collator).__name__,
        "attn_implementation": model.config._attn_implementation,
        "losses": [log["loss"] for log in trainer.state.log_history if "loss" in log],
    }
    print(
        f"{result['optimizer_steps']} optimizer steps with {result['collator']} "
        f"and attention '{result['attn_implementation']}'"
    )
    return result


if __name__ == "__main__":
    main()
