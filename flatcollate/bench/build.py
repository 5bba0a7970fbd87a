"""How every benchmark builds its model: random weights from a config, seeded, constructed and initialised on the
device it trains on (a full-size model on a GPU never passes through the host: no CPU initialisation, no copy)."""

import torch
from transformers import PretrainedConfig, PreTrainedModel

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
"""The benchmarks' `--dtype` names."""


def build_on_device(
    auto_class, model_config: PretrainedConfig, *, device: torch.device | str, dtype: str, seed: int
) -> PreTrainedModel:
    """`auto_class.from_config(model_config)` with SDPA in `dtype` (a name of `DTYPES`), its weights drawn after
    `torch.manual_seed(seed)` on `device`, in train mode.

    >>> from transformers import AutoModelForCausalLM
    >>> from flatcollate.models import tiny_config
    >>> model = build_on_device(AutoModelForCausalLM, tiny_config("llama"), device="meta", dtype="float32", seed=0)
    >>> model.model.embed_tokens.weight.device.type, model.training
    ('meta', True)
    """
    torch.manual_seed(seed)
    with torch.device(device):
        model = auto_class.from_config(model_config, attn_implementation="sdpa", dtype=DTYPES[dtype])
    return model.train()
