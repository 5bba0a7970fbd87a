"""VisionDataCollatorWithFlattening on tiny literal examples: keys, every tensor, and the errors that keep an image in
its own example's sequence."""

import numpy as np
import pytest
import torch
from torch.testing import assert_close
from transformers import AutoConfig

from flatcollate.vision import VisionDataCollatorWithFlattening, VisionLayout

IMG = 9
QWEN = VisionLayout(image_token_id=IMG, merge_size=2)
FIXED = VisionLayout(image_token_id=IMG, same_count=True)


def qwen_example(text_before, grids, text_after, *, fill=0.0):
    """A Qwen-style example: `t*h*w / 4` placeholders per image, `t*h*w` patch rows of width 6."""
    ids, types, patches = list(range(1, text_before + 1)), [0] * text_before, 0
    for t, h, w in grids:
        ids += [IMG] * (t * h * w // 4)
        types += [1] * (t * h * w // 4)
        patches += t * h * w
    ids += [5] * text_after
    types += [0] * text_after
    example = {"input_ids": ids, "mm_token_type_ids": types}
    if grids:
        example["pixel_values"] = torch.full((patches, 6), fill)
        example["image_grid_thw"] = torch.tensor(grids)
    return example


def test_grid_family_batch_keys_and_tensors():
    examples = [qwen_example(2, [(1, 2, 2)], 1, fill=1.0), qwen_example(1, [], 2), qwen_example(0, [(1, 2, 4)], 1)]
    batch = VisionDataCollatorWithFlattening(layout=QWEN)(examples)
    assert sorted(batch) == sorted(
        [
            "input_ids",
            "labels",
            "position_ids",
            "seq_idx",
            "cu_seq_lens_q",
            "cu_seq_lens_k",
            "max_length_q",
            "max_length_k",
            "mm_token_type_ids",
            "pixel_values",
            "image_grid_thw",
        ]
    )
    assert_close(batch["input_ids"], torch.tensor([[1, 2, IMG, 5, 1, 5, 5, IMG, IMG, 5]]))
    assert_close(batch["mm_token_type_ids"], torch.tensor([[0, 0, 1, 0, 0, 0, 0, 1, 1, 0]]))
    assert_close(batch["cu_seq_lens_q"], torch.tensor([0, 4, 7, 10], dtype=torch.int32))
    assert_close(batch["position_ids"], torch.tensor([[0, 1, 2, 3, 0, 1, 2, 0, 1, 2]]))
    assert_close(batch["image_grid_thw"], torch.tensor([[1, 2, 2], [1, 2, 4]]))
    # Image rows in example order: example 0's 4 patches (ones), then example 2's 8 (zeros).
    assert_close(batch["pixel_values"], torch.cat([torch.ones(4, 6), torch.zeros(8, 6)]))


def test_placeholders_that_balance_across_examples_are_refused():
    """One placeholder too many in example 0 and one too few in example 1: the model's total check passes, and the
    second image would start inside the first example's sequence. The collator counts per example."""
    first, second = qwen_example(1, [(1, 2, 2)], 1), qwen_example(1, [(1, 2, 2)], 1)
    first["input_ids"][0] = IMG
    second["input_ids"][1] = 3
    total_ids = sum(np.sum(np.array(e["input_ids"]) == IMG) for e in (first, second))
    assert total_ids == 2  # the model alone would not notice
    with pytest.raises(ValueError, match=r"Example 0: `input_ids` hold 2 placeholder tokens .* fill 1"):
        VisionDataCollatorWithFlattening(layout=QWEN)([first, second])


def test_fixed_count_family_must_agree_across_the_batch():
    examples = [
        {"input_ids": [1, IMG, IMG, 2], "pixel_values": torch.zeros(1, 3, 2, 2)},
        {"input_ids": [IMG, IMG, IMG, 2], "pixel_values": torch.zeros(1, 3, 2, 2)},
    ]
    with pytest.raises(
        ValueError, match=r"Example 1: its 1 images have 3 placeholder tokens \(3 each\), but example 0"
    ):
        VisionDataCollatorWithFlattening(layout=FIXED)(examples)


@pytest.mark.parametrize("model_type", ["video_llava", "llava_next_video"])
def test_videos_that_balance_across_examples_are_refused(model_type):
    """Families with no rule for a video's placeholders stack the batch's videos (`(videos, frames, C, H, W)`, one
    shape), so every video fills the same number. One placeholder moved from example 1's video to example 0's passes
    the model's total check and would shift example 1's frames into example 0: refused, naming both. The balanced
    batch collates (the control)."""
    layout = VisionLayout.from_config(AutoConfig.for_model(model_type))
    video = layout.video_token_id
    examples = [{"input_ids": [1, *[video] * 6, 2], "pixel_values_videos": torch.zeros(1, 2, 3, 4, 4)} for _ in "ab"]
    collator = VisionDataCollatorWithFlattening(layout=layout)
    assert collator(examples)["pixel_values_videos"].shape == (2, 2, 3, 4, 4)
    examples[0]["input_ids"] = [video, *examples[0]["input_ids"][1:]]
    examples[1]["input_ids"] = [1, 1, *examples[1]["input_ids"][2:]]
    with pytest.raises(
        ValueError, match=r"^Example 1: its 1 videos have 5 placeholder tokens \(5 each\), but example 0"
    ):
        collator(examples)


def test_images_without_placeholders_and_placeholders_without_images_are_refused():
    collator = VisionDataCollatorWithFlattening(layout=FIXED)
    with pytest.raises(ValueError, match="Example 1: `input_ids` hold 0 placeholder tokens"):
        collator([{"input_ids": [1, 2]}, {"input_ids": [3, 4], "pixel_values": torch.zeros(1, 3, 2, 2)}])
    with pytest.raises(ValueError, match="Example 0: `input_ids` hold 1 placeholder tokens"):
        collator([{"input_ids": [1, IMG]}, {"input_ids": [3, 4]}])


def test_token_types_of_the_wrong_length_name_the_example():
    examples = [qwen_example(1, [], 1), qwen_example(2, [], 0)]
    examples[1]["mm_token_type_ids"] = [0]
    with pytest.raises(ValueError, match="Example 1: `mm_token_type_ids` has 1 entries but `input_ids` has 2"):
        VisionDataCollatorWithFlattening(layout=QWEN)(examples)


def test_batch_first_fields_concatenate_on_the_image_dimension():
    layout = VisionLayout(image_token_id=IMG, batch_first=("pixel_values", "pixel_attention_mask"))
    examples = [
        {
            "input_ids": [IMG, 1],
            "pixel_values": torch.zeros(1, 1, 3, 4, 4),
            "pixel_attention_mask": torch.ones(1, 1, 4, 4),
        },
        {
            "input_ids": [IMG, IMG, 2],
            "pixel_values": torch.ones(1, 2, 3, 4, 4),
            "pixel_attention_mask": torch.ones(1, 2, 4, 4),
        },
    ]
    batch = VisionDataCollatorWithFlattening(layout=layout)(examples)
    assert batch["pixel_values"].shape == (1, 3, 3, 4, 4)
    assert batch["pixel_attention_mask"].shape == (1, 3, 4, 4)
    assert_close(batch["pixel_values"][0, 1:], torch.ones(2, 3, 4, 4))


def test_padded_fields_are_zero_padded_to_a_common_shape():
    layout = VisionLayout(image_token_id=IMG, padded=("pixel_values",))
    examples = [
        {"input_ids": [IMG, 1], "pixel_values": torch.ones(1, 3, 2, 4), "image_sizes": torch.tensor([[2, 4]])},
        {"input_ids": [IMG, 2], "pixel_values": torch.ones(1, 3, 4, 2), "image_sizes": torch.tensor([[4, 2]])},
    ]
    batch = VisionDataCollatorWithFlattening(layout=layout)(examples)
    expected = torch.zeros(2, 3, 4, 4)
    expected[0, :, :2, :4] = 1
    expected[1, :, :4, :2] = 1
    assert_close(batch["pixel_values"], expected)
    assert_close(batch["image_sizes"], torch.tensor([[2, 4], [4, 2]]))


def test_unpadded_fields_of_different_shapes_are_refused():
    examples = [
        {"input_ids": [IMG], "pixel_values": torch.ones(1, 3, 2, 4)},
        {"input_ids": [IMG], "pixel_values": torch.ones(1, 3, 4, 2)},
    ]
    with pytest.raises(ValueError, match="`pixel_values` of the examples differ in shape beyond the image dimension"):
        VisionDataCollatorWithFlattening(layout=FIXED)(examples)


def test_row_padding_is_text_typed():
    batch = VisionDataCollatorWithFlattening(layout=QWEN, pad_to_multiple_of=8)([qwen_example(1, [(1, 2, 2)], 1)])
    assert batch["input_ids"].shape == (1, 8)
    assert_close(batch["mm_token_type_ids"], torch.tensor([[0, 1, 0, 0, 0, 0, 0, 0]]))
    assert_close(batch["cu_seq_lens_q"], torch.tensor([0, 3, 8], dtype=torch.int32))


def test_from_model_reads_the_family_layout():
    from flatcollate.testing.tiny_vision import tiny_vision_lm

    model = tiny_vision_lm("qwen2_vl")
    collator = VisionDataCollatorWithFlattening.from_model(model)
    assert collator.layout.image_token_id == model.config.image_token_id
    assert collator.layout.merge_size == model.config.vision_config.spatial_merge_size
    assert collator.vocab_size == model.config.get_text_config().vocab_size


def test_vision_fields_read_back_as_float64_lists_come_out_float32():
    """A `datasets` column without `with_format("torch")` gives nested Python floats (numpy float64); processors emit
    float32 and so does the collator."""
    examples = [
        {"input_ids": [IMG, 1], "pixel_values": [[[[0.5, 0.25]]]]},
        {"input_ids": [IMG], "pixel_values": [[[[1.0, 2.0]]]]},
    ]
    batch = VisionDataCollatorWithFlattening(layout=FIXED)(examples)
    assert batch["pixel_values"].dtype == torch.float32
    assert_close(batch["pixel_values"], torch.tensor([[[[0.5, 0.25]]], [[[1.0, 2.0]]]]))


def test_image_merge_sizes_are_carried_in_example_order():
    """VideoLLaMA 3's merge per image: left out, the model fails far from the cause."""
    examples = [
        {"input_ids": [IMG, 1], "pixel_values": torch.zeros(4, 6), "image_merge_sizes": torch.tensor([1])},
        {"input_ids": [2]},
        {"input_ids": [IMG, IMG, 3], "pixel_values": torch.ones(8, 6), "image_merge_sizes": torch.tensor([2, 1])},
    ]
    batch = VisionDataCollatorWithFlattening(layout=VisionLayout(image_token_id=IMG))(examples)
    assert_close(batch["image_merge_sizes"], torch.tensor([1, 2, 1]))
    assert_close(batch["pixel_values"], torch.cat([torch.zeros(4, 6), torch.ones(8, 6)]))


def test_video_llama_3_flattened_with_its_merge_sizes_equals_each_example_alone():
    from flatcollate import prepare_model_for_flattening
    from flatcollate.testing.tiny_vision import tiny_vision_examples, tiny_vision_lm

    model = tiny_vision_lm("video_llama_3").eval()
    examples = tiny_vision_examples(model, count=3, seed=1, images=(1, 2, 0))
    prepared = prepare_model_for_flattening(tiny_vision_lm("video_llama_3").eval())
    batch = VisionDataCollatorWithFlattening.from_model(prepared)(examples)
    assert_close(batch["image_merge_sizes"], torch.cat([e["image_merge_sizes"] for e in examples[:2]]))
    per_token = ("input_ids", "labels")
    with torch.no_grad():
        alone = [model(**{k: v[None] if k in per_token else v for k, v in e.items()}).logits[0] for e in examples]
        flat = prepared(**{k: v for k, v in batch.items() if k != "labels"}, use_cache=False).logits[0]
    assert (flat - torch.cat(alone)).abs().max().item() <= 1e-5


def test_a_field_the_model_takes_but_the_collator_cannot_place_is_refused():
    """Granite Docling's `tile_fine_mask` switches the whole batch to the fine path; left out, the model would run the
    coarse one. A deprecated name of a vision field would leave the images out."""
    from flatcollate.testing.tiny_vision import tiny_vision_examples, tiny_vision_lm

    model = tiny_vision_lm("granite_docling")
    (first,) = tiny_vision_examples(model, count=1, seed=0, images=(1,))
    collator = VisionDataCollatorWithFlattening.from_model(model)
    assert "pixel_values" in collator([first, {"input_ids": [5, 6]}])  # negative control: no field to leave out
    fine = {**first, "tile_fine_mask": torch.tensor([True])}
    with pytest.raises(
        ValueError, match=r"Example 1: `tile_fine_mask` is an argument of the model's forward .* Remove"
    ):
        collator([{"input_ids": [5, 6]}, fine])
    renamed = {**{k: v for k, v in first.items() if k != "pixel_values"}, "pixel_values_images": first["pixel_values"]}
    with pytest.raises(ValueError, match=r"Example 0: `pixel_values_images` is a deprecated name of `pixel_values`"):
        VisionDataCollatorWithFlattening(layout=FIXED)([renamed])


def test_an_unknown_array_field_is_refused_and_metadata_is_left_out():
    """Without the model's forward to ask, an array the collator does not know is refused; with it, a field the model
    does not take (an id, a source name) is left out, as the text collators leave it out."""
    from flatcollate.testing.tiny_vision import tiny_vision_lm

    example = {"input_ids": [IMG, 1], "pixel_values": torch.zeros(1, 3, 2, 2)}
    with pytest.raises(
        ValueError, match=r"Example 0: `image_crop_boxes` is not a field the collator knows.*from_model"
    ):
        VisionDataCollatorWithFlattening(layout=FIXED)([{**example, "image_crop_boxes": torch.zeros(1, 4)}])
    collator = VisionDataCollatorWithFlattening.from_model(tiny_vision_lm("llava"))
    batch = collator([{**example, "input_ids": [480] * 16 + [1], "id": 7, "source": "coco", "crop": [1, 2]}])
    assert "id" not in batch and "source" not in batch and "crop" not in batch


def test_list_valued_fields_count_as_arrays_and_absent_ones_as_absent():
    """Processors return nested lists as often as tensors: an unknown field holding one (ragged too) is refused like
    an array; a None value, a string and a list of strings are metadata, left out (the control)."""
    example = {"input_ids": [IMG, 1], "pixel_values": torch.zeros(1, 3, 2, 2)}
    collator = VisionDataCollatorWithFlattening(layout=FIXED)
    for value in ([[0.0, 1.0]], [[1, 2], [3]]):  # a nested list of numbers, a ragged one
        with pytest.raises(ValueError, match=r"Example 0: `image_crop_boxes` is not a field the collator knows"):
            collator([{**example, "image_crop_boxes": value}])
    batch = collator([{**example, "image_crop_boxes": None, "source": "coco", "tags": ["a", "b", "c"]}])
    assert {"image_crop_boxes", "source", "tags"}.isdisjoint(batch) and "pixel_values" in batch


def test_from_model_refuses_a_model_without_a_vision_tower():
    """A text model fed image-text examples would train with the images ignored: `from_model` refuses it (a model, a
    PEFT-style wrapper or a config), naming the model and the fix; every image-text family of the tiny recipes, Fuyu
    (whose tower is a linear patch embedding, no `vision_config`) included, is accepted (the control)."""
    from flatcollate.testing import tiny_causal_lm
    from flatcollate.testing.tiny_vision import tiny_vision_config, tiny_vision_lm

    text = tiny_causal_lm("qwen2")
    for given in (text, text.config):
        with pytest.raises(
            ValueError, match=r"(Qwen2ForCausalLM|Qwen2Config) has no vision tower.*AutoModelForImageText"
        ):
            VisionDataCollatorWithFlattening.from_model(given)
    for family in ("fuyu", "qwen2_5_vl", "paligemma"):
        assert VisionDataCollatorWithFlattening.from_model(tiny_vision_config(family)).layout.image_token_id == 480
    assert VisionDataCollatorWithFlattening.from_model(tiny_vision_lm("fuyu")).layout.model_inputs is not None


def test_images_reversed_within_one_example_are_refused():
    """Two images of different grid sizes given in the reverse order of their placeholder runs: the example's total
    agrees, and each image would land on the other's tokens. The control (the processor's order) is collated."""
    start, end = 7, 8
    ids = [1, start, *[IMG] * 2, end, 2, start, *[IMG] * 4, end, 3]
    example = {
        "input_ids": ids,
        "mm_token_type_ids": [int(t == IMG) for t in ids],
        "pixel_values": torch.cat([torch.zeros(8, 6), torch.ones(16, 6)]),
        "image_grid_thw": torch.tensor([[1, 2, 4], [1, 4, 4]]),
    }
    collator = VisionDataCollatorWithFlattening(layout=QWEN)
    assert_close(collator([example])["image_grid_thw"], example["image_grid_thw"])
    reversed_ = {
        **example,
        "pixel_values": torch.cat([torch.ones(16, 6), torch.zeros(8, 6)]),
        "image_grid_thw": torch.tensor([[1, 4, 4], [1, 2, 4]]),
    }
    with pytest.raises(ValueError, match=r"Example 1: image 0 fills 4 placeholder tokens .* holds 2 .*order"):
        collator([qwen_example(1, [], 1), reversed_])
