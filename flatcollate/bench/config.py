"""What the benchmarks measure, as plain data: the modes, the default CPU model, the configs of the text and preference
tasks, and the one check of the fields every config shares. Nothing here imports torch or transformers, so
`flatcollate bench --help` builds its options from these defaults at once.
"""

import math
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
class BenchConfig:
    """What every benchmark task's config holds (`SFTBenchConfig`, `PairBenchConfig`, `VisionBenchConfig`).

    Args:
        profile (`str`): a named length profile or a path (see `flatcollate.profiles.load_profile`; a pair profile for
            the preference tasks).
        batch_size (`int`): examples per optimizer step (sequences; pairs in the preference tasks).
        max_length (`int`): longer sequences are truncated to it (counted in the results).
        steps (`int`): optimizer steps of one timed pass.
        warmup_steps (`int`): untimed steps before every timed pass, on their own batches.
        repeats (`int`): runs of each mode, each a fresh process, the modes taking turns.
        model_overrides (`dict`): model config attributes to set (sizes).
        lr (`float`): AdamW learning rate, constant.
        seed (`int`): seeds the lengths, the token ids, the initial weights (and images, trainers).
        device (`str`): `"auto"` (CUDA when available), `"cpu"` or `"cuda"`.
        dtype (`str`): `"float32"` or `"bfloat16"`.
        threads (`int`, *optional*): CPU threads for torch during the run (`torch.set_num_threads`, restored
            afterwards). Default: 1 on a CPU, where more threads on a machine shared with other work spin waiting for
            a descheduled sibling and distort the timings; unchanged on a GPU.
    """

    profile: str = "flan"
    batch_size: int = 8
    max_length: int = 1024
    steps: int = 8
    warmup_steps: int = 1
    repeats: int = 5
    model_overrides: dict = field(default_factory=lambda: dict(CPU_MODEL))
    lr: float = 1e-4
    seed: int = 0
    device: str = "auto"
    dtype: str = "float32"
    threads: int | None = None


@dataclass(frozen=True)
class SFTBenchConfig(BenchConfig):
    """What the text SFT benchmark measures: `BenchConfig`'s fields and

    Args:
        model (`str`): a `model_type` (`"llama"`, `"qwen2"`) or a folder with a `config.json`.
        tiny (`bool`): shrink the config with `flatcollate.models.tiny_config` and apply `model_overrides`; `False`
            keeps the config's own sizes (with `model_overrides` applied), e.g. a 0.5B Qwen shape on a GPU.
        modes (`tuple[str, ...]`): subset of `MODES`; by default all but `padded_max`, the slowest by far.
        pack_len (`int`, *optional*): tokens per pack in `packed`; default `default_pack_len`.
        attn (`str`): attention of the flattened modes; `"auto"` is the `flatcollate` packed backend.
    """

    model: str = "llama"
    tiny: bool = True
    modes: tuple[str, ...] = DEFAULT_MODES
    pack_len: int | None = None
    attn: str = "auto"


@dataclass(frozen=True)
class PairBenchConfig(BenchConfig):
    """What the preference tasks measure (`flatcollate.bench.tasks.dpo`, `tasks.kto`, `tasks.reward`, `tasks.grpo`):
    `BenchConfig`'s fields, `model` and `tiny` as in `SFTBenchConfig`; `batch_size` counts pairs (`2 * batch_size`
    sequences),
    `max_length` is `DPOConfig.max_length` (pairs whose prompt alone is that long are not drawn: TRL drops them), the
    `profile` a pair profile (`available_pair_profiles()`) or a JSON file written by `PairProfile.save`."""

    profile: str = "hh_rlhf"
    model: str = "llama"
    tiny: bool = True


POSITIVE = ("batch_size", "max_length", "steps", "repeats", "min_pixels", "max_pixels")
"""Config fields that must be ints >= 1 (each config has some of them)."""

NON_NEGATIVE = ("warmup_steps", "max_images")
"""Config fields that must be ints >= 0."""

OPTIONAL_POSITIVE = ("threads", "pack_len")
"""Config fields that are None or ints >= 1."""


def check_fields(config) -> None:
    """Raise `ValueError` naming the field, the value and what it must be, for every field of `config` that the
    benchmarks share (counts, learning rate, device, dtype), before anything is built.

    >>> check_fields(SFTBenchConfig(steps=0))
    Traceback (most recent call last):
    ...
    ValueError: `steps` must be a positive int, got 0.
    """
    rules = [(POSITIVE, 1, False, "a positive int"), (NON_NEGATIVE, 0, False, "an int >= 0")]
    rules.append((OPTIONAL_POSITIVE, 1, True, "a positive int or None"))
    for names, minimum, optional, what in rules:
        for name in names:
            value = getattr(config, name, minimum)
            if optional and value is None:
                continue
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= minimum):
                raise ValueError(f"`{name}` must be {what}, got {value!r}.")
    if not (isinstance(config.lr, float | int) and math.isfinite(config.lr) and config.lr > 0):
        raise ValueError(f"`lr` must be a positive, finite float, got {config.lr!r}.")
    if config.device not in ("auto", "cpu", "cuda") or config.dtype not in ("float32", "bfloat16"):
        raise ValueError(
            f"`device` must be auto, cpu or cuda and `dtype` float32 or bfloat16, got {config.device!r}, "
            f"{config.dtype!r}."
        )
    if getattr(config, "min_pixels", 0) > getattr(config, "max_pixels", 1):
        raise ValueError(f"`min_pixels` ({config.min_pixels}) must not exceed `max_pixels` ({config.max_pixels}).")
    unknown = sorted(set(getattr(config, "modes", ())) - set(MODES))
    if unknown:
        raise ValueError(f"Unknown mode(s) {unknown} in `modes`; choose from {MODES}.")
