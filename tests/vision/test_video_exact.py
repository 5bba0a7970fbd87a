"""Model-level proof for rows with videos: conversations encoded by the family's real processor (videos and images),
packed by `pack_dataset` and collated by `VisionDataCollatorWithFlattening.from_model`, give every example's logits,
and the loss and gradients, of each example run alone on the unprepared model (the image proofs' own reference,
`test_flattened_exact.separate_run`), for Qwen2-VL, Qwen2.5-VL and Qwen3-VL.

Negative controls: two examples' videos swapped (same grids, so every count agrees) fail the proof by far; a video
whose placeholder run does not match its grid, and videos of other grids swapped, are refused naming the example.
The model is tiny and built from its config over the processor's vocabulary and patch size (no download).
"""

import copy

import datasets
import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from flatcollate import prepare_model_for_flattening
from flatcollate.data import build_encoder, pack_dataset
from flatcollate.testing.tiny_vision import tiny_vision_config, vision_lm_from_config
from flatcollate.vision import VisionDataCollatorWithFlattening
from flatcollate.vision.controls import IMAGE_SHIFT

from .test_flattened_exact import flattened_run, separate_run
from .test_packed_exact import assert_exact
from .test_video_encode import FAMILIES, five_conversations, needs_torchvision, video_processor_for

pytestmark = needs_torchvision

SPECIAL = {
    "image_token_id": "<|image_pad|>",
    "video_token_id": "<|video_pad|>",
    "vision_start_token_id": "<|vision_start|>",
    "vision_end_token_id": "<|vision_end|>",
}


def model_for(family: str, processor, *, seed: int = 0):
    """A tiny model of `family` over the processor's vocabulary, special tokens and patch size, with seeded noise on
    every parameter (as `tiny_vision_lm`), so none is inert."""
    config = tiny_vision_config(family)
    tokenizer = processor.tokenizer
    config.text_config.vocab_size = len(tokenizer)
    for name, token in SPECIAL.items():
        setattr(config, name, tokenizer.convert_tokens_to_ids(token))
    config.text_config.pad_token_id = tokenizer.pad_token_id
    config.vision_config.patch_size = FAMILIES[family][1]
    if family == "qwen2_5_vl":
        config.vision_config.window_size = 4 * FAMILIES[family][1]  # windows of 2 x 2 merged patches
    return vision_lm_from_config(config, seed=seed)


def conversations() -> list[dict]:
    """Example 1's video and example 2's two of other shapes than examples 0 and 3 (`five_conversations`)."""
    return five_conversations((56, 84), (6, (84, 56)), (4, (56, 112)), (2, (56, 56)))


@pytest.fixture(scope="module", params=list(FAMILIES))
def case(request, tokenizer_dir):
    """The family's model, its prepared copy, the encoded examples (torch) and their packs (torch)."""
    family = request.param
    processor = video_processor_for(family, AutoTokenizer.from_pretrained(tokenizer_dir("qwen2.5-instruct")))
    encoder = build_encoder(processor)
    rows = [encoder(row, index=k) for k, row in enumerate(conversations())]
    keys = {key for row in rows for key in row}
    as_lists = [{k: np.asarray(row[k]).tolist() if k in row else None for k in keys} for row in rows]
    ds = datasets.Dataset.from_list(as_lists)
    examples = list(ds.with_format("torch"))
    lengths = [len(row["input_ids"]) for row in rows]
    packs = list(pack_dataset(ds, max(lengths) + min(lengths) + 1).with_format("torch"))
    model = model_for(family, processor)
    return family, model, prepare_model_for_flattening(copy.deepcopy(model)), examples, packs


def in_pack_order(packs, examples):
    """The examples in the order the packs hold them (matched by their ids)."""
    order = []
    for pack in packs:
        start = 0
        for length in pack["seq_lengths"].tolist():
            ids = pack["input_ids"][start : start + length]
            order += [k for k, e in enumerate(examples) if torch.equal(e["input_ids"], ids) and k not in order][:1]
            start += length
    return [examples[k] for k in order]


