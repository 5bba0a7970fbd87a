"""`FlatSFTTrainer` trains on exactly the tokens `trl.SFTTrainer(padding_free=True)` trains on, for every `SFTConfig`.

TRL folds the masks its config asks for (`completion_only_loss`, `assistant_only_loss`) into `labels` while preparing
the dataset, and its collator ignores any mask column left over; the batches of both trainers must be equal.
"""

import tempfile

import pytest
import torch
from datasets import Dataset
from transformers import AutoTokenizer
from trl import SFTConfig, SFTTrainer

from flatcollate.integrations.trl import FlatSFTTrainer
from flatcollate.testing import tiny_causal_lm

PROMPTS = ["The capital of France is", "Two plus two equals", "Name a colour:", "Write a haiku about rain.", "Hi", "Q?"]
COMPLETIONS = [" Paris.", " four, of course.", " blue", " Drops on the window\nsoft grey hum", " Hello!", " A."]


def chat(prompt, completion):
    return [
        {"role": "user", "content": prompt},
        {"role": "assistant", "content": completion.strip()},
        {"role": "user", "content": "And again?"},
        {"role": "assistant", "content": "Again: " + completion.strip()},
    ]


def make_dataset(kind, tokenizer, *, iterable):
    """Rows of one of TRL's dataset formats; `iterable` gives an `IterableDataset` (prepared lazily, no fingerprint
    hashing of the tokenizer, so the matrix stays fast), else a map-style `Dataset`."""
    pairs = list(zip(PROMPTS, COMPLETIONS, strict=True))
    if kind == "prompt_completion":
        rows = [{"prompt": p, "completion": c} for p, c in pairs]
    elif kind == "conversational_prompt_completion":
        rows = [{"prompt": chat(p, c)[:3], "completion": chat(p, c)[3:]} for p, c in pairs]
    elif kind == "conversational":
        rows = [{"messages": chat(p, c)} for p, c in pairs]
    else:  # "tokenized": input_ids with a completion_mask column, as TRL's docs describe; "tokenized_both" adds
        rows = []  # an assistant_masks column (TRL folds it whatever the config) that leaves the last token out
        for p, c in pairs:
            prompt, completion = tokenizer.encode(p), tokenizer.encode(c)
            mask = [0] * len(prompt) + [1] * len(completion)
            rows.append({"input_ids": prompt + completion, "completion_mask": mask})
            if kind == "tokenized_both":
                rows[-1]["assistant_masks"] = [1] * (len(mask) - 1) + [0]
    dataset = Dataset.from_list(rows)
    return dataset.to_iterable_dataset() if iterable else dataset


def sft_config(tmp, **overrides):
    options = {"padding_free": True, "max_length": None, "max_steps": 100, **overrides}  # iterable data needs max_steps
    return SFTConfig(
        output_dir=tmp, per_device_train_batch_size=4, num_train_epochs=1, save_strategy="no", report_to=[],
        use_cpu=True, bf16=False, seed=0, disable_tqdm=True, train_sampling_strategy="sequential", **options,
    )


def batches(trainer_class, tokenizer, dataset, tmp, **overrides):
    """Every batch of one epoch, in dataset order."""
    model = tiny_causal_lm("llama")  # never run: the batches are compared
    trainer = trainer_class(model=model, args=sft_config(tmp, **overrides), train_dataset=dataset,
                            processing_class=tokenizer)
    return list(trainer.get_train_dataloader())


@pytest.fixture(scope="module")
def qwen(tokenizer_dir):
    return AutoTokenizer.from_pretrained(tokenizer_dir("qwen2.5-instruct"))


PACKED = {"packing": True, "packing_strategy": "bfd"}
ITERABLE_CASES = [  # every dataset format TRL prepares, through `Trainer`'s path for iterable datasets
    *[(kind, {"completion_only_loss": value})
      for kind in ("prompt_completion", "conversational_prompt_completion", "tokenized")
      for value in (True, False, None)],
    *[("conversational", {"assistant_only_loss": value}) for value in (True, False)],
    ("conversational_prompt_completion", {"assistant_only_loss": True, "completion_only_loss": False}),
    *[("prompt_completion", {**PACKED, "max_length": 24, "completion_only_loss": value}) for value in (True, False)],
    ("conversational", {**PACKED, "max_length": 64, "assistant_only_loss": True}),
]
MAP_CASES = [  # pre-tokenized (no tokenizer to fingerprint), through `Trainer`'s path for map-style datasets
    *[("tokenized", {"completion_only_loss": value}) for value in (True, False, None)],
    *[("tokenized", {**PACKED, "max_length": 16, "completion_only_loss": value}) for value in (True, False)],
    *[("tokenized_both", {"completion_only_loss": value}) for value in (True, False)],
]


def assert_same_batches(got, expected):
    assert len(got) == len(expected) > 0
    for ours, theirs in zip(got, expected, strict=True):
        assert set(ours) == set(theirs)
        for key in ("input_ids", "labels", "position_ids", "cu_seq_lens_q", "seq_idx"):
            torch.testing.assert_close(ours[key], theirs[key], rtol=0, atol=0, check_dtype=False, msg=key)
        assert int(ours["max_length_q"]) == int(theirs["max_length_q"])


@pytest.mark.parametrize("remove_unused_columns", [True, False])
@pytest.mark.parametrize(
    ("iterable", "kind", "options"),
    [(True, *case) for case in ITERABLE_CASES] + [(False, *case) for case in MAP_CASES],
    ids=lambda v: None,
)
def test_batches_equal_trl_padding_free(qwen, iterable, kind, options, remove_unused_columns):
    dataset = make_dataset(kind, qwen, iterable=iterable)
    with tempfile.TemporaryDirectory() as tmp:
        expected = batches(SFTTrainer, qwen, dataset, tmp, remove_unused_columns=remove_unused_columns, **options)
        got = batches(FlatSFTTrainer, qwen, dataset, tmp, remove_unused_columns=remove_unused_columns, **options)
    assert_same_batches(got, expected)


def test_completion_only_loss_false_trains_prompts(qwen):
    """Literal check: every token but the first of each sequence is trained, prompt included."""
    dataset = make_dataset("prompt_completion", qwen, iterable=True)
    with tempfile.TemporaryDirectory() as tmp:
        batch = batches(FlatSFTTrainer, qwen, dataset, tmp, completion_only_loss=False, remove_unused_columns=False)[0]
    expected = batch["input_ids"].clone()
    expected[batch["position_ids"] == 0] = -100
    torch.testing.assert_close(batch["labels"], expected, rtol=0, atol=0)


@pytest.mark.slow
@pytest.mark.parametrize("remove_unused_columns", [True, False])
def test_one_step_loss_equals_trl_padding_free(qwen, remove_unused_columns):
    dataset = make_dataset("prompt_completion", qwen, iterable=True)
    losses = {}
    with tempfile.TemporaryDirectory() as tmp:
        for trainer_class in (SFTTrainer, FlatSFTTrainer):
            args = sft_config(tmp, completion_only_loss=False, remove_unused_columns=remove_unused_columns, max_steps=1)
            trainer = trainer_class(model=tiny_causal_lm("llama", vocab_size=len(qwen), seed=0).train(), args=args,
                                    train_dataset=dataset, processing_class=qwen)
            losses[trainer_class.__name__] = trainer.train().training_loss
    assert abs(losses["FlatSFTTrainer"] - losses["SFTTrainer"]) <= 1e-5, losses
