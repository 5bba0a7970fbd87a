"""Trainer and TRL use, through the examples: same optimizer steps as padding, same losses, guarded models."""

import importlib.util
import math
import tempfile
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer
from trl import SFTConfig, SFTTrainer

from flatcollate import DataCollatorWithFlattening
from flatcollate.integrations.trl import FlatSFTTrainer
from flatcollate.synthetic import synthetic_sft_dataset
from flatcollate.testing import tiny_causal_lm

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load_example(name):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_trainer_flattened_matches_padded_steps_and_losses():
    result = load_example("trainer_flattening").main(["--num-examples", "20", "--batch-size", "6"])
    assert result["optimizer_steps"] == {"padded": math.ceil(20 / 6), "flattened": math.ceil(20 / 6)}
    assert len(result["losses"]["flattened"]) == 4
    assert result["max_abs_loss_diff"] <= 1e-5


def test_trainer_completion_only_trains_only_completions():
    result = load_example("trainer_completion_only").main(["--num-examples", "10", "--batch-size", "4"])
    assert result["optimizer_steps"] == 3
    assert 0 < result["first_batch_trained_tokens"] < result["first_batch_tokens"]
    assert all(math.isfinite(loss) for loss in result["losses"])


def sft_config(tmp, **overrides):
    return SFTConfig(
        output_dir=tmp, per_device_train_batch_size=4, num_train_epochs=1, save_strategy="no", report_to=[],
        use_cpu=True, bf16=False, seed=0, disable_tqdm=True, logging_steps=1, **overrides,
    )


@pytest.fixture(scope="module")
def gpt2(tokenizer_dir):
    return AutoTokenizer.from_pretrained(tokenizer_dir("gpt2"))


@pytest.fixture(scope="module")
def sft_dataset(gpt2):
    ds = synthetic_sft_dataset(10, vocab_size=len(gpt2), max_tokens=64)
    return ds.map(lambda r: {"completion_mask": [int(x != -100) for x in r["labels"]]}).remove_columns("labels")


def test_sft_trainer_padding_free_same_steps_and_loss_as_padded(gpt2, sft_dataset):
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, cls, options in [
            ("padded", SFTTrainer, {}),
            ("flat", FlatSFTTrainer, {"padding_free": True, "max_length": None}),
        ]:
            model = tiny_causal_lm("llama", vocab_size=len(gpt2)).train()
            trainer = cls(model=model, args=sft_config(tmp, completion_only_loss=True, **options),
                          train_dataset=sft_dataset, processing_class=gpt2)
            trainer.train()
            runs[name] = trainer
    assert isinstance(runs["flat"].data_collator, DataCollatorWithFlattening)
    assert runs["flat"].model.config._attn_implementation == "flatcollate"
    assert runs["padded"].state.global_step == runs["flat"].state.global_step == math.ceil(10 / 4)
    losses = {k: [log["loss"] for log in t.state.log_history if "loss" in log] for k, t in runs.items()}
    assert max(abs(a - b) for a, b in zip(losses["padded"], losses["flat"], strict=True)) <= 1e-4


def test_sft_example_runs(tokenizer_dir):
    result = load_example("sft_trainer_padding_free").main(
        ["--tokenizer", str(tokenizer_dir("gpt2")), "--num-examples", "6", "--batch-size", "3"]
    )
    assert result == {**result, "optimizer_steps": 2, "collator": "DataCollatorWithFlattening",
                      "attn_implementation": "flatcollate"}


def test_flat_sft_trainer_takes_a_custom_flatcollate_collator(gpt2, sft_dataset):
    collator = DataCollatorWithFlattening(pad_to_multiple_of=8)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = FlatSFTTrainer(
            model=tiny_causal_lm("llama", vocab_size=len(gpt2)),
            args=sft_config(tmp, padding_free=True, max_length=None),
            train_dataset=sft_dataset, processing_class=gpt2, data_collator=collator,
        )
        batch = next(iter(trainer.get_train_dataloader()))
    assert trainer.data_collator is collator
    assert batch["input_ids"].shape[1] % 8 == 0 and "attention_mask" not in batch
    with pytest.raises(ValueError, match="attention_mask"):
        trainer.model(**batch, attention_mask=torch.ones_like(batch["input_ids"]))
