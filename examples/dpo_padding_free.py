"""TRL's `DPOTrainer`, padding-free: `FlatDPOTrainer` against `DPOTrainer`'s padded run on the same pairs.

    python examples/dpo_padding_free.py                                 # offline, a word-level stand-in tokenizer
    python examples/dpo_padding_free.py --tokenizer path/to/tokenizer   # any local tokenizer folder

Each batch of preference pairs becomes one row of chosen then rejected sequences (no padding); the policy and the
reference model run once over it. Both trainers start from the same weights and see the same batches: their losses
agree step by step, within fp32 rounding.
"""

import argparse
import copy
import tempfile

import torch
from datasets import Dataset
from transformers import AutoTokenizer
from trl import DPOConfig, DPOTrainer

from flatcollate.integrations.trl import FlatDPOTrainer
from flatcollate.synthetic import offline_tokenizer
from flatcollate.testing import tiny_causal_lm


def preference_pairs(count: int, vocab_size: int, seed: int) -> Dataset:
    """Prompts of 4-40 words, chosen and rejected replies of 1-60: the lengths of real pairs differ this much."""
    generator = torch.Generator().manual_seed(seed)

    def words(low: int, high: int) -> str:
        length = int(torch.randint(low, high, (1,), generator=generator))
        return " ".join(f"t{int(i)}" for i in torch.randint(0, vocab_size - 2, (length,), generator=generator))

    # replies start with a space: TRL joins prompt and reply as they are
    return Dataset.from_list(
        [{"prompt": words(4, 40), "chosen": " " + words(1, 60), "rejected": " " + words(1, 60)} for _ in range(count)]
    )


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", default=None, help="a local tokenizer folder (default: an offline one)")
    parser.add_argument("--num-examples", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--loss-type", default="sigmoid", help="a DPOConfig loss_type, e.g. sigmoid, ipo, hinge")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    tokenizer = offline_tokenizer() if args.tokenizer is None else AutoTokenizer.from_pretrained(args.tokenizer)
    pairs = preference_pairs(args.num_examples, 256, args.seed)
    start = tiny_causal_lm("llama", vocab_size=len(tokenizer), seed=args.seed)
    losses, steps = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, trainer_class in (("padded", DPOTrainer), ("flattened", FlatDPOTrainer)):
            model = copy.deepcopy(start)
            config = DPOConfig(
                output_dir=tmp,
                per_device_train_batch_size=args.batch_size,
                num_train_epochs=1,
                logging_steps=1,
                loss_type=[args.loss_type],
                learning_rate=1e-3,
                save_strategy="no",
                report_to=[],
                use_cpu=True,
                bf16=False,
                seed=args.seed,
                disable_tqdm=True,
                train_sampling_strategy="sequential",
            )
            trainer = trainer_class(
                model=model,
                ref_model=copy.deepcopy(start),
                args=config,
                train_dataset=pairs,
                processing_class=tokenizer,
            )
            trainer.train()
            losses[name] = [log["loss"] for log in trainer.state.log_history if "loss" in log]
            steps[name] = trainer.state.global_step
    gap = max(abs(a - b) for a, b in zip(losses["padded"], losses["flattened"], strict=True))
    print(f"{steps['flattened']} optimizer steps ({steps['padded']} padded); largest loss gap {gap:.1e}")
    return {"optimizer_steps": steps["flattened"], "losses": losses, "max_abs_loss_diff": gap}


if __name__ == "__main__":
    main()
