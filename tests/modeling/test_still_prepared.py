"""A prepared model cannot be un-prepared or re-routed without an error at its next flattened forward, and preparing
one model never changes another that shares its config object (`from_config(cfg)` twice shares `cfg`)."""

import copy
import itertools
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM

from flatcollate import DataCollatorWithFlattening, prepare_model_for_flattening
from flatcollate.testing import tiny_causal_lm, tiny_config


def _batch(vocab: int = 200):
    generator = torch.Generator().manual_seed(0)
    features = [{"input_ids": torch.randint(3, vocab, (n,), generator=generator).tolist()} for n in (9, 1, 6)]
    return DataCollatorWithFlattening()(features)


def _gap_to_alone(model, batch) -> float:
    flat = model(**batch).logits
    bounds = itertools.pairwise(batch["cu_seq_lens_q"].tolist())
    alone = torch.cat([model(input_ids=batch["input_ids"][:, a:b], use_cache=False).logits for a, b in bounds], dim=1)
    return (flat - alone).abs().max().item()


@pytest.mark.parametrize("model_type", ["opt", "biogpt", "llama"])
def test_a_backend_switch_after_prepare_is_refused_at_the_next_flattened_forward(model_type):
    model = prepare_model_for_flattening(tiny_causal_lm(model_type))
    batch = _batch()
    with torch.no_grad():
        assert _gap_to_alone(model, batch) <= 1e-5
        model.set_attn_implementation("sdpa")
        with pytest.raises(ValueError, match=r"(?s)'flatcollate'.*'sdpa'.*prepare_model_for_flattening"):
            model(**batch)
        model(input_ids=batch["input_ids"][:, :9])  # an ordinary row still runs
        prepare_model_for_flattening(model)  # preparing again puts it back
        assert _gap_to_alone(model, batch) <= 1e-5


def test_unpatched_mask_builders_are_refused():
    model = prepare_model_for_flattening(tiny_causal_lm("opt"), attn_implementation=None)  # keeps sdpa, patches masks
    batch = _batch()
    module = sys.modules[type(model).__module__]
    patched = module.create_causal_mask
    with torch.no_grad():
        assert _gap_to_alone(model, batch) <= 1e-5
        try:
            module.create_causal_mask = patched.__wrapped__
            with pytest.raises(ValueError, match="create_causal_mask"):
                model(**batch)
        finally:
            module.create_causal_mask = patched


@pytest.mark.parametrize("model_type", ["opt", "jamba"])
def test_preparing_a_model_leaves_its_config_twin_alone(model_type):
    config = tiny_config(model_type)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model, twin = (AutoModelForCausalLM.from_config(config).eval() for _ in range(2))
    assert model.config is twin.config  # what transformers does
    prepare_model_for_flattening(model)
    assert twin.config._attn_implementation == "eager" and model.config._attn_implementation == "flatcollate"
    assert all(getattr(m, "config", model.config) is not config for m in model.modules())  # every layer reads the copy
    twin.set_attn_implementation("sdpa")  # a switch on the twin does not re-route the prepared model
    batch = _batch(vocab=config.vocab_size)
    with torch.no_grad():
        assert _gap_to_alone(model, batch) <= 1e-5


def _unguarded_gap(model, batch) -> float:
    """`_gap_to_alone` with the flattened row run by the model's class forward, past the guard."""
    flat = type(model).forward(model, **batch).logits
    bounds = itertools.pairwise(batch["cu_seq_lens_q"].tolist())
    alone = torch.cat([model(input_ids=batch["input_ids"][:, a:b], use_cache=False).logits for a, b in bounds], dim=1)
    return (flat - alone).abs().max().item()


def _own_sdpa_config(model):
    """Give the second layer's attention a config of its own on `sdpa`."""
    attention = model.model.layers[1].self_attn
    attention.config = copy.deepcopy(model.config)
    attention.config._attn_implementation = "sdpa"
    return "model.layers.1.self_attn"


def _appended_layer(model):
    """Depth up-scaling: a decoder layer of an unprepared model (on `sdpa`) appended to the prepared one."""
    donor = tiny_causal_lm(model.config.model_type, seed=1)
    layer = donor.model.layers[0]
    layer.self_attn.layer_idx = len(model.model.layers)
    model.model.layers.append(layer)
    model.config.num_hidden_layers += 1
    if getattr(model.config, "layer_types", None) is not None:
        model.config.layer_types.append(model.config.layer_types[-1])
    return f"model.layers.{len(model.model.layers) - 1}.self_attn"


@pytest.mark.parametrize("change", [_own_sdpa_config, _appended_layer], ids=["own_config", "appended_layer"])
@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
def test_a_layer_on_another_backend_is_refused_and_preparing_again_makes_it_exact(model_type, change):
    """Negative control: the changed model run past the guard mixes its sequences (the layer on `sdpa` gets no mask
    from the packed backend's mask function and attends over the whole row)."""
    model = prepare_model_for_flattening(tiny_causal_lm(model_type))
    batch = _batch()
    layer = change(model)
    with torch.no_grad():
        assert _unguarded_gap(model, batch) > 1e-2
        with pytest.raises(ValueError, match=rf"(?s)'flatcollate'.*{layer} \('sdpa'\).*prepare_model_for_flattening"):
            model(**batch)
        model(input_ids=batch["input_ids"][:, :9])  # an ordinary row still runs
        prepare_model_for_flattening(model)
        assert _gap_to_alone(model, batch) <= 1e-5
