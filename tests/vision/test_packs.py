"""`VisionDataCollatorWithFlattening` on packs: a pack is split into its examples and each is checked against its own
images, so a pack whose images are in the wrong example order is refused (Gemma 3, whose images all fill the same
number of placeholders, would pass a check of the pack as one row); the batch equals the unpacked examples' batch."""

import itertools

import numpy as np
import pytest
import torch
from transformers import AutoConfig

from flatcollate.testing.tiny_vision import tiny_vision_examples, tiny_vision_lm
from flatcollate.vision import VisionDataCollatorWithFlattening, VisionLayout
from flatcollate.vision.packs import pack_examples


@pytest.fixture(scope="module")
def gemma():
    model = tiny_vision_lm("gemma3")
    return VisionDataCollatorWithFlattening.from_model(model), tiny_vision_examples(model, count=3, images=(1, 2, 0))


def assert_same_batch(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for key, value in want.items():
        if isinstance(value, torch.Tensor):
            torch.testing.assert_close(got[key], value, rtol=0, atol=0)
        else:
            assert got[key] == value, key


@pytest.mark.parametrize("split", [[3], [2, 1], [1, 1, 1]], ids=str)
def test_packs_collate_as_their_examples(gemma, split):
    """One pack or several per batch: the batch is the unpacked examples' batch, key for key."""
    collator, examples = gemma
    starts = np.cumsum([0, *split])
    packs = [pack_examples(examples[a:b]) for a, b in itertools.pairwise(starts)]
    assert_same_batch(collator(packs), collator(examples))


def test_a_pack_with_its_images_in_the_wrong_example_order_is_refused(gemma):
    """Examples with 1, 2 and 0 images; the pack gives example 0 the two images of example 1 and example 1 the one of
    example 0. Checked as one row the pack holds 3 images and 3 blocks of placeholders, which agree."""
    collator, examples = gemma
    pack = pack_examples(examples)
    pack["pixel_values"] = [pack["pixel_values"][1], pack["pixel_values"][0], None]
    image_id = collator.layout.image_token_id
    one_row = {
        "input_ids": pack["input_ids"],
        "pixel_values": np.concatenate([p for p in pack["pixel_values"] if p is not None]),
    }
    assert int((one_row["input_ids"] == image_id).sum()) == 3 * collator.layout.tokens_per_image
    with pytest.raises(ValueError, match=r"^Pack 0, example 0: `input_ids` hold \d+ placeholder tokens .* 2 images"):
        collator([pack])


def test_a_pack_without_one_entry_per_example_is_refused(gemma):
    """The pack's images concatenated into one array (4-D, 3 images for 3 examples would even match in length) or
    one entry short: refused, naming the pack, the field and `pack_dataset`."""
    collator, examples = gemma
    pack = pack_examples(examples)
    pack["pixel_values"] = pack["pixel_values"][:2]
    with pytest.raises(ValueError, match=r"^Pack 0: `pixel_values` has 2 entries but the pack holds 3 examples.*"):
        collator([pack])
    pack["pixel_values"] = torch.cat([torch.as_tensor(p) for p in pack_examples(examples)["pixel_values"][:2]])
    with pytest.raises(ValueError, match=r"^Pack 0, example 0: .*placeholder tokens"):
        collator([pack])


def test_messages_name_the_pack_and_the_example(gemma):
    """Checks of the text collator and of the token types name an example by its pack."""
    collator, examples = gemma
    pack = pack_examples(examples)
    pack["token_type_ids"] = pack["token_type_ids"][:-1]
    with pytest.raises(ValueError, match=r"^Pack 1, example 2: .*`token_type_ids`"):
        collator([examples[0], pack])
    pack = pack_examples(examples)
    pack["input_ids"][-1] = 10**6
    with pytest.raises(ValueError, match=r"^Pack 1, example 2: "):
        collator([examples[0], pack])


@pytest.fixture(scope="module")
def qwen():
    model = tiny_vision_lm("qwen2_5_vl")
    return VisionDataCollatorWithFlattening.from_model(model), tiny_vision_examples(model, count=3, images=(2, 1, 0))


def test_a_pack_says_it_is_a_pack(gemma, qwen):
    """A pack whose `seq_lengths` was dropped (as `Trainer`'s `remove_unused_columns` drops it) keeps its boundaries
    only in `position_ids`: with one example they do not restart, and the pack's per-example lists would be read as
    one example's fields (Qwen2.5-VL fails in the model; its `image_grid_thw` is one level deeper than `(images, 3)`);
    with several, Gemma 3 would count the wrong images. Refused, naming `seq_lengths` and the fix; the same packs with
    their marker collate as their examples (the control)."""
    cases = [(qwen, examples) for examples in (qwen[1][:1], qwen[1])] + [(gemma, gemma[1])]
    for (collator, _), examples in cases:
        pack = pack_examples(examples)
        lengths = pack.pop("seq_lengths")
        assert_same_batch(collator([{**pack, "seq_lengths": lengths}]), collator(examples))
        pack["position_ids"] = np.concatenate([np.arange(n) for n in lengths])
        with pytest.raises(ValueError, match=r"^Example 0 carries images and its .* no `seq_lengths`.*remove_unused"):
            collator([pack])
    collator, examples = qwen  # an example with restarting positions but without images is text: collated as such
    plain = {
        **examples[2],
        "position_ids": np.concatenate([np.arange(3), np.arange(len(examples[2]["input_ids"]) - 3)]),
    }
    assert collator([plain])["cu_seq_lens_q"].tolist() == [0, 3, len(examples[2]["input_ids"])]


@pytest.mark.parametrize(
    "model_type", ["gemma3", "paligemma", "llava", "idefics3", "smolvlm", "fuyu", "lfm2_vl", "mistral3"]
)
def test_a_one_example_pack_without_its_marker_is_refused_in_every_layout(model_type):
    """One example with one image, packed alone, loses `seq_lengths`: its positions do not restart, and one image per
    example makes every count agree; only its fields' dimensions show that each holds a list of one example's entries
    (`(examples, images, C, H, W)` where the family's examples are `(images, C, H, W)`). Refused naming
    `seq_lengths`; the same pack with its marker collates as its example (the control)."""
    model = tiny_vision_lm(model_type)
    collator = VisionDataCollatorWithFlattening.from_model(model)
    example = tiny_vision_examples(model, count=1, images=(1,))[0]
    pack = pack_examples([example])
    assert_same_batch(collator([pack]), collator([example]))
    del pack["seq_lengths"]
    with pytest.raises(ValueError, match=r"^Example 0 carries images and its .* no `seq_lengths`.*remove_unused"):
        collator([pack])


def test_a_one_video_pack_without_its_marker_is_refused():
    """LLaVA-OneVision stacks an example's videos `(videos, frames, C, H, W)`; a video-only example packed alone has
    no per-image field, and without `seq_lengths` its videos are one dimension deeper. Refused; marked, it collates as
    its example (the control)."""
    layout = VisionLayout.from_config(AutoConfig.for_model("llava_onevision"))
    frames = 2
    ids = [1, *[layout.video_token_id] * (frames * layout.frame_tokens + 1), 2]
    example = {"input_ids": np.array(ids), "pixel_values_videos": np.zeros((1, frames, 3, 4, 4), np.float32)}
    collator = VisionDataCollatorWithFlattening(layout=layout)
    pack = pack_examples([example])
    assert_same_batch(collator([pack]), collator([example]))
    del pack["seq_lengths"]
    with pytest.raises(ValueError, match=r"^Example 0 carries images and its `pixel_values_videos` has 6 dimensions"):
        collator([pack])
