"""Image-text SFT (`flatcollate bench --vision`): padded vs flattened training of a small Qwen2.5-VL-shaped model on
examples whose text lengths come from a length profile and whose images follow Qwen2-VL's dynamic resolution
(`flatcollate.synthetic.images`, where the image-size assumption is stated).

`padded`: the processor-style batch, right padded, `attention_mask`, `mm_token_type_ids`, and no `position_ids`, so
the unprepared model computes every example's 3-D positions itself, on SDPA. `flattened`:
`VisionDataCollatorWithFlattening` on the model prepared by `prepare_model_for_flattening`. `packed`: the same
examples in best-fit-decreasing packs of whole examples (`flatcollate.data.packing.pack_lengths` on their lengths,
image placeholders counted; `pack_len` about a batch's tokens and at least the longest example), each pack
(`flatcollate.vision.packs.pack_examples`, its vision fields one entry per example) one optimizer step through the same
collator. The vision fields (`pixel_values`, `image_grid_thw`) are the same tensors in every mode, so the vision
tower does the same work.
"""

import functools
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from transformers import AutoModelForImageTextToText, PretrainedConfig, PreTrainedModel

from ...data.packing import pack_lengths
from ...profiles.load import load_profile, padded_fill
from ...synthetic.images import (
    MAX_PIXELS,
    MERGE,
    MIN_PIXELS,
    ImageDistribution,
    block_lengths,
    draw_lengths,
    draw_vision_pool,
    vision_examples,
)
from ...testing.tiny_text import apply_overrides, check_overrides
from ...testing.tiny_vision import tiny_vision_config
from ...vision import VisionDataCollatorWithFlattening
from ...vision.packs import pack_examples
from ..batches import Plan, pad_examples, plan_modes
from ..build import build_on_device, model_summary
from ..config import CPU_MODEL, MAX_IMAGES, BenchConfig
from ..flops import attention_width, linear_parameters, training_flops
from ..harness import PROFILE_DRAWS, Task, Workload, sequence_data
from ..timing import TrainingSteps, timed_pass

VISION_TEXT_MODEL = {key: CPU_MODEL[key] for key in ("hidden_size", "intermediate_size", "num_hidden_layers")}
VISION_TEXT_MODEL |= {key: CPU_MODEL[key] for key in ("num_attention_heads", "num_key_value_heads")}
"""Language-model sizes of the default run (the text benchmark's CPU model; the head size follows the width, as
Qwen2.5-VL's does); the vision tower stays `tiny_vision_config`'s (1 layer, width 32)."""


@dataclass(frozen=True)
class VisionBenchConfig(BenchConfig):
    """What the image-text benchmark measures: `BenchConfig`'s fields (`model_overrides` sizes the language model;
    mRoPE sections follow its head size; `max_length` cuts the text, never an image) and

    Args:
        max_images (`int`): images per example are uniform on `0..max_images`.
        min_pixels (`int`), max_pixels (`int`): the image processor's limits; sides are drawn between their square
            roots. Defaults: Qwen2-VL's.
    """

    model_overrides: dict = field(default_factory=lambda: dict(VISION_TEXT_MODEL))
    max_images: int = MAX_IMAGES
    min_pixels: int = MIN_PIXELS
    max_pixels: int = MAX_PIXELS

    @property
    def images(self) -> ImageDistribution:
        """The image distribution these fields describe."""
        return ImageDistribution(self.max_images, self.min_pixels, self.max_pixels)


def vision_model_config(config: VisionBenchConfig) -> PretrainedConfig:
    """`tiny_vision_config("qwen2_5_vl")` with the `model_overrides` sizes (`ValueError` for sizes its text config
    cannot take, `flatcollate.testing.tiny_text.check_overrides`); mRoPE sections split half a head 2:3:3
    (as Qwen2.5-VL's 16, 24, 24), the projector's width follows the text model's."""
    model_config = tiny_vision_config("qwen2_5_vl")
    check_overrides(model_config.text_config, config.model_overrides)
    text = apply_overrides(model_config.text_config, **config.model_overrides)
    half = text.hidden_size // text.num_attention_heads // 2
    time_section = half // 4
    height = (half - time_section) // 2
    sections = [time_section, height, half - time_section - height]
    text.rope_parameters = {**text.rope_parameters, "mrope_section": sections}
    model_config.vision_config.out_hidden_size = text.hidden_size
    text.use_cache = model_config.use_cache = False
    return model_config


