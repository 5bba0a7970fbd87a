"""What flatcollate knows of each model family, one record per `model_type`.

Most families need nothing: their attention layers dispatch through transformers' attention interface and take the
forward's `cu_seq_lens_*` and `position_ids`, so the packed backend keeps sequences apart whatever the family's mask
builder does. A family gets a record here where it differs, for one of these reasons:

- text: it cannot be exact on flattened batches (`unsupported`), keeps transformers' backend (`own_backend`), sizes a
  buffer by the row rather than the sequence (`row_length_limit`), or carries state along the row in layers that run
  once per sequence (`mixers`, `flatcollate.modeling.stateful_layers`);
- image-text: how its processor lays out images and how many placeholders each fills (`flatcollate.vision.layouts`,
  `flatcollate.vision.counts`), which image runs attend both ways (`block_token_type`), which parameters its forward
  never reaches (`unused_by_design`), and whether `FlatDPOTrainer` is proven on its images (`dpo_images`);
- vision towers (`vision_config.model_type`): the class tokens before the patches (`class_tokens`).

Rules that compute from a model or a config (a refusal, a row-length limit, image counts) stay with the feature
that applies them and read the record. Records hold strings and numbers: this module imports nothing from flatcollate.

>>> family_of("mamba").mixers
('MambaMixer',)
>>> family_of("llama") == Family()
True
"""

from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class Family:
    """What flatcollate knows of one `model_type`; every field defaults to "nothing special".

    Attributes:
        unsupported (`str`, *optional*): why flattened batches cannot be exact for the family (refused by
            `prepare_model_for_flattening`).
        own_backend (`str`, *optional*): why the family keeps transformers' attention backend (exact there with
            restarting `position_ids`) instead of the packed one.
        row_length_limit (`tuple[str, str]`, *optional*): `(config attribute, what it sizes)` of a buffer built for at
            most that many tokens per row, not per sequence: restarting positions do not help, so a flattened row must
            fit (measured: every other exact family runs a row longer than its position limit).
        mixers (`tuple[str, ...]`): class names of the layers that carry state along the row (state-space, linear
            attention, short convolutions), run once per sequence.
        mixer_kernels (`tuple[tuple[str, str, str], ...]`): `(module, function, parameter)` of each optional kernel
            the mixers hand the row's boundaries to; where all take them, a mixer runs once on the whole row.
        block_token_type (`int`, *optional*): the `token_type_ids` value whose runs attend bidirectionally (image
            blocks; `flatcollate.attention.bidirectional_blocks`).
        image_tokens (`tuple[str, ...]`, *optional*): how many placeholders each image fills: a rule of
            `flatcollate.vision.counts.RULES` (`"grid"`, `"sized"`, `"tiles"`, `"anyres"`, `"fixed"`, ...), then what
            it reads, config attributes as dotted paths from the composite config (`"vision_config.patch_size"`).
            On a vision tower: the rule of a family that counts by its tower (`("tower", ...)`, LLaVA).
        grid_layout (`bool`): the vision collator reads images and videos by their `*_grid_thw` rows
            (`VisionLayout.merge_size` from `vision_config.spatial_merge_size`).
        fixed_count (`bool`): every image fills the same number of placeholders (one feature map per image).
        pooled_frames (`bool`): each video frame's patch grid is pooled 2 x 2 (rounding up) and each video ends with
            one newline placeholder (LLaVA-OneVision's `apply_pooling`; `flatcollate.vision.layouts`).
        batch_first (`tuple[str, ...]`): fields the processor returns as `(batch, images, ...)`: an example's images
            (tiles, Fuyu's patches) sit on dimension 1.
        padded (`tuple[str, ...]`): fields the processor zero-pads to the batch's largest image (crops, height and
            width, or patches); the model reads each image's real extent from `image_sizes` (`spatial_shapes`).
        class_tokens (`int`, *optional*): for a vision tower, the class tokens it puts before the patches.
        unused_by_design (`tuple[tuple[str, str], ...]`): `(parameter name pattern, reason)` pairs: image-path
            parameters (`re.fullmatch`) the family's forward never reaches with the examples' images.
        dpo_images (`bool`): `FlatDPOTrainer`'s step on image-text pairs is tested equal to `DPOTrainer`'s padded
            step (tests/integrations/test_flat_dpo_vision.py); other families' image rows are refused.
    """

    unsupported: str | None = None
    own_backend: str | None = None
    row_length_limit: tuple[str, str] | None = None
    mixers: tuple[str, ...] = ()
    mixer_kernels: tuple[tuple[str, str, str], ...] = ()
    block_token_type: int | None = None
    image_tokens: tuple[str, ...] | None = None
    grid_layout: bool = False
    fixed_count: bool = False
    pooled_frames: bool = False
    batch_first: tuple[str, ...] = ()
    padded: tuple[str, ...] = ()
    class_tokens: int | None = None
    unused_by_design: tuple[tuple[str, str], ...] = ()
    dpo_images: bool = False


