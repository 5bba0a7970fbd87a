"""Vision profile of the throughput benchmark: padded vs flattened training of a small Qwen2.5-VL-shaped model on
image-text examples whose text lengths come from a length profile and whose image sizes follow Qwen2-VL's dynamic
resolution.

Examples and the image-size assumption: `flatcollate.bench.vision_inputs`.

`padded`: the processor-style batch, right padded, `attention_mask`, `mm_token_type_ids`, and no `position_ids`, so
the unprepared model computes every example's 3-D positions itself (`get_rope_index` with the mask), on SDPA.
`flattened`: `VisionDataCollatorWithFlattening` on a copy prepared by `prepare_model_for_flattening`. Vision fields
(`pixel_values`, `image_grid_thw`) are the same tensors in both modes, so the vision tower does the same work.
"""

import copy
import difflib
import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import AutoModelForImageTextToText, PretrainedConfig, PreTrainedModel

from ..modeling.prepare import prepare_model_for_flattening
from ..models.vision import tiny_vision_config
from ..vision import VisionDataCollatorWithFlattening
from .config import MAX_IMAGES
from .memory import PeakMemory
from .plan import PROFILE_FILL_SAMPLE
from .profiles import load_profile, padded_fill
from .summary import summarize
from .throughput import (
    SETTLE_STEPS,
    bench_threads,
    resolve_device,
    run_pass,
    settle,
    settle_budget,
)
from .vision_inputs import (
    MAX_PIXELS,
    MIN_PIXELS,
    ImageDistribution,
    VisionPool,
    block_lengths,
    draw_lengths,
    draw_vision_pool,
    padded_vision_batch,
    vision_examples,
)

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
        profile (`str`): length profile of the text (see `flatcollate.bench.load_profile`).
        batch_size (`int`): examples per optimizer step in both modes.
        max_length (`int`): text longer than this is truncated (images are added on top, never cut).
        max_images (`int`): images per example are uniform on `0..max_images`.
        min_pixels (`int`), max_pixels (`int`): the image processor's limits; sides are drawn between their square
            roots. Defaults: Qwen2-VL's.
        steps (`int`): optimizer steps of one timed pass.
        warmup_steps (`int`): untimed steps before every timed pass.
        repeats (`int`): timed passes per mode, interleaved.
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


def build_vision_model(config: VisionBenchConfig, *, device: torch.device, dtype: torch.dtype) -> PreTrainedModel:
    """The unprepared model (SDPA, random weights seeded by `config.seed`) in train mode."""
    torch.manual_seed(config.seed)
    model_config = vision_model_config(config)
    model = AutoModelForImageTextToText.from_config(model_config, attn_implementation="sdpa", dtype=dtype)
    return model.to(device).train()


def run_vision_bench(config: VisionBenchConfig, *, progress: bool = True) -> dict:
    """Train `padded` and `flattened`, interleaved, and collect timings, memory, token counts and losses.

    Returns:
        `dict` (JSON-ready) shaped as `run_throughput`'s (`config`, `environment`, `headline`, `modes`,
        `ratios_vs_padded`, `loss_equivalence`, `model`), with `pool` counting image tokens and `images` describing
        the drawn images.
    """
    check_vision_config(config)
    device = resolve_device(config.device)
    with bench_threads(config.threads, device):
        return _run(config, device=device, progress=progress)


