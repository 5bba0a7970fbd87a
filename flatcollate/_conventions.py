"""Conventions shared by every module: one place for the ignore index and the dtypes of boundary tensors."""

import numpy as np
import torch

IGNORE_INDEX = -100
"""Label value that the loss skips (`torch.nn.CrossEntropyLoss(ignore_index=-100)`, HF convention)."""

IDS_DTYPE = torch.int64
"""dtype of `input_ids`, `labels` and `position_ids`."""

CU_SEQLENS_DTYPE = torch.int32
"""dtype of `cu_seq_lens_q/k` and `seq_idx` (what flash-attn's varlen kernels and the mamba kernels take)."""

NP_IDS_DTYPE = np.int64
NP_CU_SEQLENS_DTYPE = np.int32

STATE_ATTRIBUTE = "_flatcollate"
"""The one attribute flatcollate sets, on prepared models only: the model's `PreparedState`."""

BOUNDARIES_KEY = "flat_boundaries"
"""Keyword argument under which a prepared model's forward hands its one `Boundaries` to every layer."""

SP_CONTEXT_KEY = "sequence_parallel"
"""Keyword argument under which a sequence-parallel model's forward hands every attention layer its group."""

HOST_BOUNDARIES_KEY = "cu_seq_lens_host"
"""Keyword argument holding the forward's `cu_seq_lens` as a CPU int32 tensor (the guard's one host copy), for the
opaque kernel a compiled model calls, where no Python object reaches."""

FLASH_KWARG_KEYS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")
"""Keys a flattening collator emits so attention kernels never recompute boundaries."""

IMAGE_FIELDS = (
    "pixel_values",
    "image_grid_thw",
    "image_sizes",
    "pixel_attention_mask",
    "spatial_shapes",
    "image_position_ids",
    "pixel_values_videos",
    "video_grid_thw",
    "second_per_grid_ts",
    "image_merge_sizes",
    "video_merge_sizes",
    "video_compression_mask",
    "pixel_mask",
    "batch_num_images",
)
"""Per-image (per-video, per-feature, per-example) fields of vision-language processors: `flatcollate.vision`
concatenates them in example order; the text collators refuse them rather than drop them."""

TOKEN_TYPE_FIELDS = ("mm_token_type_ids", "token_type_ids")
"""Per-token fields beside `input_ids` that tell image tokens from text: concatenated like `input_ids`, 0 (text) on
padding."""
