"""`Trainer` on a packed stream of image-text rows (`pack_dataset(IterableDataset)`): with accelerate's dispatcher
off and the packs' `seq_lengths` kept, the step over every pack equals the per-example step; with the dispatcher
(Trainer's default for an `IterableDataset`) the flattened batch is cut on dimension 0 and refused."""

import copy
import tempfile

import pytest
from transformers import Trainer, TrainingArguments

from flatcollate import prepare_model_for_flattening
from flatcollate.data import pack_dataset
from flatcollate.testing.tiny_vision import tiny_vision_examples, tiny_vision_lm
from flatcollate.vision import VisionDataCollatorWithFlattening

from .test_vision_trainers import COMMON, ONE_STEP, GradientsBeforeTheStep, as_dataset, assert_same_step, reference_step

pytestmark = pytest.mark.slow


def stream_step(model, examples, **accelerator_config) -> GradientsBeforeTheStep:
    """One SGD step of `Trainer` over a packed stream of the examples (every pack in one batch)."""
    stream = pack_dataset(as_dataset(examples).with_format(None).to_iterable_dataset(), 512, batch_size=4)
    recorded = GradientsBeforeTheStep()
    with tempfile.TemporaryDirectory() as tmp:
        args = TrainingArguments(
            output_dir=tmp,
            per_device_train_batch_size=4,
            remove_unused_columns=False,  # keeps the packs' `seq_lengths`
            accelerator_config=accelerator_config,
            **ONE_STEP,
            **COMMON,
        )
        collator = VisionDataCollatorWithFlattening.from_model(model)
        Trainer(model, args, train_dataset=stream, data_collator=collator, callbacks=[recorded]).train()
    return recorded


def test_trainer_on_a_packed_stream_without_dispatch_equals_the_per_example_step():
    model = tiny_vision_lm("qwen2_5_vl")
    examples = tiny_vision_examples(model, count=4, seed=1)
    reference = reference_step(model, examples)
    prepared = prepare_model_for_flattening(copy.deepcopy(model))
    assert_same_step(prepared, stream_step(prepared, examples, dispatch_batches=False), reference, "qwen2_5_vl")
    dispatched = prepare_model_for_flattening(copy.deepcopy(model))  # the default: cut on dimension 0, refused
    with pytest.raises(ValueError, match=r"cu_seq_lens_q.*dispatch_batches"):
        stream_step(dispatched, examples)
