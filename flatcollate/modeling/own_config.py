"""Preparing a model changes its config (`_attn_implementation`), and transformers lets models share one config object
(`AutoModelForCausalLM.from_config(cfg)` twice gives two models with `cfg`): the twin would then read `flatcollate`
without being prepared. `own_config` gives the model a copy first, so preparing it changes no other model.
"""

import copy

import torch
from transformers import PretrainedConfig


def _configs_in(config: PretrainedConfig) -> list[PretrainedConfig]:
    """`config` and every config nested in it (sub-configs of composite models), depth first."""
    nested = [v for v in vars(config).values() if isinstance(v, PretrainedConfig)]
    return [config, *(inner for value in nested for inner in _configs_in(value))]


def own_config(model: torch.nn.Module, *holders: torch.nn.Module) -> None:
    """Give `model` a deep copy of its config, rebinding every reference to the old one (or one of its sub-configs)
    held by `model`'s modules and by `holders` (a PEFT wrapper's modules).

    >>> from transformers import AutoModelForCausalLM
    >>> from flatcollate.testing import tiny_config
    >>> config = tiny_config("llama")
    >>> model = AutoModelForCausalLM.from_config(config)
    >>> own_config(model)
    >>> model.config is config, model.model.layers[0].self_attn.config is model.config
    (False, True)
    """
    old = model.config
    new = copy.deepcopy(old)
    replacement = {id(a): b for a, b in zip(_configs_in(old), _configs_in(new), strict=True)}
    for holder in (model, *holders):
        for module in holder.modules():
            for name, value in vars(module).items():
                if isinstance(value, PretrainedConfig) and id(value) in replacement:
                    vars(module)[name] = replacement[id(value)]


def own_layer_configs(model: torch.nn.Module, backend: str) -> int:
    """Give every module whose own language-model config is not `model`'s and runs another backend than `backend` (a
    decoder layer taken from another model, or given a config of its own) a deep copy of that config on `backend`;
    modules that shared one foreign config share its copy. The model the layer came from keeps its config.

    Returns:
        `int`: how many configs were copied.

    >>> from flatcollate.testing import tiny_causal_lm
    >>> model, donor = tiny_causal_lm("llama", attn_implementation="eager"), tiny_causal_lm("llama")
    >>> _ = model.model.layers.append(donor.model.layers[0])
    >>> own_layer_configs(model, "eager"), model.model.layers[2].self_attn.config._attn_implementation
    (1, 'eager')
    >>> donor.config._attn_implementation
    'sdpa'
    """
    text_config = type(model.config.get_text_config())
    copies = {}
    for module in model.modules():
        config = vars(module).get("config")
        if isinstance(config, text_config) and config._attn_implementation != backend:
            if id(config) not in copies:
                copies[id(config)] = copy.deepcopy(config)
                copies[id(config)]._attn_implementation = backend
            vars(module)["config"] = copies[id(config)]
    return len(copies)
