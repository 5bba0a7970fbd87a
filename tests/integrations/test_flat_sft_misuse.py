"""Misused TRL glue points to the working call: `padding_free=True` on `FlatSFTTrainer`, not a collator on TRL's.

`trl.SFTTrainer(args=SFTConfig(padding_free=True), data_collator=...)` raises TRL's "custom data collator is not
supported"; flatcollate cannot change that message, so these tests show that `FlatSFTTrainer` takes the same call.
`FlatSFTTrainer` without padding-free is plain `SFTTrainer` (padded batches, model not prepared): it warns, and
refuses a flattening collator it would otherwise pass on to a padded setup.
"""

import tempfile
import warnings

import pytest
from transformers import AutoTokenizer
from trl import SFTConfig, SFTTrainer

from flatcollate import DataCollatorWithFlattening
from flatcollate.collate import DataCollatorForCompletionOnlyLM
from flatcollate.integrations.trl import FlatSFTTrainer
from flatcollate.synthetic import synthetic_sft_dataset
from flatcollate.testing import tiny_causal_lm


@pytest.fixture(scope="module")
def gpt2(tokenizer_dir):
    return AutoTokenizer.from_pretrained(tokenizer_dir("gpt2"))


@pytest.fixture(scope="module")
def dataset(gpt2):
    return synthetic_sft_dataset(6, vocab_size=len(gpt2), max_tokens=32)


def build(cls, gpt2, dataset, tmp, collator=None, **options):
    args = SFTConfig(output_dir=tmp, report_to=[], use_cpu=True, bf16=False, per_device_train_batch_size=2, **options)
    kwargs = {} if collator is None else {"data_collator": collator}
    return cls(model=tiny_causal_lm("llama", vocab_size=len(gpt2)), args=args, train_dataset=dataset,
               processing_class=gpt2, **kwargs)


def test_sft_trainer_refuses_a_collator_with_padding_free_and_flat_sft_trainer_takes_the_same_call(gpt2, dataset):
    collator = DataCollatorWithFlattening()
    with tempfile.TemporaryDirectory() as tmp:
        with pytest.raises(ValueError, match="custom data collator is not supported"):
            build(SFTTrainer, gpt2, dataset, tmp, collator, padding_free=True, max_length=None)
        trainer = build(FlatSFTTrainer, gpt2, dataset, tmp, collator, padding_free=True, max_length=None)
    assert trainer.data_collator is collator
    assert trainer.model.config._attn_implementation == "flatcollate"


@pytest.mark.parametrize(
    "collator",
    [DataCollatorWithFlattening(), DataCollatorForCompletionOnlyLM(response_template=[9, 9])],
    ids=["flattening", "completion_only"],
)
def test_flattening_collator_without_padding_free_raises_naming_the_option(gpt2, dataset, collator):
    with tempfile.TemporaryDirectory() as tmp, pytest.raises(ValueError, match=r"SFTConfig\(padding_free=True"):
        build(FlatSFTTrainer, gpt2, dataset, tmp, collator)


def test_flat_sft_trainer_without_padding_free_warns_that_it_pads(gpt2, dataset):
    with tempfile.TemporaryDirectory() as tmp:
        with pytest.warns(UserWarning, match=r"without padding_free=True .* padded batches"):
            trainer = build(FlatSFTTrainer, gpt2, dataset, tmp)
        assert not isinstance(trainer.data_collator, DataCollatorWithFlattening)
        with warnings.catch_warnings():  # the padding-free call is silent
            warnings.filterwarnings("error", message=".*padding_free=True.*")
            build(FlatSFTTrainer, gpt2, dataset, tmp, padding_free=True, max_length=None)