def build_vision_model(config: VisionBenchConfig, *, device: torch.device, dtype: str | None = None) -> PreTrainedModel:
    """The unprepared model (SDPA, random weights from `config.seed`, on `device` in `dtype`, by default the
    config's), in train mode."""
    model_config = vision_model_config(config)
    dtype = dtype or config.dtype
    return build_on_device(AutoModelForImageTextToText, model_config, device=device, dtype=dtype, seed=config.seed)


def plan_vision_batches(config: VisionBenchConfig, model, modes) -> Plan:
    """Draw the examples (the same in every process) and collate each of `modes`' batches (`batches.plan_modes`);
    `model` is the unprepared model, prepared in place before the flattened batches are collated (their collator
    reads its forward)."""
    from ...modeling.prepare import prepare_model_for_flattening

    profile = load_profile(config.profile)
    draw = {"max_length": config.max_length, "images": config.images}
    pool = draw_vision_pool(profile, config.steps * config.batch_size, seed=config.seed, **draw)
    warm = draw_vision_pool(profile, config.batch_size, seed=config.seed + 10, **draw)
    examples = vision_examples(model, pool, np.arange(len(pool.lengths)), seed=config.seed)
    warm_examples = vision_examples(model, warm, np.arange(len(warm.lengths)), seed=config.seed + 1)
    collators = {"padded": functools.partial(pad_examples, pad_token_id=model.config.text_config.pad_token_id or 0)}
    if {"flattened", "packed"} & set(modes):  # the padded mode trains the unprepared model
        collator = VisionDataCollatorWithFlattening.from_model(prepare_model_for_flattening(model))
        collators["flattened"] = collators["packed"] = collator
    pack_len = vision_pack_len(pool.lengths, batch_size=config.batch_size)

    def collate(mode: str, examples: list[dict]) -> list[dict]:
        if mode == "packed":  # one step per pack of whole examples
            lengths = [len(example["input_ids"]) for example in examples]
            groups = labelled_packs(pack_lengths(np.array(lengths), max(pack_len, max(lengths))), examples)
            return [collators[mode]([pack_examples([examples[i] for i in group])]) for group in groups]
        size = config.batch_size
        return [collators[mode](examples[i : i + size]) for i in range(0, len(examples), size)]

    plan = plan_modes(
        modes, collate, examples, warm_examples, max_length=config.max_length, warmup_steps=config.warmup_steps
    )
    return replace(plan, pool=pool)  # the drawn pool, whose lengths and grids the FLOPs count


def labelled_packs(groups: list[np.ndarray], examples: list[dict]) -> list[np.ndarray]:
    """The packs, each one without a labelled token (its examples' completions cut by `max_length`) joined to the
    pack before it (after it, for the first): its loss would not be defined. Rare beyond tiny `max_length`s; such a
    joined step holds more than `pack_len` tokens."""
    labelled = [any(bool((examples[i]["labels"] != -100).any()) for i in group) for group in groups]
    kept: list[np.ndarray] = []
    pending: list[np.ndarray] = []
    for group, has_labels in zip(groups, labelled, strict=True):  # one step per pack
        if not has_labels:
            if kept:
                kept[-1] = np.concatenate([kept[-1], group])
            else:
                pending.append(group)
            continue
        kept.append(np.concatenate([*pending, group]))
        pending = []
    return kept or [np.concatenate(pending)]


def vision_pack_len(lengths: np.ndarray, *, batch_size: int) -> int:
    """Tokens per pack of the `packed` mode: `batch_size` x the mean example length rounded up to a multiple of 64
    (about a batch's tokens), and never below the longest example (an example with images is never cut).

    >>> vision_pack_len(np.array([100, 300, 50]), batch_size=2)
    320
    """
    target = int(np.ceil(batch_size * lengths.mean() / 64) * 64)
    return max(target, int(lengths.max()))


