"""Synthetic image-text examples (the image-text benchmark's), laid out as the Qwen2-VL / Qwen2.5-VL processor lays
them out (a padded batch of several: `flatcollate.bench.batches.pad_examples`).

One example is its images, each expanded by the processor, then its text (prompt, then completion)::

    <vision_start> <image_pad> x (h * w / 4) <vision_end>   (0 to 3 such blocks)   prompt ...   completion ...
    labels: -100 on every image block and on the prompt, the token ids on the completion

Image sizes are an assumption, not a measurement: height and width are drawn independently and uniformly between the
square roots of the Qwen2-VL image processor's default `min_pixels` (56 * 56) and `max_pixels` (28 * 28 * 1280), i.e.
56 to 1001 pixels a side, then resized by the processor's own `smart_resize` (sides multiples of 28, area within the
limits): 4 to 1280 image tokens per image (h x w patches of 14 pixels, 2 x 2 merged). Images per example are uniform
on `0..max_images`. Text is truncated to `max_length`; images never are (a processor never cuts an image).
"""

import math
from dataclasses import dataclass

import numpy as np
import torch
from transformers import PreTrainedModel
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil, smart_resize

from .._conventions import IGNORE_INDEX
from ..profiles.length_profile import LengthProfile
from ..testing.tiny_vision import TEXT_IDS
from .sequences import SyntheticSequences, synthetic_sequences

_PROCESSOR = Qwen2VLImageProcessorPil
MIN_PIXELS: int = _PROCESSOR.size["shortest_edge"]
"""The Qwen2-VL image processor's default `min_pixels` (56 * 56)."""
MAX_PIXELS: int = _PROCESSOR.size["longest_edge"]
"""The Qwen2-VL image processor's default `max_pixels` (28 * 28 * 1280)."""
PATCH: int = _PROCESSOR.patch_size
MERGE: int = _PROCESSOR.merge_size


