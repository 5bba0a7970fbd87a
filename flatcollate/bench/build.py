"""How every benchmark builds its model: the config (a tiny one or the model's own sizes, with overrides), random
weights from the seed, constructed and initialised on the device it trains on (a full-size model on a GPU never passes
through the host: no CPU initialisation, no copy), and the summary the report prints."""

import torch
from transformers import PretrainedConfig, PreTrainedModel

from ..testing.tiny_text import apply_overrides, check_overrides, load_config, sdpa_or_eager, tiny_config
from .config import CPU_MODEL

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
"""The benchmarks' `--dtype` names."""


def model_config(config) -> PretrainedConfig:
    """The model config of a benchmark config (`model`, `tiny`, `model_overrides`): the tiny one with the overrides, or
    the config's own sizes with them; no KV cache. A default size of `CPU_MODEL` the family does not define is left
    out (as `tiny_config` leaves out its own); `ValueError` names an override the config lacks or cannot take
    (`flatcollate.testing.tiny_text.check_overrides`)."""
    base, given = load_config(config.model), config.model_overrides
    absent = {key for key, value in CPU_MODEL.items() if not hasattr(base, key) and given.get(key) == value}
    overrides = {key: value for key, value in given.items() if key not in absent}
    check_overrides(base, overrides)
    # per-layer lists follow a new num_hidden_layers in both
    built = tiny_config(config.model, **overrides) if config.tiny else apply_overrides(base, **overrides)
    built.use_cache = False
    return built


def build_on_device(
    auto_class, model_config: PretrainedConfig, *, device: torch.device | str, dtype: str, seed: int
) -> PreTrainedModel:
    """`auto_class.from_config(model_config)` with SDPA (eager where the family has none) in `dtype` (a name of
    `DTYPES`), its weights drawn after `torch.manual_seed(seed)` on `device`, in train mode.

    >>> from transformers import AutoModelForCausalLM
    >>> model = build_on_device(AutoModelForCausalLM, tiny_config("llama"), device="meta", dtype="float32", seed=0)
    >>> model.model.embed_tokens.weight.device.type, model.training
    ('meta', True)
    """
    torch.manual_seed(seed)
    with torch.device(device):
        attention = sdpa_or_eager(auto_class._model_mapping[type(model_config)])
        model = auto_class.from_config(model_config, attn_implementation=attention, dtype=DTYPES[dtype])
    return model.train()


def model_summary(model: PreTrainedModel) -> dict:
    """Type, parameter count and the text model's sizes, for the report; an image-text model adds its vision tower's
    parameters, width and depth."""
    text = model.config.get_text_config()
    sizes = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "vocab_size")
    summary = {
        "model_type": model.config.model_type,
        "parameters": sum(p.numel() for p in model.parameters()),
        **{name: getattr(text, name, None) for name in sizes},
    }
    vision = getattr(model.config, "vision_config", None)
    if vision is not None:
        summary["vision_parameters"] = sum(p.numel() for p in model.model.visual.parameters())
        summary["vision_hidden_size"] = vision.hidden_size
        summary["vision_layers"] = vision.depth
    return summary
