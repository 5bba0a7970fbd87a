"""Videos for LLaVA-OneVision: conversations encoded by its real processor (`pixel_values_videos: (videos, frames, 3,
H, W)`, no grid; each video fills `frames * ceil(side / 2)**2 + 1` placeholders: its frames' patch grids pooled 2 x 2,
then a newline), packed and collated, give every example's logits, loss and gradients of each example run alone on
the unprepared model (the image proofs' `separate_run`).

Negative controls: two examples' videos swapped fail the proof by far; a video of another frame count is refused
naming the example (its placeholder count), and so is a batch whose videos differ in frame count (the model stacks
them). The processor and the model are built offline over the Qwen2.5 tokenizer of the shared data.
"""

import copy

import datasets
import numpy as np
import pytest
import torch
from transformers import AutoTokenizer, LlavaOnevisionImageProcessorPil

from flatcollate import prepare_model_for_flattening
from flatcollate.data import build_encoder, make_supervised_dataset, pack_dataset
from flatcollate.testing.tiny_vision import tiny_vision_config, vision_lm_from_config
from flatcollate.vision import VisionDataCollatorWithFlattening
from flatcollate.vision.controls import IMAGE_SHIFT

from .test_flattened_exact import flattened_run, separate_run
from .test_packed_exact import assert_exact
from .test_video_encode import five_conversations, frames, needs_torchvision, video_row
from .test_video_exact import in_pack_order

pytestmark = needs_torchvision

SIDE = 32
"""Pixels of a frame and an image crop: the tiny vision tower's `image_size` (patches of 8: 4 x 4, pooled to 2 x 2)."""
CHAT_TEMPLATE = (  # ChatML, <image> per {"type": "image"} part, <video> per {"type": "video"} part
    "{%- for message in messages -%}{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' -%}{{ '<image>' }}{%- elif part['type'] == 'video' -%}{{ '<video>' }}"
    "{%- else -%}{{ part['text'] }}{%- endif -%}"
    "{%- endfor -%}{{ '<|im_end|>\\n' }}{%- endfor -%}"
)


