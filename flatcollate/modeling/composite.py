"""Vision-language models are composite: a language model that takes flattened rows, and vision towers that must not.

`prepare_model_for_flattening` selects the packed backend for the language model only (`attn_implementation` per
sub-config): a vision tower attends bidirectionally within each image, which the causal packed backend refuses, and
keeps its own backend. The forward's keyword arguments travel down to the vision tower in several families
(Qwen2-VL passes them to `get_image_features`), so the text row's boundaries would reach it too; a pre-hook on each
vision tower removes them. Each tower then runs per image, as it does for a padded batch.
"""

import torch
from transformers import PretrainedConfig, PreTrainedModel

from .._conventions import BOUNDARIES_KEY, FLASH_KWARG_KEYS, HOST_BOUNDARIES_KEY, SP_CONTEXT_KEY
from ..attention.bidirectional_blocks import BLOCKS_KEY

TEXT_ROW_KEYS = (*FLASH_KWARG_KEYS, "seq_idx", BLOCKS_KEY, BOUNDARIES_KEY, HOST_BOUNDARIES_KEY, SP_CONTEXT_KEY)
"""Arguments that describe the flattened text row; a vision tower never receives them."""



def text_config_key(config: PretrainedConfig) -> str | None:
    """Name of the sub-config that holds the language model (`"text_config"`), or None for a text-only model."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if text is config:
        return None
    for key in getattr(config, "sub_configs", {}):
        if getattr(config, key, None) is text:
            return key
    return None


def per_sub_config(model: PreTrainedModel, attn_implementation: str) -> str | dict:
    """What to pass to `set_attn_implementation`: the backend for the language model only, on a composite model.

    >>> from flatcollate.testing import tiny_causal_lm
    >>> per_sub_config(tiny_causal_lm("llama"), "flatcollate")
    'flatcollate'
    """
    key = text_config_key(model.config)
    return attn_implementation if key is None else {key: attn_implementation}


def vision_towers(model: PreTrainedModel) -> list[torch.nn.Module]:
    """The outermost submodules whose config is one of the model's non-text sub-configs (vision, audio towers)."""
    config = model.config
    text_key = text_config_key(config)
    if text_key is None:
        return []
    others = [getattr(config, key) for key in config.sub_configs if key != text_key and getattr(config, key, None)]
    others = [sub for sub in others if isinstance(sub, PretrainedConfig)]
    towers, inside = [], set()
    for name, module in model.named_modules():
        if any(name.startswith(prefix) for prefix in inside):
            continue
        if any(getattr(module, "config", None) is sub for sub in others) and module is not model:
            towers.append(module)
            inside.add(name + ".")
    return towers


def _drop_text_row_keys(module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    return args, {key: value for key, value in kwargs.items() if key not in TEXT_ROW_KEYS}


def isolate_vision_towers(model: PreTrainedModel) -> int:
    """Keep the text row's boundaries out of every vision tower (idempotent); returns how many towers it found."""
    towers = vision_towers(model)
    for tower in towers:
        if _drop_text_row_keys not in tower._forward_pre_hooks.values():
            tower.register_forward_pre_hook(_drop_text_row_keys, with_kwargs=True)
    return len(towers)
