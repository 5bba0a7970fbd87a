"""Gradient accumulation over flattened image-text batches weighs tokens: with `Trainer` (and `FlatSFTTrainer`) at
one example per micro-batch and four micro-batches per step, the step equals the per-example token-weighted step.
Qwen2.5-VL and GLM-4V set `accepts_loss_kwargs = False` on their class; unprepared, the step weighs micro-batches."""

import copy
import tempfile

import pytest
from transformers import Trainer, TrainingArguments

from flatcollate import prepare_model_for_flattening
from flatcollate.integrations.trl import FlatSFTTrainer
from flatcollate.testing.tiny_vision import tiny_vision_examples, tiny_vision_lm
from flatcollate.vision import VisionDataCollatorWithFlattening

from .test_vision_trainers import (
    COMMON,
    ONE_STEP,
    GradientsBeforeTheStep,
    as_dataset,
    assert_same_step,
    reference_step,
    sft_config,
    word_tokenizer,
)

pytestmark = pytest.mark.slow

ACCUMULATED = {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 4}


def accumulated_step(model, examples, *, accepts: bool | None = None) -> GradientsBeforeTheStep:
    """One optimizer step of `Trainer` over the examples, one per micro-batch; `accepts` overrides the prepared
    model's `accepts_loss_kwargs` (the negative control sets the class's `False` back)."""
    if accepts is not None:
        model.accepts_loss_kwargs = accepts
    recorded = GradientsBeforeTheStep()
    collator = VisionDataCollatorWithFlattening.from_model(model)
    with tempfile.TemporaryDirectory() as tmp:
        args = TrainingArguments(output_dir=tmp, **ACCUMULATED, **ONE_STEP, **COMMON)
        Trainer(model, args, train_dataset=as_dataset(examples), data_collator=collator, callbacks=[recorded]).train()
    return recorded


@pytest.mark.parametrize("family", ["qwen2_5_vl", "glm4v", "gemma3"])
def test_trainer_accumulation_weighs_tokens(family):
    model = tiny_vision_lm(family)
    examples = tiny_vision_examples(model, count=4, seed=1)  # 1, 2, 0, 1 images; labelled tokens differ
    reference = reference_step(model, examples)
    prepared = prepare_model_for_flattening(copy.deepcopy(model))
    assert_same_step(prepared, accumulated_step(prepared, examples), reference, family)
    if getattr(type(model), "accepts_loss_kwargs", None) is False:  # control: the class's own setting weighs batches
        control = prepare_model_for_flattening(copy.deepcopy(model))
        with pytest.raises(AssertionError, match="differs from the per-example reference"):
            assert_same_step(control, accumulated_step(control, examples, accepts=False), reference, family)


def test_flat_sft_trainer_accumulation_weighs_tokens():
    model = tiny_vision_lm("qwen2_5_vl")
    examples = tiny_vision_examples(model, count=4, seed=1)
    reference = reference_step(model, examples)
    recorded = GradientsBeforeTheStep()
    with tempfile.TemporaryDirectory() as tmp:
        trainer = FlatSFTTrainer(
            model=model,
            args=sft_config(tmp, **ACCUMULATED),
            train_dataset=as_dataset(examples),
            processing_class=word_tokenizer(),
            callbacks=[recorded],
        )
        trainer.train()
    assert trainer.state.global_step == 1
    assert_same_step(model, recorded, reference, "qwen2_5_vl")


def test_a_forward_that_keeps_the_count_from_its_loss_raises():
    """`accept_loss_kwargs` checks the fact it relies on: a forward that takes `num_items_in_batch` without handing it
    to its loss would make the loss a micro-batch mean again. The unchanged forward (the control) divides by it."""
    model = prepare_model_for_flattening(tiny_vision_lm("qwen2_5_vl"))
    (example,) = tiny_vision_examples(model, count=1, seed=0, images=(0,))
    ids, labels = example["input_ids"][None], example["labels"][None]
    mean = model(input_ids=ids, labels=labels, use_cache=False).loss
    summed = model(input_ids=ids, labels=labels, use_cache=False, num_items_in_batch=1).loss
    assert abs(summed.item() - mean.item() * int((labels[0, 1:] != -100).sum())) < 1e-4
    forward = model.forward
    model.forward = lambda *args, num_items_in_batch=None, **kwargs: forward(*args, **kwargs)
    with pytest.raises(ValueError, match=r"took `num_items_in_batch` but its loss did not receive it"):
        model(input_ids=ids, labels=labels, use_cache=False, num_items_in_batch=1)
