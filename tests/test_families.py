"""The family registry: one record per `model_type`, each saying something, read field by field through a composite
model's language model, and an empty record for a family it does not know."""

import ast
from pathlib import Path

import pytest
from transformers import AutoConfig
from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

from flatcollate.families import FAMILIES, Family, family_of
from flatcollate.vision.counts import RULES

ROOT = Path(__file__).resolve().parents[1]


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
    assert merged.image_tokens == FAMILIES[model_type].image_tokens == ("grid", "vision_config.spatial_merge_size")


def test_a_value_set_on_the_family_is_kept_even_when_falsy():
    """PaliGemma's image blocks are token type 0: set, not empty, so its own value wins."""
    assert family_of(AutoConfig.for_model("paligemma")).block_token_type == 0


def test_a_model_type_reads_only_its_own_record():
    assert family_of("qwen3_5") is FAMILIES["qwen3_5"]
    assert family_of("mamba") is FAMILIES["mamba"]


def test_every_image_rule_is_a_rule_of_counts():
    """A record's `image_tokens` starts with a name of `flatcollate.vision.counts.RULES`."""
    named = {name: record.image_tokens[0] for name, record in FAMILIES.items() if record.image_tokens is not None}
    assert {name: rule for name, rule in named.items() if rule not in RULES} == {}
    assert set(named.values()) == set(RULES)  # no builder without a family


LIBRARY = sorted(
    str(path.relative_to(ROOT))
    for path in (ROOT / "flatcollate").rglob("*.py")
    if path.name != "families.py" and not {"testing", "bench"} & set(path.parts)
)
"""Modules that apply what the records say: all but the records, the tiny test models and the benchmarks' defaults."""


def test_modules_know_records_not_families():
    """What a family does lives in its record: the modules that apply the records name no `model_type`."""
    named = {module: _model_types(ROOT / module) for module in LIBRARY}
    assert {module: names for module, names in named.items() if names} == {}


def _model_types(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    strings = {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)}
    return strings & set(CONFIG_MAPPING_NAMES)
