"""Tiny configs: shrunk (or grown) copies of real configs keep every per-layer list as long as the model is deep, so
the models they build save and load back."""

import re

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, Qwen2Config, Qwen3MoeConfig

from flatcollate.testing import tiny_causal_lm, tiny_config
from flatcollate.testing.tiny_text import apply_overrides, check_overrides, load_config

REAL_CONFIGS = ["qwen2.5-7b", "llama-3.2-3b", "mistral-7b-instruct-v0.2"]
"""Folders of `../shared/data/configs` (architecture only, real sizes)."""

MIXED = ["full_attention", "sliding_attention", "sliding_attention", "full_attention", "full_attention"]
MIXED += ["sliding_attention"]
"""A six-layer pattern whose prefixes and repeats are told apart."""


def _config_folder(shared_data, name):
    folder = shared_data / "configs" / name
    if not (folder / "config.json").is_file():
        pytest.skip(f"config {name} not in {shared_data}")
    return folder


def _layer_types(config) -> list[str] | None:
    return getattr(config, "layer_types", None)  # Llama and Mistral configs have none


def _saves_and_reloads(model, path) -> None:
    model.save_pretrained(path)
    reloaded = AutoModelForCausalLM.from_pretrained(path)
    assert reloaded.config.num_hidden_layers == model.config.num_hidden_layers
    assert _layer_types(reloaded.config) == _layer_types(model.config)


@pytest.mark.parametrize("layers", [None, 1, 3, 30], ids=["tiny", "1-layer", "3-layers", "30-layers"])
@pytest.mark.parametrize("name", REAL_CONFIGS)
def test_shrunk_real_config_builds_saves_and_reloads(shared_data, tmp_path, name, layers):
    overrides = {} if layers is None else {"num_hidden_layers": layers}
    model = tiny_causal_lm(_config_folder(shared_data, name), **overrides)
    depth = layers or 2
    assert model.config.num_hidden_layers == depth == len(model.model.layers)
    assert _layer_types(model.config) is None or len(model.config.layer_types) == depth
    _saves_and_reloads(model, tmp_path)


@pytest.mark.parametrize("name", REAL_CONFIGS)
def test_full_size_config_with_fewer_layers_saves_and_reloads(shared_data, tmp_path, name):
    # `flatcollate bench --full-size --set num_hidden_layers=2`: the config keeps its sizes, only the depth changes.
    config = apply_overrides(AutoConfig.from_pretrained(_config_folder(shared_data, name)), num_hidden_layers=2)
    assert config.num_hidden_layers == 2 and (_layer_types(config) is None or len(config.layer_types) == 2)
    config.save_pretrained(tmp_path)
    assert _layer_types(AutoConfig.from_pretrained(tmp_path)) == _layer_types(config)


def test_per_layer_lists_follow_the_depth_of_a_config_built_in_code(tmp_path):
    config = Qwen2Config(num_hidden_layers=6, layer_types=MIXED, use_sliding_window=True, sliding_window=8)
    assert tiny_config(config).layer_types == MIXED[:2]
    assert tiny_config(config, num_hidden_layers=4).layer_types == MIXED[:4]
    assert tiny_config(config, num_hidden_layers=9).layer_types == MIXED + MIXED[:3]  # repeated from the start
    model = tiny_causal_lm(config, num_hidden_layers=3)
    assert model.config.layer_types == MIXED[:3]
    _saves_and_reloads(model, tmp_path)


def test_a_depth_set_on_the_config_object_is_fitted_too():
    config = Qwen2Config(num_hidden_layers=6, layer_types=MIXED, use_sliding_window=True, sliding_window=8)
    config.num_hidden_layers = 3  # the per-layer lists are still six long: the object no longer validates
    assert tiny_config(config).layer_types == MIXED[:2]
    assert apply_overrides(config).layer_types == MIXED[:3]


def test_layer_index_lists_keep_the_layers_that_remain():
    config = Qwen3MoeConfig(num_hidden_layers=6, mlp_only_layers=[1, 4])
    assert tiny_config(config).mlp_only_layers == [1]
    assert tiny_config(config, num_hidden_layers=5).mlp_only_layers == [1, 4]


def test_lists_that_are_not_per_layer_are_kept():
    config = Qwen2Config(num_hidden_layers=2, eos_token_id=[5, 6])
    assert tiny_config(config, num_hidden_layers=3).eos_token_id == [5, 6]


def _llama(**overrides):
    return apply_overrides(AutoConfig.for_model("llama", num_attention_heads=8, num_key_value_heads=2), **overrides)


@pytest.mark.parametrize("build", [tiny_config, _llama], ids=["tiny_config", "apply_overrides"])
@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"hidden_size": 0}, "hidden_size=0: hidden_size is a positive integer"),
        ({"num_hidden_layers": 1.5}, "num_hidden_layers=1.5: num_hidden_layers is a positive integer"),
        ({"num_attention_heads": 3}, "num_attention_heads=3 is not a multiple of num_key_value_heads=2"),
    ],
)
def test_sizes_a_model_cannot_be_built_with_are_refused_naming_the_attribute(build, overrides, fragment):
    args = ("llama",) if build is tiny_config else ()
    with pytest.raises(ValueError, match=re.escape(fragment)):
        build(*args, **overrides)


def test_a_hidden_size_the_heads_do_not_divide_is_refused_where_it_sets_the_head_size():
    with pytest.raises(ValueError, match=re.escape("hidden_size=66 is not a multiple of num_attention_heads=8")):
        apply_overrides(AutoConfig.for_model("gpt2", n_head=8), hidden_size=66)  # gpt2 derives its head size
    assert _llama(head_dim=11, hidden_size=66).hidden_size == 66  # llama's head size is its own: no constraint
    assert tiny_config("mamba", hidden_size=66).hidden_size == 66  # a family without attention heads: nothing to divide


def test_check_overrides_refuses_a_name_the_config_lacks_where_tiny_config_takes_it():
    message = "hidden_sise: the llama config has no attribute 'hidden_sise'; did you mean hidden_size?"
    with pytest.raises(ValueError, match=re.escape(message)):
        check_overrides(load_config("llama"), {"hidden_sise": 64})
    with pytest.raises(ValueError, match="hidden_size=0"):
        check_overrides(load_config("llama"), {"hidden_size": 0})
    check_overrides(load_config("llama"), {"hidden_size": 64, "num_labels": 1})  # a property counts
    # as transformers' own configs do, tiny_config takes an attribute the model reads where it is set
    assert tiny_config("modernbert", is_decoder=False).is_decoder is False


def test_overrides_of_attributes_a_config_has_are_taken():
    config = tiny_config("llama", hidden_size=96, num_attention_heads=6, num_key_value_heads=3, num_labels=1)
    assert (config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.num_labels) == (
        96,
        6,
        3,
        1,
    )
    assert apply_overrides(AutoConfig.for_model("gpt2"), hidden_size=96).n_embd == 96  # through the attribute map
    assert tiny_config("llama", rope_scaling=None).rope_scaling is None  # None is not a size


@pytest.mark.parametrize("model_type", ["zamba", "zamba2"])
def test_a_hybrid_with_a_shared_attention_block_builds_at_another_hidden_size(model_type):
    """The shared block's sizes follow the hidden size given (their configs derive them once, when built)."""
    model = tiny_causal_lm(model_type, hidden_size=128)
    logits = model(input_ids=torch.arange(8)[None]).logits
    assert logits.shape == (1, 8, model.config.vocab_size)
    assert model.config.attention_hidden_size == 256
