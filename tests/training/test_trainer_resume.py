"""`Trainer` resumed from a mid-epoch checkpoint with the flattening collator trains exactly the batches, and ends with
exactly the parameters, of the uninterrupted run: the collator holds no state, so `Trainer`'s own skip of the batches
already trained is all a resume needs (as the README's quick start says)."""

import torch
from datasets import Dataset
from transformers import Trainer, TrainingArguments

from flatcollate import DataCollatorWithFlattening, prepare_model_for_flattening
from flatcollate.testing import tiny_causal_lm


class Recording(DataCollatorWithFlattening):
    """The flattening collator, remembering the `input_ids` row of every batch it made."""

    def __init__(self):
        super().__init__()
        self.rows = []

    def __call__(self, features, return_tensors=None):
        batch = super().__call__(features, return_tensors)
        self.rows.append(batch["input_ids"][0].tolist())
        return batch


def _train(output_dir, *, max_steps=None, resume=None, ignore_data_skip=False):
    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 24, (24,), generator=generator).tolist()
    rows = [{"input_ids": torch.randint(0, 256, (n,), generator=generator).tolist()} for n in lengths]
    collator = Recording()
    args = TrainingArguments(
        output_dir=str(output_dir), per_device_train_batch_size=4, num_train_epochs=2, max_steps=max_steps or -1,
        learning_rate=1e-2, optim="sgd", lr_scheduler_type="constant", save_strategy="steps", save_steps=3,
        report_to=[], use_cpu=True, seed=0, data_seed=0, disable_tqdm=True, ignore_data_skip=ignore_data_skip,
    )  # fmt: skip
    model = prepare_model_for_flattening(tiny_causal_lm("llama"))
    trainer = Trainer(model=model, args=args, train_dataset=Dataset.from_list(rows), data_collator=collator)
    trainer.train(resume_from_checkpoint=resume)
    return collator.rows, trainer.model.state_dict()


def test_a_trainer_resumed_mid_epoch_trains_the_uninterrupted_batches(tmp_path):
    whole, whole_params = _train(tmp_path / "whole")  # 12 steps: 6 per epoch, shuffled
    first, _ = _train(tmp_path / "stopped", max_steps=9)  # stops 3 steps into the second epoch, checkpoint-9 saved
    rest, rest_params = _train(tmp_path / "stopped", resume=str(tmp_path / "stopped" / "checkpoint-9"))
    assert len(whole) == 12 and first[:9] == whole[:9]  # the loader collates one batch ahead of the step
    assert rest == whole[9:]
    checkpoint = str(tmp_path / "stopped" / "checkpoint-9")
    replayed, _ = _train(tmp_path / "stopped", resume=checkpoint, ignore_data_skip=True)  # the control: no skip
    assert replayed[:3] != whole[9:]
    for name, value in whole_params.items():
        torch.testing.assert_close(rest_params[name], value, rtol=0, atol=1e-6, msg=name)