def _run(config: VisionBenchConfig, *, device: torch.device, progress: bool) -> dict:
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[config.dtype]
    padded_model = build_vision_model(config, device=device, dtype=dtype)
    initial = {k: v.detach().to("cpu", copy=True) for k, v in padded_model.state_dict().items()}
    models = {"padded": padded_model, "flattened": prepare_model_for_flattening(copy.deepcopy(padded_model))}
    profile = load_profile(config.profile)
    draw = {"max_length": config.max_length, "images": config.images}
    pool = draw_vision_pool(profile, config.steps * config.batch_size, seed=config.seed, **draw)
    warm = draw_vision_pool(profile, config.batch_size, seed=config.seed + 10, **draw)
    examples = vision_examples(padded_model, pool, np.arange(len(pool.lengths)), seed=config.seed)
    warm_examples = vision_examples(padded_model, warm, np.arange(len(warm.lengths)), seed=config.seed + 1)
    collators = {
        "padded": lambda group: padded_vision_batch(
            group, pad_token_id=padded_model.config.text_config.pad_token_id or 0
        ),
        "flattened": VisionDataCollatorWithFlattening.from_model(models["flattened"]),
    }
    batches, warm_batches, collate_s = {}, {}, {}
    for mode, collate in collators.items():
        start = time.perf_counter()
        batches[mode] = [
            collate(examples[i : i + config.batch_size]) for i in range(0, len(examples), config.batch_size)
        ]
        collate_s[mode] = time.perf_counter() - start
        warm_batches[mode] = [collate(warm_examples)][: config.warmup_steps]
    memory = PeakMemory(device)
    runs = {mode: [] for mode in VISION_MODES}
    total = config.repeats * sum(len(batches[m]) + len(warm_batches[m]) for m in VISION_MODES)
    total += sum(settle_budget(batches[m][:SETTLE_STEPS]) for m in VISION_MODES)
    bar = tqdm(total=total, desc="training steps", unit="step", disable=not progress)
    kwargs = {"lr": config.lr, "device": device, "bar": bar}
    settle_passes = {
        mode: settle(models[mode], batches[mode][:SETTLE_STEPS], initial, **kwargs) for mode in VISION_MODES
    }
    for repeat in range(config.repeats):
        # Rotate the order each repeat so slow phases of a shared machine do not always hit the same mode.
        for mode in VISION_MODES[repeat % 2 :] + VISION_MODES[: repeat % 2]:
            run_pass(models[mode], warm_batches[mode], initial, **kwargs)
            memory.reset()
            record = run_pass(models[mode], batches[mode], initial, **kwargs)
            peak = memory.peak()
            record["peak_memory_bytes"] = peak
            record["added_memory_bytes"] = None if peak is None or memory.baseline is None else peak - memory.baseline
            runs[mode].append(record)
    bar.close()
    # Padding efficiency of the whole distribution (lengths only), not only of the few examples trained on.
    many = draw_lengths(profile, PROFILE_FILL_SAMPLE, seed=config.seed, **draw)
    fill = {"profile": padded_fill(many, batch_size=config.batch_size)}
    attn = models["flattened"].config.text_config._attn_implementation
    result = summarize(
        config,
        runs,
        batches,
        collate_s,
        pool=pool.text,
        pack_len=0,
        skipped={},
        device=device,
        attn=attn,
        profile_fill=fill,
        settle_passes=settle_passes,
    )
    result["pool"] = pool_summary(pool, result, fill["profile"])
    result["images"] = image_summary(config, pool)
    text = padded_model.config.text_config
    sizes = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "vocab_size")
    vision = padded_model.config.vision_config
    result["model"] = {
        "model_type": padded_model.config.model_type,
        "parameters": sum(p.numel() for p in padded_model.parameters()),
        "vision_parameters": sum(p.numel() for p in padded_model.model.visual.parameters()),
        **{name: getattr(text, name) for name in sizes},
        "vision_hidden_size": vision.hidden_size,
        "vision_layers": vision.depth,
    }
    return result


def pool_summary(pool: VisionPool, result: dict, profile_fill: float) -> dict:
    """Token counts of the trained examples and the padding efficiency of padded batches."""
    padded = result["modes"]["padded"]
    return {
        "sequences": len(pool.lengths),
        "real_tokens": int(pool.lengths.sum()),
        "text_tokens": int(pool.text.lengths.sum()),
        "image_tokens": int(pool.lengths.sum() - pool.text.lengths.sum()),
        "mean_length": float(pool.lengths.mean()),
        "max_length_seen": int(pool.lengths.max()),
        "text_truncated": pool.text.truncated,
        "padding_efficiency": padded["real_tokens_per_epoch"] / padded["computed_tokens_per_epoch"],
        "profile_padding_efficiency": profile_fill,
    }


def image_summary(config: VisionBenchConfig, pool: VisionPool) -> dict:
    """How the images were drawn (a stated assumption) and what was drawn."""
    tokens = block_lengths(pool.grids) - 2
    return {
        "distribution": config.images.describe(),
        "min_pixels": config.min_pixels,
        "max_pixels": config.max_pixels,
        "max_images": config.max_images,
        "images": int(pool.images.sum()),
        "image_tokens_per_image": {
            "mean": float(tokens.mean()) if tokens.size else 0.0,
            "min": int(tokens.min()) if tokens.size else 0,
            "max": int(tokens.max()) if tokens.size else 0,
        },
    }


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
