"""Tiny random-weight vision-language models and per-example inputs laid out as each family's processor lays them out.

`tiny_vision_lm("qwen2_vl")` builds an `AutoModelForImageTextToText` with a 2-layer text model (`tiny_config`; 3 in
hybrids) and a 1-layer vision tower small enough that an image becomes a handful of tokens.
`tiny_vision_examples(model)` returns examples the model accepts alone; the number of placeholder tokens per image is
read from the model's own `get_image_features`, so the examples are right by construction. Token ids:

    0 .. 2         bos / eos / pad of most text configs (never drawn as text)
    3 .. 479       text tokens
    480 .. 499     every special token id of the config (image, video, vision start/end, boi/eoi, ...)
    500 .. 510     layout tokens a processor adds that the config does not hold ([IMG_BREAK], <global-img>, ...)
    511            pad (where the original pad id fell outside the vocabulary)
"""

import inspect
import re

import torch
from transformers import AutoConfig, AutoModelForImageTextToText, PretrainedConfig, PreTrainedModel

from .tiny_text import sdpa_or_eager, tiny_config
from .vision_blocks import image_id, image_token_types
from .vision_recipes import FAMILIES

VOCAB_SIZE = 512
TEXT_IDS = (3, 480)  # [low, high) range of random text tokens
SPECIAL_BASE = 480
LAYOUT_BASE = 500

# Vision tower sizes, set where the vision config defines them; a family's table entry overrides any of them.
TINY_VISION_SIZES = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "depth": 1,
    "num_attention_heads": 2,
    "num_heads": 2,
    "embed_dim": 32,
    "head_dim": 16,
    "projection_dim": 32,
    "image_size": 32,
    "patch_size": 8,
}

WEIGHT_NOISE = 0.05
"""Std of the seeded noise `tiny_vision_lm` adds to every parameter after transformers' init. Some inits leave the
images inert: Gemma 3's `mm_input_projection_weight` starts at zero (its logits ignore the pixels and the vision
tower's gradients are exactly zero), GOT-OCR2's vision tower starts at std 1e-10, Idefics2's resampler latents start
all equal (its images move its logits by 2e-3; 7e-3 with noise of 0.02, 5e-2 with 0.05). With the noise every
parameter carries signal and gradient (`flatcollate.vision.controls`)."""

# Projector widths kept at the composite config's top level.
TINY_PROJECTOR_SIZES = {"alignment_intermediate_size": 64, "projector_hidden_size": 64}

_SPECIAL_NAME = re.compile(r"(token_id|token_index)$")
_NOT_MULTIMODAL = ("pad_token_id", "bos_token_id", "eos_token_id", "sep_token_id", "unk_token_id")

