"""`fused_loss=True` through the trainers: `transformers.Trainer` with gradient accumulation passes `num_items_in_batch`
to the fused loss, and one optimizer step over four sequences (two micro-batches of two, flattened) is the step of
the token-weighted loss over each sequence alone (`per_sequence`); `FlatSFTTrainer(fused_loss=True)` trains as
without it."""

import tempfile

import datasets
import pytest
import torch
from transformers import Trainer, TrainerCallback, TrainingArguments

from flatcollate import DataCollatorWithFlattening, prepare_model_for_flattening
from flatcollate.check.runs import gradients
from flatcollate.modeling import fused_loss
from flatcollate.modeling.prepared_state import state_of
from flatcollate.testing import tiny_causal_lm

LENGTHS = (5, 1, 9, 4)


class KeepGradients(TrainerCallback):
    """Keeps every parameter's gradient as the optimizer is about to step: the step's accumulated gradient."""

    def __init__(self):
        self.grads = {}

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.grads = gradients(model)


def one_step_gradient(model, sequences, tmp: str) -> dict[str, torch.Tensor]:
    """The gradient of one optimizer step of `Trainer` over two accumulated micro-batches of two sequences (not
    clipped)."""
    args = TrainingArguments(
        output_dir=tmp, per_device_train_batch_size=2, gradient_accumulation_steps=2, max_steps=1, report_to=[],
        use_cpu=True, save_strategy="no", disable_tqdm=True, seed=0, max_grad_norm=0.0,  # no clipping
    )  # fmt: skip
    dataset = datasets.Dataset.from_dict({"input_ids": [ids.tolist() for ids in sequences]})
    kept = KeepGradients()
    collator = DataCollatorWithFlattening()
    Trainer(model=model, args=args, train_dataset=dataset, data_collator=collator, callbacks=[kept]).train()
    return kept.grads


@pytest.fixture
def sequences():
    generator = torch.Generator().manual_seed(0)
    return [torch.randint(0, 256, (n,), generator=generator) for n in LENGTHS]


def test_trainer_accumulation_weighs_tokens(sequences, monkeypatch, per_sequence, assert_exact):
    counts = []
    exact = fused_loss.next_token_loss

    def counted(*args, num_items_in_batch=None, **kwargs):
        counts.append(int(num_items_in_batch))
        return exact(*args, num_items_in_batch=num_items_in_batch, **kwargs)

    monkeypatch.setattr(fused_loss, "next_token_loss", counted)
    model = prepare_model_for_flattening(tiny_causal_lm("llama"), fused_loss=True)
    expected = per_sequence(model, sequences)
    model.zero_grad(set_to_none=True)  # Trainer adds to gradients left on the model
    with tempfile.TemporaryDirectory() as tmp:
        got = one_step_gradient(model, sequences, tmp)
    assert counts == [sum(n - 1 for n in LENGTHS)] * 2  # the whole step's labelled tokens, in both micro-batches
    assert_exact((expected[0], expected[1], got), expected)  # the step's gradient; logits and loss not compared


def test_trainer_step_equals_the_full_loss_step(sequences, assert_relatively_close):
    steps = {}
    for fused in (False, True):
        model = prepare_model_for_flattening(tiny_causal_lm("llama"), fused_loss=fused)
        with tempfile.TemporaryDirectory() as tmp:
            steps[fused] = one_step_gradient(model, sequences, tmp)
    one = torch.tensor(1.0)
    assert_relatively_close((one, steps[True]), (one, steps[False]))


@pytest.mark.slow
def test_flat_sft_trainer_trains_as_without_it(tokenizer_dir):
    from transformers import AutoTokenizer
    from trl import SFTConfig

    from flatcollate.integrations.trl import FlatSFTTrainer
    from flatcollate.synthetic import synthetic_sft_dataset

    gpt2 = AutoTokenizer.from_pretrained(tokenizer_dir("gpt2"))
    dataset = synthetic_sft_dataset(8, vocab_size=len(gpt2), max_tokens=48)
    losses = {}
    for fused in (False, True):
        with tempfile.TemporaryDirectory() as tmp:
            args = SFTConfig(
                output_dir=tmp, per_device_train_batch_size=4, max_steps=2, save_strategy="no", report_to=[],
                use_cpu=True, seed=0, disable_tqdm=True, logging_steps=1, padding_free=True, max_length=None,
            )  # fmt: skip
            model = tiny_causal_lm("llama", vocab_size=len(gpt2))
            trainer = FlatSFTTrainer(
                model=model, args=args, train_dataset=dataset, processing_class=gpt2, fused_loss=fused
            )
            trainer.train()
            losses[fused] = [row["loss"] for row in trainer.state.log_history if "loss" in row]
            assert isinstance(state_of(model).fused_loss, fused_loss.FusedLoss) is fused
    assert len(losses[True]) == 2
    torch.testing.assert_close(torch.tensor(losses[True]), torch.tensor(losses[False]), rtol=1e-6, atol=0)


def test_flat_sft_trainer_refuses_it_without_padding_free():
    from trl import SFTConfig

    from flatcollate.integrations.trl import FlatSFTTrainer

    with tempfile.TemporaryDirectory() as tmp:
        args = SFTConfig(output_dir=tmp, report_to=[], use_cpu=True, padding_free=False)
        with pytest.raises(ValueError, match="fused_loss=True applies to a model FlatSFTTrainer prepares"):
            FlatSFTTrainer(model=tiny_causal_lm("llama"), args=args, fused_loss=True)