@dataclass(frozen=True)
class ImageDistribution:
    """How many images an example holds and how large they are (an assumption, see the module docstring).

    Args:
        max_images (`int`): images per example are uniform on `0..max_images`.
        min_pixels (`int`), max_pixels (`int`): the image processor's limits; sides are drawn between their square
            roots.
    """

    max_images: int = 3
    min_pixels: int = MIN_PIXELS
    max_pixels: int = MAX_PIXELS

    def draw(self, n: int, *, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """Images per example `(n,)` and the grids of all of them `(M, 3)` in example order, int64."""
        counts = np.random.default_rng(seed + 2).integers(0, self.max_images + 1, size=n)
        grids = draw_image_grids(
            int(counts.sum()), seed=seed + 3, min_pixels=self.min_pixels, max_pixels=self.max_pixels
        )
        return counts, grids

    def describe(self) -> str:
        """One line saying what is drawn."""
        low, high = math.isqrt(self.min_pixels), math.isqrt(self.max_pixels)
        return (
            f"0-{self.max_images} images per example (uniform); sides uniform in {low}-{high} px, resized by "
            f"Qwen2-VL's smart_resize (min_pixels {self.min_pixels}, max_pixels {self.max_pixels}): an assumption"
        )


@dataclass(frozen=True)
class VisionPool:
    """Drawn examples, before pixels and token ids of the images are made.

    Args:
        text (`SyntheticSequences`): every example's text (prompt labelled -100).
        images (`np.ndarray` of shape `(N,)`, int64): images per example.
        grids (`np.ndarray` of shape `(M, 3)`, int64): `(t, h, w)` patch grid of every image, in example order.
        lengths (`np.ndarray` of shape `(N,)`, int64): tokens per example, image blocks included.
    """

    text: SyntheticSequences
    images: np.ndarray
    grids: np.ndarray
    lengths: np.ndarray


def draw_image_grids(
    n: int, *, seed: int, min_pixels: int = MIN_PIXELS, max_pixels: int = MAX_PIXELS, return_sides: bool = False
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Patch grids `(1, h, w)` of `n` images whose sides are uniform in `[isqrt(min_pixels), isqrt(max_pixels)]`,
    resized by the Qwen2-VL processor's `smart_resize`.

    Returns:
        `np.ndarray` of shape `(n, 3)`, int64; with `return_sides`, also the drawn `(n, 2)` pixel sides.

    >>> grids = draw_image_grids(3, seed=0)
    >>> grids.shape, bool((grids[:, 1] % 2 == 0).all())
    ((3, 3), True)
    """
    low, high = math.isqrt(min_pixels), math.isqrt(max_pixels)
    if not 1 <= low <= high or min_pixels > max_pixels:
        raise ValueError(
            f"Need 1 <= min_pixels <= max_pixels, got min_pixels={min_pixels}, max_pixels={max_pixels}; pass the "
            "image processor's limits (Qwen2-VL: 3136 and 1003520)."
        )
    sides = np.random.default_rng(seed).integers(low, high + 1, size=(n, 2))
    factor = PATCH * MERGE
    # One call per image: the processor's own resize rule, not a copy of it.
    resized = [smart_resize(h, w, factor=factor, min_pixels=min_pixels, max_pixels=max_pixels) for h, w in sides]
    grids = np.ones((n, 3), dtype=np.int64)
    grids[:, 1:] = np.asarray(resized, dtype=np.int64).reshape(n, 2) // PATCH
    return (grids, sides) if return_sides else grids


def block_lengths(grids: np.ndarray) -> np.ndarray:
    """`(M,)` int64 tokens of each image's block: its `t * h * w / MERGE**2` image tokens plus start and end."""
    return grids.prod(axis=1) // MERGE**2 + 2


def draw_vision_pool(
    profile: LengthProfile, n: int, *, max_length: int, images: ImageDistribution, seed: int
) -> VisionPool:
    """Draw `n` examples: text from `profile` (ids in the tiny model's text range), images from `images`.

    >>> from flatcollate.profiles import load_profile
    >>> pool = draw_vision_pool(load_profile("gsm8k"), 4, max_length=64, images=ImageDistribution(), seed=0)
    >>> bool((pool.lengths == pool.text.lengths + pool_lengths(pool.images, pool.grids)).all())
    True
    """
    text = synthetic_sequences(profile, n, max_length=max_length, vocab_size=TEXT_IDS[1], seed=seed)
    counts, grids = images.draw(n, seed=seed)
    return VisionPool(text, counts, grids, text.lengths + pool_lengths(counts, grids))


def draw_lengths(
    profile: LengthProfile, n: int, *, max_length: int, images: ImageDistribution, seed: int
) -> np.ndarray:
    """`(n,)` int64 example lengths as `draw_vision_pool(...).lengths` gives them, without making token ids."""
    prompt, completion = profile.sample(n, seed=seed)
    return np.minimum(prompt + completion, max_length) + pool_lengths(*images.draw(n, seed=seed))


def pool_lengths(images: np.ndarray, grids: np.ndarray) -> np.ndarray:
    """`(N,)` int64 image-block tokens of each example, from its image count `(N,)` and the grids `(M, 3)`."""
    owner = np.repeat(np.arange(len(images)), images)
    return np.bincount(owner, weights=block_lengths(grids), minlength=len(images)).astype(np.int64)


def vision_examples(model: PreTrainedModel, pool: VisionPool, indices: np.ndarray, *, seed: int) -> list[dict]:
    """Per-example processor outputs of `pool[indices]`, as `tiny_vision_examples` lays them out.

    Returns:
        `list[dict]`: `input_ids`, `labels`, `mm_token_type_ids` `(L,) int64`; with images, `pixel_values`
        `(patches, C * T * P * P) float32` (random) and `image_grid_thw` `(images, 3) int64`.
    """
    config, vision = model.config, model.config.vision_config
    width = vision.in_channels * vision.temporal_patch_size * vision.patch_size**2
    first = np.concatenate([[0], np.cumsum(pool.images)])
    generator = torch.Generator().manual_seed(seed)
    examples = []
    for index, text in zip(indices, pool.text.features(indices), strict=True):  # one dict per example
        grids = torch.from_numpy(pool.grids[first[index] : first[index + 1]])
        counts = grids.prod(-1) // MERGE**2
        ends = torch.cumsum(counts + 2, 0)
        block = torch.full((int(ends[-1]) if len(ends) else 0,), config.image_token_id, dtype=torch.int64)
        block[ends - counts - 2] = config.vision_start_token_id
        block[ends - 1] = config.vision_end_token_id
        input_ids = torch.cat([block, torch.from_numpy(text["input_ids"])])
        labels = torch.cat([torch.full_like(block, IGNORE_INDEX), torch.from_numpy(text["labels"])])
        example = {
            "input_ids": input_ids,
            "labels": labels,
            "mm_token_type_ids": (input_ids == config.image_token_id).long(),
        }
        if len(grids):
            patches = int(grids.prod(-1).sum())
            example["pixel_values"] = torch.randn(patches, width, generator=generator)
            example["image_grid_thw"] = grids
        examples.append(example)
    return examples
