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