# Image-text-to-text families of transformers 5.23 without a recipe here: model_type -> "stage: exception: first
# line", measured with the LLaVA-like recipe (`_SQUARE`, plain block) unless the family's layout (Qwen patches) was
# tried. Stages: config (shrinking), build (parameters counted on the meta device; > 3M counts as not tiny),
# examples (`get_image_features`), forward (the model alone on an example).
TINY_BUILD_NOTES: dict[str, str] = {
    "blip": "examples: AttributeError: 'BlipForConditionalGeneration' has no 'model' (nor get_image_features)",
    "blip-2": "build: 106.7M parameters after shrinking, largest qformer.encoder.layer.9.output_query.dense.weight",
    "chameleon": "config: AttributeError: 'ChameleonConfig' has no 'text_config'",
    "cohere_compass": "build: KeyError: 'full_attention'",
    "deepseek_ocr2": "build: TypeError: 'NoneType' object is not subscriptable",
    "deepseek_vl": "examples: AttributeError: 'DeepseekVLForConditionalGeneration' has no 'get_image_features'",
    "deepseek_vl_hybrid": "build: 96.5M parameters after shrinking, largest model.high_res_vision_proj.conv2.weight",
    "diffusion_gemma": "config: AmbiguousGlobalPerLayerAttributeError: 'head_dim' is a per-layer attribute",
    "dots3_note": "config: AmbiguousGlobalPerLayerAttributeError: 'num_attention_heads' is a per-layer attribute",
    "emu3": "config: AttributeError: 'Emu3Config' has no 'vision_config'",
    "ernie4_5_vl_moe": "config: StrictDataclassFieldValidationError: field 'moe_intermediate_size':",
    "evolla": "config: AttributeError: 'EvollaConfig' has no 'text_config'",
    "fast_vlm": "build: ImportError: TimmWrapperModel requires the timm library (not installed here)",
    "florence2": "config: StrictDataclassFieldValidationError: field 'num_heads':",
    "gemma3n": "build: ImportError: TimmWrapperModel requires the timm library (not installed here)",
    "gemma4": "config: AmbiguousGlobalPerLayerAttributeError: 'head_dim' is a per-layer attribute",
    "gemma4_unified": "config: AmbiguousGlobalPerLayerAttributeError: 'head_dim' is a per-layer attribute",
    "git": "config: AttributeError: 'GitConfig' has no 'text_config'",
    "glm5_next": "build: 58.6M parameters after shrinking, largest model.visual.merger.up_proj.weight",
    "granite4_vision": "build: TypeError: object of type 'NoneType' has no len()",
    "hunyuan_vl": "forward: ValueError: HunYuanVL expects at least 3 multimodal RoPE axes, got 0.",
    "idefics": "config: AttributeError: 'IdeficsConfig' has no 'text_config'",
    "inkling2": "build: 22.4M parameters after shrinking, largest model.vision_tower.merger.linear_2.weight",
    "inkling_mm_model": "build: ModuleNotFoundError: No module named 'scipy'",
    "instructblip": "build: 187.2M parameters after shrinking, largest qformer.embeddings.word_embeddings.weight",
    "instructblipvideo": "build: 187.2M parameters after shrinking, largest qformer.embeddings.word_embeddings.weight",
    "janus": "build: 114.1M parameters after shrinking, largest model.generation_head.vision_head.weight",
    "kosmos-2": "examples: AttributeError: 'Kosmos2ForConditionalGeneration' has no 'get_image_features'",
    "kosmos-2.5": "examples: AttributeError: 'Kosmos2_5VisionConfig' has no 'image_size'",
    "minicpm_ocr": "examples: TypeError: MiniCPMOcrModel.get_image_features() needs 'target_sizes'",
    "minicpmv4_6": "examples: TypeError: MiniCPMV4_6Model.get_image_features() needs 'target_sizes'",
    "minicpmv4_7": "examples: TypeError: MiniCPMV4_7Model.get_image_features() needs 'target_sizes'",
    "mistral4": "config: AttributeError: 'Mistral4Config' has no 'text_config'",
    "mllama": "examples: AttributeError: 'MllamaForConditionalGeneration' has no 'get_image_features'",
    "molmo2": "config: StrictDataclassFieldValidationError: field 'image_size':",
    "muse_spark": "build: 122.6M parameters after shrinking, largest model.audio_tower.proj.weight",
    "nemotron_h_omni": "build: 5.4M parameters after shrinking, largest vision_model.embeddings.position_embedding",
    "ovis2": "examples: ValueError: ovis2: image features of width [1536], not the text width 64",
    "perception_lm": "build: ImportError: TimmWrapperModel requires the timm library (not installed here)",
    "pi0": "config: AttributeError: 'PI0Config' has no 'text_config'",
    "pix2struct": "examples: AttributeError: 'Pix2StructVisionConfig' has no 'image_size'",
    "pp_formulanet": "build: 10.9M parameters after shrinking, largest model.encoder.multi_modal_projector.conv2.we...",
    "qianfan_ocr": "build: TypeError: 'int' object is not subscriptable",
    "qwen2_5_omni_thinker": "build: 640.3M parameters after shrinking, largest model.audio_tower.layers.9.fc2.weight",
    "qwen3_omni_moe_thinker": "build: 652.0M parameters after shrinking, largest model.audio_tower.conv_out.weight",
    "qwen4_exp": "config: TypeError: unsupported operand type(s) for //: 'NoneType' and 'NoneType'",
    "step3p7": "forward: ValueError: Could not find a `sliding_window` argument in the config, or it is not set",
    "t5gemma2": "config: AttributeError: 'T5Gemma2Config' has no 'text_config'",
    "udop": "config: AttributeError: 'UdopConfig' has no 'text_config'",
    "unlimited_ocr": "build: 398.4M parameters after shrinking, largest model.vision_tower.sam_encoder.proj.conv2.w...",
    "vision-encoder-decoder": "config: AttributeError: 'VisionEncoderDecoderConfig' has no 'text_config'",
}


