"""What the benchmarks measure, as plain data: the modes, the default CPU model, `ThroughputConfig`, and the names of
the length profiles (`flatcollate.profiles.names`). Nothing here imports torch or transformers, so `flatcollate bench
--help` builds its options from these defaults at once.
"""

from dataclasses import dataclass, field

MODES = ("padded", "padded_max", "hf_flattened", "flattened", "packed")
"""Benchmark modes, in the order they are reported."""

PEER_MODE = "hf_flattened"
"""transformers' own padding-free path: its `DataCollatorWithFlattening` and the model's `sdpa`, no flatcollate."""

MAX_IMAGES = 3
"""Images per example of the vision profile are uniform on `0..MAX_IMAGES` by default."""


CPU_MODEL = {
    "hidden_size": 128,
    "intermediate_size": 344,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "vocab_size": 2048,
    "max_position_embeddings": 8192,
}
"""Default model sizes: small enough for a 2-core CPU, large enough that matrix products dominate Python overhead."""

DEFAULT_MODES = tuple(mode for mode in MODES if mode != "padded_max")
"""Modes measured unless asked otherwise: padding to `max_length` costs more than all the others together."""


@dataclass(frozen=True)
class ThroughputConfig:
    """What to measure.

    Args:
        model (`str`): a `model_type` (`"llama"`, `"qwen2"`) or a folder with a `config.json`.
        tiny (`bool`): shrink the config with `flatcollate.models.tiny_config` and apply `model_overrides`; `False`
            keeps the config's own sizes (with `model_overrides` applied), e.g. a 0.5B Qwen shape on a GPU.
        model_overrides (`dict`): config attributes to set.
        profile (`str`): a named length profile or a path (see `flatcollate.profiles.load_profile`).
        batch_size (`int`): sequences per optimizer step in `padded`, `padded_max` and `flattened`.
        max_length (`int`): longer sequences are truncated to it (counted in the results); `padded_max` pads to it.
        steps (`int`): optimizer steps of one timed pass in the batch modes; `packed` trains on the same sequences.
        warmup_steps (`int`): untimed steps before every timed pass.
        repeats (`int`): timed passes per mode.
        modes (`tuple[str, ...]`): subset of `MODES`; by default all but `padded_max`, the slowest by far.
        pack_len (`int`, *optional*): tokens per pack in `packed`; default `default_pack_len`.
        flattened_attn (`str`): attention of the flattened modes; `"auto"` is the `flatcollate` packed backend.
        lr (`float`): AdamW learning rate.
        seed (`int`): seeds the lengths, the token ids and the initial weights.
        device (`str`): `"auto"` (CUDA when available), `"cpu"` or `"cuda"`.
        dtype (`str`): `"float32"` or `"bfloat16"`.
        threads (`int`, *optional*): CPU threads for torch during the run (`torch.set_num_threads`, restored
            afterwards). Default: 1 on a CPU, where more threads on a machine shared with other work spin waiting for
            a descheduled sibling and distort the timings; unchanged on a GPU.
    """

    model: str = "llama"
    tiny: bool = True
    model_overrides: dict = field(default_factory=lambda: dict(CPU_MODEL))
    profile: str = "flan"
    batch_size: int = 8
    max_length: int = 1024
    steps: int = 8
    warmup_steps: int = 1
    repeats: int = 5
    modes: tuple[str, ...] = DEFAULT_MODES
    pack_len: int | None = None
    flattened_attn: str = "auto"
    lr: float = 1e-4
    seed: int = 0
    device: str = "auto"
    dtype: str = "float32"
    threads: int | None = None


DPO_MODES = ("padded", "flattened")
"""`flatcollate bench --task dpo`: `trl.DPOTrainer` on padded batches, `FlatDPOTrainer` on flattened rows."""


@dataclass(frozen=True)
class DPOBenchConfig:
    """What the DPO benchmark measures (`flatcollate.bench.dpo`).

    Args:
        model (`str`), tiny (`bool`), model_overrides (`dict`): the model, as in `ThroughputConfig`.
        profile (`str`): a pair profile (`available_pair_profiles()`) or a JSON file written by `PairProfile.save`.
        batch_size (`int`): preference pairs per optimizer step (`2 * batch_size` sequences).
        max_length (`int`): `DPOConfig.max_length`: longer sequences are truncated (keep the start); pairs whose
            prompt alone is that long are not drawn (TRL drops them).
        steps (`int`): timed optimizer steps of each run.
        warmup_steps (`int`): untimed optimizer steps before them, on their own batches.
        repeats (`int`): runs of each trainer, each in a fresh process, the trainers taking turns.
        lr (`float`): AdamW learning rate, constant.
        seed (`int`): seeds the lengths, the token ids, the weights and the trainers.
        device (`str`), dtype (`str`), threads (`int`, *optional*): as in `ThroughputConfig`.
    """

    model: str = "llama"
    tiny: bool = True
    model_overrides: dict = field(default_factory=lambda: dict(CPU_MODEL))
    profile: str = "hh_rlhf"
    batch_size: int = 8
    max_length: int = 1024
    steps: int = 8
    warmup_steps: int = 1
    repeats: int = 5
    lr: float = 1e-4
    seed: int = 0
    device: str = "auto"
    dtype: str = "float32"
    threads: int | None = None


TASKS = {
    "dpo": {
        "name": "DPO",
        "padded": "DPOTrainer",
        "flattened": "FlatDPOTrainer",
        "args": "DPOConfig",
        "model": "a reference copy",
        "step": "collation, reference and policy forwards, backward, optimizer",
    },
    "reward": {
        "name": "Reward",
        "padded": "RewardTrainer",
        "flattened": "FlatRewardTrainer",
        "args": "RewardConfig",
        "model": "one score per sequence (num_labels=1)",
        "step": "collation, forward, backward, optimizer",
    },
}
"""The names a DPO or reward result is reported with."""
