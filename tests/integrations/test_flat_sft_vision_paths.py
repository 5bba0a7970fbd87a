"""`FlatSFTTrainer` with encoded image-text rows on TRL's own paths (padded batches, `packing_strategy="wrapped"`),
which keep `input_ids` and `labels` and drop the images: refused, naming the configuration that keeps them."""

import tempfile

import pytest

from flatcollate.integrations.trl import FlatSFTTrainer
from flatcollate.testing.tiny_vision import tiny_vision_examples, tiny_vision_lm

from .test_vision_trainers import as_dataset, needed_fields, sft_config, word_tokenizer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def qwen():
    model = tiny_vision_lm("qwen2_5_vl")
    return model, as_dataset(tiny_vision_examples(model, count=4, seed=1))


@pytest.mark.parametrize(
    "config",
    [
        {"padding_free": False},  # the default SFTConfig: padded batches
        {"padding_free": False, "packing": True, "packing_strategy": "wrapped", "max_length": 64},
    ],
    ids=["padded", "wrapped"],
)
def test_trl_paths_that_drop_the_images_are_refused(qwen, config):
    model, dataset = qwen
    with tempfile.TemporaryDirectory() as tmp, pytest.raises(ValueError) as caught:
        FlatSFTTrainer(
            model=model, args=sft_config(tmp, **config), train_dataset=dataset, processing_class=word_tokenizer()
        )
    message = str(caught.value)
    assert "`pixel_values`" in message and "padding_free=True" in message and "packing_strategy='bfd'" in message


def test_the_padding_free_path_keeps_the_images(qwen):
    """The control: the configuration the refusal names collates the images."""
    model, dataset = qwen
    with tempfile.TemporaryDirectory() as tmp:
        trainer = FlatSFTTrainer(
            model=model, args=sft_config(tmp), train_dataset=dataset, processing_class=word_tokenizer()
        )
        batch = next(iter(trainer.get_train_dataloader()))
    assert needed_fields([dataset[0]]) == {"pixel_values", "image_grid_thw", "mm_token_type_ids"}
    assert needed_fields([dataset[0]]) <= set(batch), sorted(batch)