def workload(config: VisionBenchConfig) -> Workload:
    """Both modes' batches, collated here on a CPU copy of the model to count their tokens."""
    model = build_vision_model(config, device=torch.device("cpu"), dtype="float32")
    plan = plan_vision_batches(config, model, MODES)
    pool = plan.pool
    draw = {"max_length": config.max_length, "images": config.images}
    many = draw_lengths(load_profile(config.profile), PROFILE_DRAWS, seed=config.seed, **draw)
    padding = 1 - padded_fill(many, batch_size=config.batch_size)
    sample = f"{PROFILE_DRAWS:,} examples"
    data = sequence_data(pool.lengths, truncated=pool.text.truncated, profile_padding=padding, profile_sample=sample)
    tokens = block_lengths(pool.grids) - 2
    data |= {
        "image_tokens": int(pool.lengths.sum() - pool.text.lengths.sum()),
        "images": int(pool.images.sum()),
        "image_distribution": config.images.describe(),
        "image_tokens_per_image": {
            "mean": float(tokens.mean()) if tokens.size else 0.0,
            "min": int(tokens.min()) if tokens.size else 0,
            "max": int(tokens.max()) if tokens.size else 0,
        },
    }
    return Workload.from_batches(plan.batches, data, plan.collate_s)


def measure(config: VisionBenchConfig, mode: str, device: torch.device) -> dict:
    """Worker: build the model, collate the mode's batches (the flattened collator prepares the model), warm up and
    time one pass."""
    model = build_vision_model(config, device=device)
    summary = model_summary(model)
    plan = plan_vision_batches(config, model, [mode])
    figures = timed_pass(TrainingSteps(model, lr=config.lr), plan.batches[mode], plan.warm_batches[mode], device=device)
    attn = model.config.text_config._attn_implementation
    return {**figures, "attn": attn, "pass_flops": pass_flops(model, plan.pool), "model": summary, "environment": {}}


def pass_flops(model, pool) -> float:
    """Model FLOPs of one pass (`flatcollate.bench.flops`): the language model and its head on every token, image
    blocks included; the vision tower's blocks on every patch, attending across each image (an upper bound: most of
    Qwen2.5-VL's vision layers attend within windows); its merger on every merged token (4 patches)."""
    layers, width = attention_width(model.config)
    language = linear_parameters(model.model.language_model) + linear_parameters(model.lm_head)
    visual, vision = model.model.visual, model.config.vision_config
    merger = linear_parameters(visual.merger)
    patches = pool.grids.prod(axis=1)
    tower = training_flops(linear_parameters(visual) - merger, vision.depth, vision.hidden_size, patches)
    return training_flops(language, layers, width, pool.lengths) + tower + 6.0 * merger * patches.sum() / MERGE**2


def data_lines(result: dict) -> list[str]:
    """The images drawn and their tokens (a sequence is an example; only its text is ever cut)."""
    data = result["data"]
    per_image = data["image_tokens_per_image"]
    return [
        f"images: {data['image_distribution']}; {data['images']} drawn, {per_image['mean']:.0f} image tokens each on "
        f"average ({per_image['min']}-{per_image['max']}), {data['image_tokens']:,} of the real tokens",
    ]


def validate(config: VisionBenchConfig) -> None:
    """The profile and the language-model sizes."""
    from ...cli import UsageError
    from ..options import check_profile

    check_profile(config.profile)
    try:
        vision_model_config(config)
    except ValueError as error:
        raise UsageError(f"--set {error}") from None


MODES = ("padded", "flattened", "packed")

TASK = Task(
    name="vision",
    flag="--vision",
    config=VisionBenchConfig,
    files="vision",
    modes={
        "padded": "the processor's padded batch (right padding, attention_mask, mm_token_type_ids; the unprepared "
        "model computes each example's 3-D positions), sdpa",
        "flattened": "VisionDataCollatorWithFlattening + prepare_model_for_flattening (one row, per-sequence 3-D "
        "positions, the flatcollate backend on the language model)",
        "packed": "best-fit-decreasing packs of whole examples (about a batch's tokens each, images kept with their "
        "example), one pack per step, through the same collator and model",
    },
    subject="flatcollate (flattened)",
    baseline="padded batches",
    scope="its model is qwen2_5_vl, its modes padded, flattened and packed; size the language model with --set",
    workload=workload,
    measure=measure,
    data_lines=data_lines,
    validate=validate,
    legend=(
        "- every mode gives the vision tower the same pixel_values and image_grid_thw",
        "- packed runs one optimizer step per pack, so its step count differs; tokens per CPU second compare",
    ),
)