_GATED_DELTA_KERNELS = (  # the forward's `**kwargs` to the convolution, its `cu_seq_lens_q` as the rule's `cu_seqlens`
    ("causal_conv1d", "causal_conv1d_fn", "seq_idx"),
    ("fla.ops.gated_delta_rule", "chunk_gated_delta_rule", "cu_seqlens"),
)
_RECURRENT = "its recurrent layers carry state across sequence boundaries"
_ROW_WIDE_CONV_MASK = (
    "its short-convolution and attention layers share a `conv_mask` over the whole row; running the convolutions "
    "once per sequence is not enough (measured)"
)
_GRID = ("grid", "vision_config.spatial_merge_size")
_PIXTRAL = ("sized", "vision_config.patch_size", "spatial_merge_size")
_MM_TOKENS = ("fixed", "mm_tokens_per_image")
_SAM = ("sam_neck",)
_TILES = ("tiles", "scale_factor")
_PIXELS = ("pixel_values",)
_PIXELS_MASKED = ("pixel_values", "pixel_attention_mask")
_POST_LAYERNORM = (
    (
        r"model\.(vision|image)_tower\.post_layernorm\.(weight|bias)",
        "the family takes the vision layers' hidden states (`vision_feature_layer(s)`), which the tower's final norm "
        "does not touch",
    ),
)

