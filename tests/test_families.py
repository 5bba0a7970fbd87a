"""The family registry: one record per `model_type`, each saying something, read field by field through a composite
model's language model, and an empty record for a family it does not know."""

import pytest
from transformers import AutoConfig

from flatcollate.families import FAMILIES, Family, family_of


def test_every_record_says_something():
    assert [name for name, record in FAMILIES.items() if record == Family()] == []


def test_an_unknown_family_gets_the_empty_record():
    assert family_of("llama") == Family()
    assert family_of(AutoConfig.for_model("llama")) == Family()


@pytest.mark.parametrize(("model_type", "text_type"), [("qwen3_5", "qwen3_5_text"), ("lfm3_vl", "lfm3")])
def test_a_composite_config_takes_its_language_models_mixers(model_type, text_type):
    """The image-text record has its own vision fields and none of its own mixers; the config reads both."""
    config = AutoConfig.for_model(model_type)
    assert config.get_text_config().model_type == text_type
    assert family_of(model_type).mixers == ()
    merged = family_of(config)
    assert merged.mixers == FAMILIES[text_type].mixers != ()
    assert merged.spatial_merge == FAMILIES[model_type].spatial_merge == "spatial_merge_size"


def test_a_value_set_on_the_family_is_kept_even_when_falsy():
    """PaliGemma's image blocks are token type 0: set, not empty, so its own value wins."""
    assert family_of(AutoConfig.for_model("paligemma")).block_token_type == 0


def test_a_model_type_reads_only_its_own_record():
    assert family_of("qwen3_5") is FAMILIES["qwen3_5"]
    assert family_of("mamba") is FAMILIES["mamba"]
