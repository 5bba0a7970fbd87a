"""What preparing leaves on a model: one `PreparedState` under one attribute, and the features that register with the
guard, which knows only the core."""

import ast
import copy
import re
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForTokenClassification

from flatcollate import DataCollatorWithFlattening, prepare_model_for_flattening
from flatcollate.modeling.prepared_state import Feature, PreparedState, add_feature, state_of
from flatcollate.testing import tiny_causal_lm, tiny_config
from flatcollate.testing.tiny_vision import tiny_vision_lm

ROOT = Path(__file__).parents[2] / "flatcollate"


def feature_names(model) -> list[str]:
    return [feature.name for feature in state_of(model).features]


def test_each_part_registers_its_feature_only_where_the_family_needs_it():
    labels = "labels inside sequences"  # every head that shifts labels
    assert feature_names(prepare_model_for_flattening(tiny_causal_lm("llama"))) == [labels]
    assert feature_names(prepare_model_for_flattening(tiny_causal_lm("mamba"))) == [labels, "state-carrying layers"]
    assert feature_names(prepare_model_for_flattening(tiny_causal_lm("roberta"))) == ["family positions", labels]
    assert feature_names(prepare_model_for_flattening(tiny_vision_lm("qwen2_vl"))) == [labels, "image-text"]
    assert feature_names(prepare_model_for_flattening(tiny_vision_lm("gemma3"))) == [labels, "image-text"]
    classifier = AutoModelForTokenClassification.from_config(tiny_config("llama", num_labels=3))
    assert feature_names(prepare_model_for_flattening(classifier)) == ["masked first labels"]


def test_a_registered_feature_sees_every_forward_and_can_refuse_one():
    model = prepare_model_for_flattening(tiny_causal_lm("llama")).eval()
    seen = []

    def refuse_long_rows(model, arguments, flat):
        seen.append(None if flat is None else flat.boundaries.host)
        if flat is not None and flat.boundaries.max_length > 4:
            raise ValueError("a sequence over 4 tokens")
        return {}

    add_feature(model, Feature("test", changes=refuse_long_rows))
    batch = DataCollatorWithFlattening()([{"input_ids": [1, 2, 3]}, {"input_ids": [4, 5]}])
    with torch.no_grad():
        model(**batch)
        model(input_ids=torch.tensor([[1, 2, 3]]), attention_mask=torch.ones(1, 3, dtype=torch.long))
        with pytest.raises(ValueError, match="over 4 tokens"):
            model(**DataCollatorWithFlattening()([{"input_ids": [1, 2, 3, 4, 5]}, {"input_ids": [6]}]))
    assert seen == [[0, 3, 5], None, [0, 5, 6]]


def test_the_guard_imports_only_the_core():
    tree = ast.parse((ROOT / "modeling" / "guard.py").read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level}
    assert imported <= {
        "_conventions", "attention", "boundaries", "boundary_check", "forward_slot", "prepared_state", "support"
    }


def test_flatcollate_sets_one_attribute_name():
    names = set()
    for path in ROOT.rglob("*.py"):
        names |= set(re.findall(r"\b_flatcollate\w*", path.read_text()))
    assert names == {"_flatcollate"}


def test_the_prepared_state_is_one_object_and_copies_with_the_model():
    model = prepare_model_for_flattening(tiny_causal_lm("mamba"))
    state = state_of(model)
    assert isinstance(state, PreparedState) and state.guard is not None
    assert not [key for key in vars(model) if key.startswith("_flatcollate") and key != "_flatcollate"]
    twin = copy.deepcopy(model)
    assert state_of(twin) is not state
    mixers = [module for module in twin.modules() if type(module).__name__ == "MambaMixer"]
    assert mixers and all(module.forward.args[1] is twin for module in mixers)  # a copy reads its own forwards


def test_boundaries_without_tokens_are_a_clear_error():
    """`cu_seq_lens` with neither `input_ids` nor `inputs_embeds` (nor positions) has no tokens to check them on."""
    model = prepare_model_for_flattening(tiny_causal_lm("llama"))
    cu = torch.tensor([0, 3, 5], dtype=torch.int32)
    with pytest.raises(ValueError, match="`input_ids` or `inputs_embeds`"):
        model(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=3, max_length_k=3)
