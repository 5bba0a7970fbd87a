"""`transformers.Trainer` with its DEFAULT arguments keeps what the flattening collator needs.

`TrainingArguments(remove_unused_columns=True)` (the default) removes every dataset column the model's forward does
not name. Packed rows then lose their inner boundaries (`seq_lengths`) and prompts lose their masks, and training
goes on silently wrong. A prepared model names those columns; packed datasets also carry restarting positions.
"""

import tempfile

import datasets
import pytest
import torch
from transformers import Trainer, TrainingArguments

from flatcollate import DataCollatorWithFlattening, pack_dataset, prepare_model_for_flattening
from flatcollate.testing import tiny_causal_lm


class RecordingCollator(DataCollatorWithFlattening):
    """Keeps every batch it makes, so a test can look at what the model was given."""

    def __init__(self):
        super().__init__()
        self.batches = []

    def __call__(self, features, *args, **kwargs):
        batch = super().__call__(features, *args, **kwargs)
        self.batches.append(batch)
        return batch


def train_one_step(dataset, *, remove_unused_columns: bool | None, batch_size: int):
    """One SGD step (lr 1: any change of the gradient shows in the parameters) from the same initial weights."""
    model = prepare_model_for_flattening(tiny_causal_lm("llama", seed=3))
    collator = RecordingCollator()
    options = {} if remove_unused_columns is None else {"remove_unused_columns": remove_unused_columns}
    with tempfile.TemporaryDirectory() as output_dir:
        args = TrainingArguments(
            output_dir=output_dir,
            max_steps=1,
            per_device_train_batch_size=batch_size,
            optim="sgd",
            learning_rate=1.0,
            lr_scheduler_type="constant",
            report_to=[],
            use_cpu=True,
            save_strategy="no",
            **options,
        )
        Trainer(model=model, args=args, train_dataset=dataset, data_collator=collator).train()
    return collator.batches[0], {name: p.detach().clone() for name, p in model.named_parameters()}


def assert_same_training(dataset, batch_size):
    default_batch, default_params = train_one_step(dataset, remove_unused_columns=None, batch_size=batch_size)
    kept_batch, kept_params = train_one_step(dataset, remove_unused_columns=False, batch_size=batch_size)
    for key in ("input_ids", "labels", "position_ids", "cu_seq_lens_q"):
        torch.testing.assert_close(default_batch[key], kept_batch[key], rtol=0, atol=0, msg=key)
    for name, value in kept_params.items():
        torch.testing.assert_close(default_params[name], value, rtol=0, atol=1e-6, msg=name)
    return default_batch


def test_packed_dataset_keeps_its_boundaries_under_trainer_defaults():
    rows = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3, 4], [5, 6, 7], [8, 9]]})
    packed = pack_dataset(rows, 16)
    batch = assert_same_training(packed, batch_size=1)
    assert batch["cu_seq_lens_q"].tolist() == [0, 4, 7, 9]


@pytest.mark.parametrize("mask_key", ["completion_mask", "assistant_masks"])
def test_masks_survive_trainer_defaults(mask_key):
    rows = datasets.Dataset.from_dict(
        {
            "input_ids": [[11, 12, 13, 14, 15], [21, 22, 23], [31, 32, 33, 34]],
            mask_key: [[0, 0, 1, 1, 1], [0, 1, 1], [0, 0, 0, 1]],
        }
    )
    batch = assert_same_training(rows, batch_size=3)
    assert int((batch["labels"] != -100).sum()) == 3 + 2 + 1


def test_a_packed_dataset_with_masks_keeps_both():
    rows = datasets.Dataset.from_dict(
        {"input_ids": [[1, 2, 3, 4], [5, 6, 7], [8, 9]], "completion_mask": [[0, 0, 1, 1], [0, 1, 1], [0, 1]]}
    )
    batch = assert_same_training(pack_dataset(rows, 16), batch_size=1)
    assert batch["cu_seq_lens_q"].tolist() == [0, 4, 7, 9]
    assert batch["labels"].tolist() == [[-100, -100, 3, 4, -100, 6, 7, -100, 9]]
