"""What the vision profile of the throughput benchmark measures (`VisionBenchConfig`) and the model it trains: a small
Qwen2.5-VL-shaped model built from `flatcollate.models.tiny_vision_config` with the text sizes of the config.

The parent process of `flatcollate bench --vision` and every worker it starts (`flatcollate.bench.vision`) build the
same model from the same config and seed.
"""

import difflib
import math
from dataclasses import dataclass, field

import torch
from transformers import AutoModelForImageTextToText, PretrainedConfig, PreTrainedModel

from ..models.vision import tiny_vision_config
from .build import build_on_device
from .config import MAX_IMAGES
from .vision_inputs import MAX_PIXELS, MIN_PIXELS, ImageDistribution

VISION_MODEL_TYPE = "qwen2_5_vl"
VISION_MODES = ("padded", "flattened")

VISION_TEXT_MODEL = {
    "hidden_size": 128,
    "intermediate_size": 344,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
"""Language-model sizes of the default run (the text bench's CPU model); the vision tower stays `tiny_vision_lm`'s
(1 layer, width 32)."""


@dataclass(frozen=True)
class VisionBenchConfig:
    """What the vision profile measures.

    Args:
        profile (`str`): length profile of the text (see `flatcollate.profiles.load_profile`).
        batch_size (`int`): examples per optimizer step in both modes.
        max_length (`int`): text longer than this is truncated (images are added on top, never cut).
        max_images (`int`): images per example are uniform on `0..max_images`.
        min_pixels (`int`), max_pixels (`int`): the image processor's limits; sides are drawn between their square
            roots. Defaults: Qwen2-VL's.
        steps (`int`): optimizer steps of one timed pass.
        warmup_steps (`int`): untimed steps before every timed pass.
        repeats (`int`): runs of each mode, each a fresh process, the modes taking turns.
        text_model (`dict`): language-model config attributes to set (sizes); mRoPE sections follow the head size.
        lr (`float`): AdamW learning rate.
        seed (`int`): seeds the lengths, images, token ids, pixels and weights.
        device (`str`), dtype (`str`), threads (`int`, *optional*): as in `ThroughputConfig`.
    """

    profile: str = "flan"
    batch_size: int = 8
    max_length: int = 1024
    max_images: int = MAX_IMAGES
    min_pixels: int = MIN_PIXELS
    max_pixels: int = MAX_PIXELS
    steps: int = 8
    warmup_steps: int = 1
    repeats: int = 5
    text_model: dict = field(default_factory=lambda: dict(VISION_TEXT_MODEL))
    lr: float = 1e-4
    seed: int = 0
    device: str = "auto"
    dtype: str = "float32"
    threads: int | None = None

    @property
    def images(self) -> ImageDistribution:
        """The image distribution these fields describe."""
        return ImageDistribution(self.max_images, self.min_pixels, self.max_pixels)


def vision_model_config(config: VisionBenchConfig) -> PretrainedConfig:
    """`tiny_vision_config("qwen2_5_vl")` with `config.text_model` sizes; mRoPE sections split half a head 2:3:3
    (as Qwen2.5-VL's 16, 24, 24), the projector's width follows the text model's."""
    model_config = tiny_vision_config(VISION_MODEL_TYPE)
    text = model_config.text_config
    for name, value in config.text_model.items():
        if not hasattr(text, name):
            close = difflib.get_close_matches(name, sorted(text.to_dict()), n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise ValueError(f"`text_model`: the {text.model_type} text config has no attribute {name!r}{hint}")
        current = getattr(text, name)
        is_size = isinstance(current, int) and not isinstance(current, bool) and current > 0
        if is_size and not (isinstance(value, int) and not isinstance(value, bool) and value > 0):
            raise ValueError(f"`text_model`: {name} is a positive integer (the config has {current}), got {value!r}.")
        setattr(text, name, value)
    if text.hidden_size % text.num_attention_heads or text.num_attention_heads % text.num_key_value_heads:
        raise ValueError(
            f"`text_model`: hidden_size {text.hidden_size} must split into num_attention_heads "
            f"{text.num_attention_heads}, which must split into num_key_value_heads {text.num_key_value_heads}."
        )
    half = text.hidden_size // text.num_attention_heads // 2
    time_section = half // 4
    height = (half - time_section) // 2
    text.rope_parameters = {
        **text.rope_parameters,
        "mrope_section": [time_section, height, half - time_section - height],
    }
    model_config.vision_config.out_hidden_size = text.hidden_size
    text.use_cache = model_config.use_cache = False
    return model_config


def build_vision_model(
    config: VisionBenchConfig, *, device: torch.device, dtype: str | None = None
) -> PreTrainedModel:
    """The unprepared model (SDPA, random weights seeded by `config.seed`, built on `device` in `dtype`, by default
    the config's) in train mode."""
    model_config = vision_model_config(config)
    dtype = dtype or config.dtype
    return build_on_device(AutoModelForImageTextToText, model_config, device=device, dtype=dtype, seed=config.seed)


def check_vision_config(config: VisionBenchConfig) -> None:
    """Raise `ValueError` naming the field, the value and what it must be, before anything is built."""
    positive = {"batch_size": config.batch_size, "max_length": config.max_length, "steps": config.steps}
    positive |= {"repeats": config.repeats, "min_pixels": config.min_pixels, "max_pixels": config.max_pixels}
    for name, value in positive.items():
        if not (isinstance(value, int) and value >= 1):
            raise ValueError(f"`{name}` must be a positive int, got {value!r}.")
    for name in ("max_images", "warmup_steps"):
        value = getattr(config, name)
        if not (isinstance(value, int) and value >= 0):
            raise ValueError(f"`{name}` must be an int >= 0, got {value!r}.")
    if config.min_pixels > config.max_pixels:
        raise ValueError(f"`min_pixels` ({config.min_pixels}) must not exceed `max_pixels` ({config.max_pixels}).")
    if not (math.isfinite(config.lr) and config.lr > 0):
        raise ValueError(f"`lr` must be a positive, finite float, got {config.lr!r}.")
    if config.threads is not None and not (isinstance(config.threads, int) and config.threads >= 1):
        raise ValueError(f"`threads` must be a positive int or None, got {config.threads!r}.")


def vision_config_from_json(data: dict) -> VisionBenchConfig:
    """The `VisionBenchConfig` a worker got as JSON."""
    return VisionBenchConfig(**data)
