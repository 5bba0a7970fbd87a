"""`flatcollate.synthetic.images`: image grids are the processor's resize, examples count their image tokens."""

import math

import numpy as np
import pytest
import torch
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

from flatcollate.bench.tasks.vision import VisionBenchConfig, build_vision_model
from flatcollate.profiles import load_profile
from flatcollate.synthetic.images import (
    MAX_PIXELS,
    MIN_PIXELS,
    draw_image_grids,
    draw_lengths,
    draw_vision_pool,
    vision_examples,
)

CONFIG = VisionBenchConfig(profile="gsm8k", max_length=48, max_pixels=28 * 28 * 12)


@pytest.fixture(scope="module")
def model():
    return build_vision_model(CONFIG, device=torch.device("cpu"), dtype="float32")


def _pool(n, seed):
    return draw_vision_pool(load_profile("gsm8k"), n, max_length=48, images=CONFIG.images, seed=seed)


def test_image_grids_are_the_processor_resize_of_the_drawn_sides():
    grids, sides = draw_image_grids(200, seed=3, return_sides=True)
    assert grids.shape == (200, 3) and grids.dtype == np.int64 and (grids[:, 0] == 1).all()
    for (height, width), grid in zip(sides.tolist(), grids.tolist(), strict=True):  # the processor's own resize
        resized = smart_resize(height, width, factor=28, min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)
        assert grid == [1, resized[0] // 14, resized[1] // 14]
    low, high = math.isqrt(MIN_PIXELS), math.isqrt(MAX_PIXELS)
    assert sides.min() >= low and sides.max() <= high
    patches = grids[:, 1] * grids[:, 2]
    assert (patches % 4 == 0).all() and patches.max() // 4 <= 1280 and patches.min() // 4 >= 4
    with pytest.raises(ValueError, match="max_pixels"):
        draw_image_grids(2, seed=0, max_pixels=MIN_PIXELS - 1)


def test_pool_counts_images_and_tokens_against_a_per_example_loop():
    pool = _pool(40, seed=5)
    assert set(np.unique(pool.images).tolist()) == {0, 1, 2, 3} and pool.images.sum() == len(pool.grids)
    tokens = pool.grids[:, 1] * pool.grids[:, 2] // 4 + 2  # vision start and end around each image's tokens
    first = np.concatenate([[0], np.cumsum(pool.images)])
    expected = [int(pool.text.lengths[i] + tokens[first[i] : first[i + 1]].sum()) for i in range(40)]
    assert pool.lengths.tolist() == expected
    lengths = draw_lengths(load_profile("gsm8k"), 40, max_length=48, images=CONFIG.images, seed=5)
    assert lengths.tolist() == expected


def test_examples_hold_one_placeholder_per_image_token(model):
    pool = _pool(6, seed=4)
    for example, images in zip(vision_examples(model, pool, np.arange(6), seed=1), pool.images, strict=True):
        grid = example.get("image_grid_thw", torch.zeros(0, 3, dtype=torch.int64))
        assert len(grid) == images
        image = example["input_ids"] == model.config.image_token_id
        assert int(image.sum()) == int((grid.prod(-1) // 4).sum())
        assert (example["labels"][image] == -100).all()
        assert example["mm_token_type_ids"].tolist() == image.long().tolist()
        if images:
            assert example["pixel_values"].shape[0] == int(grid.prod(-1).sum())