def tiny_vision_lm(model_type: str, *, seed: int = 0, attn_implementation: str = "sdpa") -> PreTrainedModel:
    """An image-text-to-text model of `model_type` with random weights: 2 text layers of width 64, 1 vision layer.

    Every multimodal special token id of the config is moved into the 512-token vocabulary (480 and up). Every
    parameter gets seeded noise of std `WEIGHT_NOISE` on top of transformers' init, so that none is inert.

    Args:
        model_type: a key of `FAMILIES`, e.g. `"qwen2_vl"`.
        seed: seed of the weights.
        attn_implementation: backend of the model (`"sdpa"`, `"eager"`, `"flatcollate"`, ...).

    Returns:
        `PreTrainedModel` in fp32, in the mode `from_config` leaves it; a family without an SDPA path gets `eager`
        when `sdpa` (the default) is asked for.

    >>> m = tiny_vision_lm("llava")
    >>> m.config.text_config.hidden_size, m.config.text_config.vocab_size, m.config.image_token_id
    (64, 512, 480)
    """
    if model_type not in FAMILIES:
        known = ", ".join(sorted(FAMILIES))
        raise ValueError(f"model_type={model_type!r} has no tiny vision recipe; known: {known}.")
    return vision_lm_from_config(tiny_vision_config(model_type), seed=seed, attn_implementation=attn_implementation)


def vision_lm_from_config(config: PretrainedConfig, *, seed: int = 0, attn_implementation: str = "sdpa"):
    """The model `tiny_vision_lm` builds, from a config already made (a test that fits it to a real processor's
    vocabulary first): fp32, seeded noise of std `WEIGHT_NOISE` on every parameter, eager for a family without SDPA."""
    model_class = AutoModelForImageTextToText._model_mapping[type(config)]
    if attn_implementation == "sdpa":
        attn_implementation = sdpa_or_eager(model_class)
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(
        config, attn_implementation=attn_implementation, dtype=torch.float32
    )
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():  # one draw per tensor, in registration order (tied ones once)
            parameter.add_(torch.randn(parameter.shape, generator=generator), alpha=WEIGHT_NOISE)
    return model


def tiny_vision_config(model_type: str) -> PretrainedConfig:
    """The shrunk composite config `tiny_vision_lm` builds from (text via `tiny_config`, vision via the table)."""
    family = FAMILIES[model_type]
    config = AutoConfig.for_model(model_type)
    text = tiny_config(config.text_config, vocab_size=VOCAB_SIZE)
    for name, value in family.text.items():
        setattr(text, name, {**getattr(text, name), **value} if isinstance(value, dict) else value)
    config.text_config = text
    vision = getattr(config, "vision_config", None) or config  # Fuyu embeds patches without a vision tower
    for name, value in {**TINY_VISION_SIZES, **family.vision}.items():
        if name in family.vision or getattr(vision, name, None) is not None:
            setattr(vision, name, value)
    for sub, overrides in family.nested.items():
        for name, value in overrides.items():
            setattr(getattr(config, sub), name, value)
    for name, value in {**TINY_PROJECTOR_SIZES, **family.top}.items():
        if name in family.top or getattr(config, name, None) is not None:
            setattr(config, name, value)
    names = special_token_names(config)
    assert len(names) <= LAYOUT_BASE - SPECIAL_BASE, f"{model_type}: {len(names)} special ids outside their block"
    for offset, name in enumerate(names):
        setattr(config, name, SPECIAL_BASE + offset)
    if getattr(config, "pad_token_id", None) is not None and config.pad_token_id >= VOCAB_SIZE:
        config.pad_token_id = VOCAB_SIZE - 1
    return config


def special_token_names(config: PretrainedConfig) -> list[str]:
    """Names of the config's multimodal special token ids (`image_token_id`, `boi_token_index`, ...), sorted."""
    return sorted(
        name
        for name, value in vars(config).items()
        if _SPECIAL_NAME.search(name) and name.lstrip("_") not in _NOT_MULTIMODAL and isinstance(value, int)
    )


def layout_token_ids(model_type: str) -> dict[str, int]:
    """Ids of the layout tokens a family's processor adds beside the config's own (`[IMG_BREAK]`, `<global-img>`)."""
    return {name: LAYOUT_BASE + offset for offset, name in enumerate(FAMILIES[model_type].layout)}