FAMILIES: dict[str, Family] = {
    # ---- text families ----
    "bailing_hybrid": Family(mixers=("BailingHybridDeltaAttention",)),
    "bamba": Family(mixers=("BambaMixer",)),
    "big_bird": Family(row_length_limit=("max_position_embeddings", "its token-type buffer")),
    "cpmant": Family(unsupported="its attention adds a position bias and segment mask over the whole row"),
    "deepseek_v4": Family(
        unsupported="its compressed-attention layers summarise every `compress_rate` tokens of the row into extra "
        "keys, across sequence boundaries (measured with a sequence longer than its sliding window)"
    ),
    "doge": Family(own_backend="its attention adds a learned dynamic mask, which the packed kernels cannot apply"),
    "falcon_h1": Family(mixers=("FalconH1Mixer",)),
    "falcon_mamba": Family(mixers=("FalconMambaMixer",)),
    "gpt_neo": Family(row_length_limit=("max_position_embeddings", "its local-attention bias")),
    "granitemoehybrid": Family(mixers=("GraniteMoeHybridMambaLayer",)),
    "inkling_text": Family(unsupported=_ROW_WIDE_CONV_MASK),
    "inkling2_text": Family(unsupported=_ROW_WIDE_CONV_MASK),
    "jamba": Family(mixers=("JambaMambaMixer",)),
    "kimi_linear": Family(mixers=("KimiLinearDeltaAttention",)),
    "lfm2": Family(mixers=("Lfm2ShortConv",)),
    "lfm2_moe": Family(mixers=("Lfm2MoeShortConv",)),
    "lfm3": Family(mixers=("Lfm3ShortConv",)),
    "mamba": Family(mixers=("MambaMixer",)),
    "mamba2": Family(mixers=("Mamba2Mixer",)),
    "minimax": Family(mixers=("MiniMaxLightningAttention",)),
    "mpt": Family(row_length_limit=("max_seq_len", "its ALiBi attention bias")),
    "nemotron_h": Family(mixers=("NemotronHMamba2Mixer",)),
    "olmo_hybrid": Family(mixers=("OlmoHybridGatedDeltaNet",), mixer_kernels=_GATED_DELTA_KERNELS),
    "openai-gpt": Family(
        unsupported="its attention applies a fixed causal bias over the whole row, outside the attention interface"
    ),
    "qwen3_5_moe_text": Family(mixers=("Qwen3_5MoeGatedDeltaNet",), mixer_kernels=_GATED_DELTA_KERNELS),
    "qwen3_5_text": Family(mixers=("Qwen3_5GatedDeltaNet",), mixer_kernels=_GATED_DELTA_KERNELS),
    "qwen3_next": Family(mixers=("Qwen3NextGatedDeltaNet",), mixer_kernels=_GATED_DELTA_KERNELS),
    "qwen4_exp_text": Family(mixers=("Qwen4ExpTextGatedDeltaNet",), mixer_kernels=_GATED_DELTA_KERNELS),
    "recurrent_gemma": Family(unsupported=_RECURRENT),
    "roformer": Family(
        row_length_limit=("max_position_embeddings", "its sinusoidal position table, read by row position")
    ),
    "rwkv": Family(unsupported=_RECURRENT),
    "trocr": Family(
        unsupported="it derives positions from `input_ids` (ignoring `position_ids`) and masks the whole row"
    ),
    "xlm": Family(
        unsupported="it builds its own masks from lengths over the whole row, outside the attention interface"
    ),
    "xlstm": Family(unsupported=_RECURRENT),
    "zamba": Family(mixers=("ZambaMambaMixer",)),
    "zamba2": Family(mixers=("Zamba2MambaMixer",)),
    "zaya": Family(unsupported=_RECURRENT),
    # ---- image-text families ----
    "aria": Family(
        image_tokens=("queries", "projector_patch_to_query_dict"), fixed_count=True, unused_by_design=_POST_LAYERNORM
    ),
    "aya_vision": Family(
        image_tokens=("shuffled_crop", "downsample_factor"), fixed_count=True, unused_by_design=_POST_LAYERNORM
    ),
    "cohere2_vision": Family(image_tokens=("divided_sides", "downsample_factor"), fixed_count=True),
    "cosmos3_edge": Family(image_tokens=_GRID),
    "cosmos3_omni": Family(image_tokens=_GRID),
    "exaone4_5": Family(image_tokens=_GRID),
    "fuyu": Family(image_tokens=("per_patch",), batch_first=_PIXELS),
    "gemma3": Family(image_tokens=_MM_TOKENS, block_token_type=1, fixed_count=True, dpo_images=True),
    "glm4v": Family(image_tokens=_GRID, grid_layout=True),
    "glm4v_moe": Family(image_tokens=_GRID, grid_layout=True),
    "glm46v": Family(image_tokens=_GRID, grid_layout=True),
    "glm_ocr": Family(image_tokens=_GRID),
    "glmga": Family(image_tokens=_GRID),
    "got_ocr2": Family(image_tokens=_SAM, fixed_count=True),
    "granite_docling": Family(
        image_tokens=("masked_tiles", "vision_config.scale_factor"),
        batch_first=_PIXELS_MASKED,
        unused_by_design=(
            (
                r"model\.vision_model\.connector\.fine\..*",
                "the fine connector path runs only for a batch the processor routes fine (`fine_route=True`, "
                "`tile_fine_mask`); the examples take the coarse path",
            ),
        ),
    ),
    "hyperclovax_vision_v2": Family(image_tokens=_GRID),
    "idefics2": Family(
        image_tokens=("latent_tiles", "perceiver_config.resampler_n_latents"), batch_first=_PIXELS_MASKED
    ),
    "idefics3": Family(image_tokens=_TILES, batch_first=_PIXELS_MASKED),
    "internvl": Family(image_tokens=("scaled_sides", "downsample_ratio"), fixed_count=True),
    "kimi_k25": Family(image_tokens=("grid", "vision_config.merge_kernel_size")),
    "lfm2_vl": Family(image_tokens=("spatial", "downsample_factor"), padded=_PIXELS_MASKED),
    "lfm3_vl": Family(image_tokens=_GRID),
    "lighton_ocr": Family(image_tokens=_PIXTRAL, padded=_PIXELS),
    "llama4": Family(image_tokens=("scaled_sides", "vision_config.pixel_shuffle_ratio"), fixed_count=True),
    "llava": Family(image_tokens=("tower", "crop"), fixed_count=True, unused_by_design=_POST_LAYERNORM),
    "llava_next": Family(image_tokens=("anyres",), padded=_PIXELS, unused_by_design=_POST_LAYERNORM),
    "llava_next_video": Family(image_tokens=("anyres",), padded=_PIXELS, unused_by_design=_POST_LAYERNORM),
    "llava_onevision": Family(
        image_tokens=("anyres", "vision_aspect_ratio"),
        pooled_frames=True,
        padded=_PIXELS,
        unused_by_design=_POST_LAYERNORM,
    ),
    "minimax_m3_vl": Family(image_tokens=_GRID),
    "mistral3": Family(image_tokens=_PIXTRAL, padded=_PIXELS),
    "mistral_large4": Family(
        own_backend="its sparse-attention indexer reads the attention mask, which the packed backend does not build",
        image_tokens=_PIXTRAL,
        padded=_PIXELS,
    ),
    "muse_glimmer": Family(image_tokens=("grid", "vision_config.merge_size")),
    "paddleocr_vl": Family(image_tokens=_GRID, grid_layout=True),
    "paligemma": Family(image_tokens=("patches",), block_token_type=0, fixed_count=True),
    "pp_chart2table": Family(image_tokens=_SAM, fixed_count=True),
    "qwen2_vl": Family(image_tokens=_GRID, grid_layout=True, dpo_images=True),
    "qwen2_5_vl": Family(image_tokens=_GRID, grid_layout=True, dpo_images=True),
    "qwen3_vl": Family(image_tokens=_GRID, grid_layout=True),
    "qwen3_vl_moe": Family(image_tokens=_GRID, grid_layout=True),
    "qwen3_5": Family(image_tokens=_GRID),
    "qwen3_5_moe": Family(image_tokens=_GRID),
    "shieldgemma2": Family(image_tokens=_MM_TOKENS, block_token_type=1, fixed_count=True),
    "smolvlm": Family(image_tokens=_TILES, batch_first=_PIXELS_MASKED),
    "video_llama_3": Family(image_tokens=("grid_merges", "image_merge_sizes")),
    "video_llava": Family(
        image_tokens=("crop",),
        fixed_count=True,
        unused_by_design=(
            *_POST_LAYERNORM,
            (r"model\.video_tower\..*", "the video tower runs on `pixel_values_videos`; the examples hold images only"),
        ),
    ),
    "vipllava": Family(image_tokens=("default_crop",), fixed_count=True, unused_by_design=_POST_LAYERNORM),
    # ---- vision towers ----
    "clip_vision_model": Family(class_tokens=1),
    "pixtral": Family(image_tokens=("sized", "vision_config.patch_size")),  # LLaVA on a Pixtral tower (Pixtral-12B)
    "siglip_vision_model": Family(class_tokens=0),
}
"""`model_type` -> its record; a family not listed has the empty record `Family()`."""