def onevision_processor(tokenizer_dir):
    """LLaVA-OneVision's processor, its video slot included, at the tiny tower's resolution."""
    from transformers import LlavaOnevisionProcessor, LlavaOnevisionVideoProcessor

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir("qwen2.5-instruct"))
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>", "<video>"]})
    pinpoints = [[SIDE, SIDE], [SIDE, 2 * SIDE], [2 * SIDE, SIDE]]
    return LlavaOnevisionProcessor(
        image_processor=LlavaOnevisionImageProcessorPil(
            size={"height": SIDE, "width": SIDE}, image_grid_pinpoints=pinpoints
        ),
        video_processor=LlavaOnevisionVideoProcessor(size={"height": SIDE, "width": SIDE}),
        tokenizer=tokenizer,
        num_image_tokens=(SIDE // 8) ** 2,
        vision_feature_select_strategy="full",
        chat_template=CHAT_TEMPLATE,
    )


def onevision_model(processor, *, seed: int = 0):
    """The tiny LLaVA-OneVision over the processor's vocabulary and placeholders, with seeded noise on every
    parameter (as `tiny_vision_lm`)."""
    config = tiny_vision_config("llava_onevision")
    tokenizer = processor.tokenizer
    config.text_config.vocab_size = len(tokenizer)
    config.text_config.pad_token_id = tokenizer.pad_token_id
    config.image_token_index = tokenizer.convert_tokens_to_ids("<image>")
    config.video_token_index = tokenizer.convert_tokens_to_ids("<video>")
    config.image_grid_pinpoints = [[SIDE, SIDE], [SIDE, 2 * SIDE], [2 * SIDE, SIDE]]
    return vision_lm_from_config(config, seed=seed)


def conversations() -> list[dict]:
    """Four frames per video: the model stacks a batch's videos (`five_conversations`)."""
    return five_conversations((40, 72), (4, (72, 40)), (4, (40, 72)), (4, (24, 24)))


@pytest.fixture(scope="module")
def case(tokenizer_dir):
    """The processor, the model, its prepared copy, the encoded rows, the examples (torch) and their packs (torch)."""
    processor = onevision_processor(tokenizer_dir)
    encoder = build_encoder(processor)
    rows = [encoder(row, index=k) for k, row in enumerate(conversations())]
    keys = {key for row in rows for key in row}
    ds = datasets.Dataset.from_list([{k: np.asarray(r[k]).tolist() if k in r else None for k in keys} for r in rows])
    lengths = [len(row["input_ids"]) for row in rows]
    packs = list(pack_dataset(ds, max(lengths) + min(lengths) + 1).with_format("torch"))
    model = onevision_model(processor)
    examples = list(ds.with_format("torch"))
    return processor, model, prepare_model_for_flattening(copy.deepcopy(model)), rows, examples, packs


def test_a_video_row_encodes_as_the_processor_does(case):
    processor, _, _, rows, _, _ = case
    row = conversations()[1]
    image, video = row["images"][0], row["messages"][0]["content"][0]["video"]
    text = processor.apply_chat_template(row["messages"], tokenize=False)
    expected = processor(text=[text], images=[[image]], videos=[video], return_tensors="np")
    out = rows[1]
    vision = {"pixel_values", "image_sizes", "batch_num_images", "pixel_values_videos"}
    assert set(out) == {"input_ids", "labels"} | vision
    assert out["input_ids"] == expected["input_ids"][0].tolist()
    for key in vision:
        np.testing.assert_array_equal(np.asarray(out[key]), np.asarray(expected[key]), err_msg=key)
    ids, labels = np.array(out["input_ids"]), np.array(out["labels"])
    video_token = processor.tokenizer.convert_tokens_to_ids("<video>")
    assert (ids == video_token).sum() == 4 * (SIDE // 8 // 2) ** 2 + 1  # four frames of 2 x 2, a newline...
    assert (labels[ids == video_token] == -100).all()  # ...none trained
    assert processor.tokenizer.decode(ids[labels != -100]) == "It rolls away.<|im_end|>\n"


def test_videos_flattened_equal_each_example_alone(case):
    _, model, prepared, _, examples, _ = case
    batch = VisionDataCollatorWithFlattening.from_model(prepared)(examples)
    assert tuple(batch["pixel_values_videos"].shape) == (5, 4, 3, SIDE, SIDE)
    assert_exact("llava_onevision", separate_run(model, examples), flattened_run(prepared, batch))


def test_packed_videos_equal_each_example_alone(case):
    _, model, prepared, _, examples, packs = case
    assert len(packs) >= 2 and any(len(pack["seq_lengths"]) >= 2 for pack in packs)
    batch = VisionDataCollatorWithFlattening.from_model(prepared)(packs)
    reference = separate_run(model, in_pack_order(packs, examples))
    assert_exact("llava_onevision", reference, flattened_run(prepared, batch))


def test_videos_swapped_between_two_examples_fail_the_proof(case):
    """Negative control: examples 0 and 3 given each other's videos; every count agrees, the logits do not."""
    _, model, prepared, _, examples, _ = case
    swapped = [dict(example) for example in examples]
    swapped[0]["pixel_values_videos"] = examples[3]["pixel_values_videos"]
    swapped[3]["pixel_values_videos"] = examples[0]["pixel_values_videos"]
    logits = flattened_run(prepared, VisionDataCollatorWithFlattening.from_model(prepared)(swapped))[0]
    assert (logits - separate_run(model, examples)[0]).abs().max().item() > IMAGE_SHIFT


def test_a_video_of_another_frame_count_is_refused_naming_the_example(case):
    """Example 3's video cut to two frames fills fewer placeholders than its text holds: refused before the model,
    which would otherwise check only the batch's total."""
    _, _, prepared, _, examples, _ = case
    cut = dict(examples[3])
    cut["pixel_values_videos"] = cut["pixel_values_videos"][:, :2]
    with pytest.raises(ValueError, match=r"Example 1: `input_ids` hold 17 placeholder tokens .* its 1 videos fill 9"):
        VisionDataCollatorWithFlattening.from_model(prepared)([examples[0], cut])


def test_videos_of_different_frame_counts_in_one_batch_are_refused(case):
    """Each example right on its own, but the model stacks the batch's videos: frame counts must agree."""
    processor, _, prepared, _, examples, _ = case
    six = build_encoder(processor)(video_row(frames(5, 6)), index=0)
    six = {k: torch.as_tensor(np.asarray(v)) for k, v in six.items()}
    with pytest.raises(ValueError, match=r"`pixel_values_videos`.*frames.*sample every video to one number of frames"):
        VisionDataCollatorWithFlattening.from_model(prepared)([examples[0], six])


def test_make_supervised_dataset_keeps_the_videos(case):
    """Through `datasets` (frames as nested lists in the parts): each row's ids and frames as the encoder gives them."""
    processor, _, _, rows, _, _ = case
    raw = conversations()
    for row in raw:
        for part in row["messages"][0]["content"]:
            if part["type"] == "video":
                part["video"] = part["video"].tolist()
    ds = make_supervised_dataset(processor, datasets.Dataset.from_list(raw), seed=None).with_format("numpy")
    for k, row in enumerate(rows):
        assert ds[k]["input_ids"].tolist() == row["input_ids"]
        expected = row.get("pixel_values_videos")
        if expected is None:
            assert ds[k]["pixel_values_videos"] is None
        else:
            np.testing.assert_allclose(np.asarray(ds[k]["pixel_values_videos"]), expected, rtol=1e-6)
