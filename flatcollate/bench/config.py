"""What the benchmarks measure, as plain data: the modes, the default CPU model, the configs of the text and preference
tasks, and the one check of the fields every config shares. Nothing here imports torch or transformers, so
`flatcollate bench --help` builds its options from these defaults at once.
"""

import math
from dataclasses import dataclass, field

MODES = ("padded", "padded_max", "hf_flattened", "flattened", "flattened_batched", "packed")
"""Benchmark modes, in the order they are reported."""

BATCHED_MODE = "flattened_batched"
"""flatcollate with the state-carrying layers of hybrid models called once per layer on the row's sequences laid out
as a padded batch, against `flattened`'s one call per sequence; the same as `flattened` for other models."""

OWN_BATCHES = {"packed": "other batches (whole packs, one step each)"}
"""Modes that train on batches of their own, with what they train on: their losses follow another curve than the
modes that train the padded batches' sequences step by step."""

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

DEFAULT_MODES = tuple(mode for mode in MODES if mode not in ("padded_max", BATCHED_MODE))
"""Modes measured unless asked otherwise: padding to `max_length` costs more than all the others together, and the
batched call of state-carrying layers concerns hybrid models only."""


def option(default, text: str, **metadata):
    """A config field that is also the `flatcollate bench` option of its name (`batch_size` is `--batch-size`): `text`
    documents both (`flatcollate bench --help` prints it); `metadata` may add argparse's `choices` and `metavar`."""
    return field(default=default, metadata={"help": text, **metadata})


@dataclass(frozen=True)
class BenchConfig:
    """What every benchmark task's config holds (`SFTBenchConfig`, `PairBenchConfig`, `VisionBenchConfig`): each
    field but `model_overrides` is an option, documented by its `help` (`option`); `model_overrides` holds the model
    config attributes to set (sizes; `--set KEY=VALUE`)."""

    profile: str = option("flan", "a named length profile or a path (flatcollate.profiles.load_profile)")
    batch_size: int = option(8, "examples per optimizer step: sequences, or pairs in the preference tasks")
    max_length: int = option(1024, "longer sequences are cut to it (the preference tasks draw no pair TRL would drop)")
    steps: int = option(8, "optimizer steps of one timed pass")
    warmup_steps: int = option(1, "untimed steps before every timed pass, on batches of their own")
    repeats: int = option(5, "runs of each mode, each a fresh process, the modes taking turns")
    model_overrides: dict = field(default_factory=lambda: dict(CPU_MODEL))
    lr: float = option(1e-4, "AdamW learning rate, constant")
    seed: int = option(0, "seeds the lengths, the token ids and the initial weights (and images, trainers)")
    device: str = option("auto", "auto: CUDA when available", choices=("auto", "cpu", "cuda"))
    dtype: str = option("float32", "model dtype", choices=("float32", "bfloat16"))
    threads: int | None = option(
        None,
        "torch CPU threads during the run, restored afterwards (default: 1 on a CPU, where more threads on a machine "
        "shared with other work spin waiting for a descheduled sibling and distort the timings; unchanged on a GPU)",
    )


@dataclass(frozen=True)
class ModelBenchConfig(BenchConfig):
    """`BenchConfig` of a task whose model is a causal LM of any family (text SFT, the preference tasks)."""

    model: str = option("llama", "a model_type (llama, qwen2) or a folder with a config.json")
    tiny: bool = option(
        True,
        "shrink the config with flatcollate.testing.tiny_config and apply model_overrides; False (--full-size) keeps "
        "the config's own sizes (with model_overrides applied), e.g. a 0.5B Qwen shape on a GPU",
    )


@dataclass(frozen=True)
class SFTBenchConfig(ModelBenchConfig):
    """What the text SFT benchmark measures (`flatcollate.bench.tasks.sft`)."""

    modes: tuple[str, ...] = option(
        DEFAULT_MODES,
        f"what to measure, from {', '.join(MODES)}: padded_max pads to max_length, hf_flattened is transformers' own "
        "padding-free path, flattened_batched calls the state-carrying layers of hybrid models once per layer",
        choices=MODES,
        metavar="MODE",
    )
    pack_len: int | None = option(None, "tokens per pack in packed (default: about a batch's tokens)")
    attn: str = option("auto", "attention of the flattened modes (auto: the flatcollate backend)")


@dataclass(frozen=True)
class PairBenchConfig(ModelBenchConfig):
    """What the preference tasks measure (`flatcollate.bench.tasks.dpo`, `tasks.kto`, `tasks.reward`, `tasks.grpo`):
    `batch_size` counts pairs (`2 * batch_size` sequences), `max_length` is the TRL config's (pairs whose prompt alone
    is that long are not drawn: TRL drops them), the `profile` a pair profile (`available_pair_profiles()`) or a JSON
    file written by `PairProfile.save`."""

    profile: str = option("hh_rlhf", "a named pair profile or a JSON file written by PairProfile.save")


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