def image_feature_count(model: PreTrainedModel, fields: dict[str, torch.Tensor]) -> int:
    """Number of feature rows the model makes of one image's vision fields, i.e. the image tokens it consumes.

    Raises `ValueError` when the features are not rows of the text width: the model's own check compares element
    counts only, so features of another width would pass it folded into the wrong number of tokens.
    """
    hidden = model.config.text_config.hidden_size
    inner = model if hasattr(model, "get_image_features") else model.model  # FuyuForCausalLM has it on `.model`
    with torch.no_grad():
        out = inner.get_image_features(**fields)
    features = getattr(out, "pooler_output", out)
    if features is None:  # Fuyu: the patch embeddings are the features
        features = out.last_hidden_state
    features = list(features) if isinstance(features, (list, tuple)) else [features]
    widths = {f.shape[-1] for f in features}
    if widths != {hidden}:
        raise ValueError(
            f"{model.config.model_type}: image features of width {sorted(widths)}, not the text width {hidden}; "
            "set the projector's output size to the text hidden size in the family's recipe."
        )
    return sum(f.numel() for f in features) // hidden


def tiny_vision_examples(
    model: PreTrainedModel, *, count: int = 3, seed: int = 0, images: tuple[int, ...] = (1, 2, 0)
) -> list[dict[str, torch.Tensor]]:
    """Examples that `model` (from `tiny_vision_lm`) accepts alone, each as its processor returns a batch of one.

    Example `i` holds `images[i % len(images)]` images of sizes drawn from the family's table, between a short
    prompt and an answer (after both for families whose images lead, e.g. PaliGemma):

        prompt (2-5 text tokens) | image blocks, as the processor lays them out | answer (4-11 text tokens)

    Args:
        model: a model from `tiny_vision_lm`.
        count: number of examples.
        seed: seed of the tokens, image sizes and pixels.
        images: images per example, cycled; 0 gives a text-only example.

    Returns:
        `list[dict]`: per-token fields `input_ids`, `labels` (image blocks at -100) and, where the model takes them,
        `mm_token_type_ids` / `token_type_ids`, each `(L,) int64`; vision fields (`pixel_values`, `image_grid_thw`,
        `image_sizes`, `pixel_attention_mask`) exactly as the model takes them for a batch of one.

    >>> m = tiny_vision_lm("llava")
    >>> [(e["input_ids"].shape == e["labels"].shape, "pixel_values" in e) for e in tiny_vision_examples(m)]
    [(True, True), (True, True), (True, False)]
    """
    config = model.config
    if config.model_type not in FAMILIES:
        raise ValueError(
            f"model of type {config.model_type!r} has no tiny vision recipe; build it with tiny_vision_lm."
        )
    if not images or any(not isinstance(n, int) or n < 0 for n in images):
        raise ValueError(f"images={images!r}: give a non-empty tuple of image counts >= 0, e.g. (1, 2, 0).")
    family = FAMILIES[config.model_type]
    ids = layout_token_ids(config.model_type)
    generator = torch.Generator().manual_seed(seed)
    takes = inspect.signature(model.forward).parameters
    examples = []
    for index in range(count):  # one example at a time: each draws its own sizes and pixels
        parts, block = [], []
        for _ in range(images[index % len(images)]):
            size = family.sizes[int(torch.randint(len(family.sizes), (1,), generator=generator))]
            fields = family.pixels(model, size, generator)
            block += family.block(config, ids, image_feature_count(model, fields), fields, size)
            parts.append(fields)
        prompt = torch.randint(*TEXT_IDS, (int(torch.randint(2, 6, (1,), generator=generator)),), generator=generator)
        answer = torch.randint(*TEXT_IDS, (int(torch.randint(4, 12, (1,), generator=generator)),), generator=generator)
        block = torch.tensor(block, dtype=torch.int64)
        pieces = (block, prompt, answer) if family.images_first else (prompt, block, answer)
        input_ids = torch.cat(pieces)
        in_block = torch.cat([torch.full_like(p, p is block, dtype=torch.bool) for p in pieces])
        example = {"input_ids": input_ids, "labels": input_ids.masked_fill(in_block, -100)}
        is_image = (input_ids == image_id(config)).long()
        if "mm_token_type_ids" in takes:
            example["mm_token_type_ids"] = is_image
        if "token_type_ids" in takes:
            example["token_type_ids"] = (family.token_types or image_token_types)(is_image, answer.numel())
        if parts:
            example.update(family.merge(parts))
        examples.append(example)
    return examples