_NOTHING = Family()

MIXER_CLASSES = frozenset(name for family in FAMILIES.values() for name in family.mixers)
"""Class names of every state-carrying layer the registry knows: a module whose class or a base class has one is
such a layer, whatever the model's `model_type` (a subclass registered under a name of its own, an edited config)."""


def is_mixer(module: Any) -> bool:
    """Whether `module` is a state-carrying layer the registry knows, by its class and its base classes."""
    return any(cls.__name__ in MIXER_CLASSES for cls in type(module).__mro__)


def family_of(config_or_model_type: Any) -> Family:
    """The record of a family.

    A `model_type` gives its own record. A config gives its own record with every field it leaves empty taken from its
    language model's (`config.get_text_config()`): an image-text model built on `qwen3_5_text` or `lfm3` has that
    model's state-carrying `mixers`.

    A model gives its config's record completed by those of the classes it is built from (`_family_of_model`).

    Args:
        config_or_model_type (`str`, `PretrainedConfig` or `PreTrainedModel`): a `model_type` (`"qwen2_vl"`), a
            model's config, or the model.

    Returns:
        `Family`: the record; `Family()` (nothing special) for a family not in `FAMILIES`.

    >>> from transformers import AutoConfig
    >>> family_of(AutoConfig.for_model("qwen3_5")).mixers, family_of("qwen3_5").mixers
    (('Qwen3_5GatedDeltaNet',), ())
    """
    if isinstance(config_or_model_type, str):
        return FAMILIES.get(config_or_model_type, _NOTHING)
    if hasattr(config_or_model_type, "config") and hasattr(type(config_or_model_type), "config_class"):
        return _family_of_model(config_or_model_type)
    config = config_or_model_type
    own = FAMILIES.get(getattr(config, "model_type", ""), _NOTHING)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return _merged([own, FAMILIES.get(getattr(text, "model_type", ""), _NOTHING)])  # its own values first


def _merged(records: list[Family]) -> Family:
    """Field by field, the first record's value that is not the default."""
    values = {f.name: [getattr(r, f.name) for r in records if getattr(r, f.name) != f.default] for f in fields(Family)}
    return Family(**{name: found[0] for name, found in values.items() if found})


def _family_of_model(model: Any) -> Family:
    """A model's record: its config's (with its language model's, as `family_of(config)`), completed by the record of
    every class the model's class derives from (`config_class.model_type`). What a model is, not only what its config
    calls it: a subclass registered under a `model_type` of its own (`trust_remote_code`), or a config whose
    `model_type` was edited, still has the records of the classes it is built from."""
    types = [getattr(getattr(cls, "config_class", None), "model_type", None) for cls in type(model).__mro__]
    return _merged([family_of(model.config), *(FAMILIES.get(name, _NOTHING) for name in types if name)])