def test_videos_flattened_equal_each_example_alone(case):
    family, model, prepared, examples, _ = case
    batch = VisionDataCollatorWithFlattening.from_model(prepared)(examples)
    assert batch["video_grid_thw"].shape[0] == 5 and batch["pixel_values_videos"].ndim == 2
    assert_exact(family, separate_run(model, examples), flattened_run(prepared, batch))


def test_packed_videos_equal_each_example_alone(case):
    family, model, prepared, examples, packs = case
    assert len(packs) >= 2 and any(len(pack["seq_lengths"]) >= 2 for pack in packs)
    batch = VisionDataCollatorWithFlattening.from_model(prepared)(packs)
    assert_exact(family, separate_run(model, in_pack_order(packs, examples)), flattened_run(prepared, batch))


def test_videos_swapped_between_two_examples_fail_the_proof(case):
    """Negative control: examples 0 and 3 hold videos of one grid; given each other's, every count still agrees and
    the collator takes the batch, but the logits move far from each example's own run."""
    _, model, prepared, examples, _ = case
    swapped = [dict(example) for example in examples]
    swapped[0]["pixel_values_videos"], swapped[3]["pixel_values_videos"] = (
        examples[3]["pixel_values_videos"],
        examples[0]["pixel_values_videos"],
    )
    batch = VisionDataCollatorWithFlattening.from_model(prepared)(swapped)
    logits = flattened_run(prepared, batch)[0]
    assert (logits - separate_run(model, examples)[0]).abs().max().item() > IMAGE_SHIFT


def test_videos_of_other_grids_swapped_are_refused(case):
    """Examples 0 and 1 given each other's videos (grids included): each example's placeholder count disagrees."""
    _, _, prepared, examples, _ = case
    swapped = [dict(example) for example in examples]
    for key in ("pixel_values_videos", "video_grid_thw", "second_per_grid_ts"):
        if key in examples[0]:
            swapped[0][key], swapped[1][key] = examples[1][key], examples[0][key]
    with pytest.raises(ValueError, match=r"Example 0: `input_ids` hold \d+ placeholder tokens .* its 1 videos fill"):
        VisionDataCollatorWithFlattening.from_model(prepared)(swapped)


def test_a_video_whose_run_does_not_match_its_grid_is_refused(case):
    """Example 2's two videos in the other order in its vision fields: the total agrees, each video does not."""
    _, _, prepared, examples, _ = case
    example = dict(examples[2])
    grid = example["video_grid_thw"]
    sizes = grid.prod(-1).tolist()
    rows = torch.split(example["pixel_values_videos"], sizes)
    example["video_grid_thw"], example["pixel_values_videos"] = grid.flip(0), torch.cat(rows[::-1])
    with pytest.raises(ValueError, match=r"Example 1: video 0 fills \d+ placeholder tokens.*`video_grid_thw`"):
        VisionDataCollatorWithFlattening.from_model(prepared)([examples[0], example])


def test_max_patches_per_pack_counts_the_videos(case):
    """`pack_dataset(max_patches_per_pack=N)` counts `t*h*w` of every `video_grid_thw` row: no pack holds more."""
    _, _, _, examples, _ = case
    patches = [
        sum(int(e[k].prod(-1).sum()) for k in ("image_grid_thw", "video_grid_thw") if e[k] is not None)
        for e in examples
    ]
    rows = [{k: (v.tolist() if v is not None else None) for k, v in e.items()} for e in examples]
    ds = datasets.Dataset.from_list(rows)
    cap = max(patches)
    packed = pack_dataset(ds, 10_000, max_patches_per_pack=cap).with_format("numpy")
    assert len(packed) > 1 and len(pack_dataset(ds, 10_000)) == 1  # the cap, not the length, splits them
    for pack in packed:
        grids = [g for field in ("image_grid_thw", "video_grid_thw") for g in pack[field] if g is not None]
        assert sum(int(np.asarray(g).prod(-1).sum()) for g in grids) <= cap
    big = int(np.argmax(patches))
    with pytest.raises(ValueError, match=rf"row {big} carries {patches[big]} vision patches > max_patches_per_pack"):
        pack_dataset(ds, 10_000, max_patches_per_pack=patches[big] - 1)
