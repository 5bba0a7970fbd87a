"""`pack_dataset` on image-text rows encoded by `make_supervised_dataset(processor, ...)`: whole examples packed by
best-fit decreasing on their lengths with the image placeholders counted, each pack keeping its examples' vision
fields, one entry per example in example order; over-long rows with images are refused with every `overlong`."""

import re

import datasets
import numpy as np
import pytest
import torch

from flatcollate.data import make_supervised_dataset, pack_dataset
from flatcollate.data.packing import pack_lengths

from .test_vision_encode import processors, random_row  # noqa: F401 (a fixture)

VISION = ("pixel_values", "image_grid_thw")


@pytest.fixture(scope="module")
def encoded(processors):  # noqa: F811
    """Eight Qwen2-VL rows (0-2 images each, one text-only), encoded by the real processor."""
    rng = np.random.default_rng(3)
    rows = [random_row(rng) for _ in range(8)]
    rows[5]["images"] = []
    rows[5]["messages"] = [
        {"role": "user", "content": [{"type": "text", "text": "Hi?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Hello there."}]},
    ]
    return make_supervised_dataset(processors["qwen2_vl"], datasets.Dataset.from_list(rows), seed=None)


def test_input_ids_hold_the_expanded_placeholders(encoded, processors):  # noqa: F811
    """The length packing (and the token-budget sampler) reads, `len(input_ids)`, counts every image placeholder:
    the processor expanded each image into `t * h * w / 4` of them (Qwen2-VL's merge of 2)."""
    image_id = processors["qwen2_vl"].tokenizer.convert_tokens_to_ids("<|image_pad|>")
    rows = encoded.with_format("numpy")
    for row in rows:
        grids = row["image_grid_thw"]
        expected = 0 if grids is None else int(np.stack(grids).prod(-1).sum()) // 4
        assert int((row["input_ids"] == image_id).sum()) == expected
    assert 2 <= sum(row["image_grid_thw"] is not None for row in rows) < len(rows)


def test_packs_keep_whole_examples_with_their_images(encoded):
    lengths = np.array([len(ids) for ids in encoded["input_ids"]])
    pack_len = int(max(lengths.max(), np.ceil(lengths.sum() / 3)))
    packed, stats = pack_dataset(encoded, pack_len, return_stats=True)
    groups = pack_lengths(lengths, pack_len)
    assert len(packed) == len(groups) == stats.num_packs and stats.num_sequences == len(encoded)
    assert stats.vision_columns == VISION and "one entry per packed example" in str(stats)
    assert packed.column_names[:2] == ["input_ids", "labels"]
    assert set(packed.column_names) == {
        "input_ids",
        "labels",
        "mm_token_type_ids",
        *VISION,
        "position_ids",
        "seq_lengths",
    }
    source = encoded.with_format("numpy")
    for pack, group in zip(packed.with_format("numpy"), groups, strict=True):
        assert pack["seq_lengths"].tolist() == lengths[group].tolist() and len(pack["input_ids"]) <= pack_len
        for key in ("input_ids", "labels", "mm_token_type_ids"):
            assert pack[key].tolist() == np.concatenate([source[int(i)][key] for i in group]).tolist()
        for key in VISION:
            assert len(pack[key]) == len(group)
            for entry, i in zip(pack[key], group, strict=True):
                want = source[int(i)][key]
                assert (entry is None) == (want is None)
                if want is not None:
                    np.testing.assert_array_equal(np.stack(entry), np.stack(want))


def test_packs_split_back_into_the_encoded_examples(encoded):
    """What the vision collator does first (`split_packs`): every example back with exactly its own fields."""
    from flatcollate.vision.packs import split_packs

    lengths = np.array([len(ids) for ids in encoded["input_ids"]])
    pack_len = int(lengths.max())
    packed = pack_dataset(encoded, pack_len).with_format("torch")
    groups = pack_lengths(lengths, pack_len)
    examples, where = split_packs(list(packed))
    assert where[:2] == ["Pack 0, example 0", "Pack 0, example 1"] or where[1] == "Pack 1, example 0"
    source = encoded.with_format("torch")
    for example, i in zip(examples, np.concatenate(groups), strict=True):
        want = {k: v for k, v in source[int(i)].items() if v is not None}
        assert example.keys() == want.keys()
        for key, value in want.items():
            torch.testing.assert_close(torch.as_tensor(example[key]), value, rtol=0, atol=0)


@pytest.mark.parametrize("overlong", ["error", "truncate", "split"])
def test_overlong_rows_with_images_are_refused(encoded, overlong):
    lengths = np.array([len(ids) for ids in encoded["input_ids"]])
    longest = int(np.argmax(lengths))
    pack_len = int(lengths[longest]) - 1
    match = {"error": f"sequence {longest} is {lengths[longest]} tokens > pack_len"}.get(
        overlong,
        rf"row {longest} is {lengths[longest]} tokens > pack_len {pack_len} .* carries images \(`pixel_values`\)",
    )
    with pytest.raises(ValueError, match=match) as caught:
        pack_dataset(encoded, pack_len, overlong=overlong)
    assert "pack_len" in str(caught.value)


def test_overlong_text_rows_beside_images_are_cut_as_text_rows_are(encoded):
    """A text-only row longer than `pack_len` is truncated (or split) as in a text dataset; rows with images stay
    whole and keep their images."""
    text_row = 5
    lengths = np.array([len(ids) for ids in encoded["input_ids"]])
    others = np.delete(lengths, text_row)
    long_text = {"input_ids": list(range(3, 3 + others.max() + 7)), "labels": list(range(3, 3 + others.max() + 7))}
    rows = encoded.to_list()
    rows[text_row] |= long_text | {"mm_token_type_ids": [0] * len(long_text["input_ids"])}
    dataset = datasets.Dataset.from_list(rows, features=encoded.features)
    packed, stats = pack_dataset(dataset, int(others.max()), overlong="truncate", return_stats=True)
    assert stats.num_overlong == 1 and stats.num_truncated_tokens == 7
    images = sum(entry is not None for pack in packed["image_grid_thw"] for entry in pack)
    assert images == sum(grid is not None for grid in encoded["image_grid_thw"])


def test_a_stream_of_encoded_rows_packs_chunk_by_chunk(encoded):
    lengths = np.array([len(ids) for ids in encoded["input_ids"]])
    stream = encoded.to_iterable_dataset()
    packs = list(pack_dataset(stream, int(lengths.max()), batch_size=4))
    assert sum(len(pack["seq_lengths"]) for pack in packs) == len(encoded)
    assert all(len(pack["pixel_values"]) == len(pack["seq_lengths"]) for pack in packs)


def test_the_token_budget_counts_image_placeholders(encoded, processors):  # noqa: F811
    """`TokenBudgetBatchSampler.from_dataset` reads `len(input_ids)`: text tokens plus every image placeholder. A
    budget between an example's text tokens and its full length refuses it (counting the text alone would let it in);
    every batch's tokens, placeholders included, stay within the budget, for rows and for packs."""
    from flatcollate.data import TokenBudgetBatchSampler

    image_id = processors["qwen2_vl"].tokenizer.convert_tokens_to_ids("<|image_pad|>")
    ids = encoded.with_format("numpy")["input_ids"]
    lengths = np.array([len(row) for row in ids])
    text = lengths - np.array([int((row == image_id).sum()) for row in ids])
    sampler = TokenBudgetBatchSampler.from_dataset(encoded, batch_size=2, max_tokens=int(lengths.max()) * 2)
    assert sampler.lengths.tolist() == lengths.tolist()
    assert all(lengths[batch].sum() <= sampler.max_tokens for batch in sampler)
    budget = int(text.max())  # every example's text fits
    with pytest.raises(ValueError, match=r"example (\d+) has \d+ tokens > max_tokens") as caught:
        TokenBudgetBatchSampler.from_dataset(encoded, batch_size=2, max_tokens=budget)
    refused = int(re.search(r"example (\d+)", str(caught.value))[1])
    assert text[refused] <= budget < lengths[refused]
    # An example with images is never cut: the message says so and does not advise truncating.
    assert "carries images (`" in str(caught.value) and "truncat" not in str(caught.value)
    packed = pack_dataset(encoded, int(lengths.max()))
    sampler = TokenBudgetBatchSampler.from_dataset(packed, batch_size=1, max_tokens=int(lengths.max()))
    assert sampler.lengths.tolist() == [sum(row) for row in packed["seq_lengths"]]
    assert sampler.lengths.sum() == lengths.sum()


def test_max_images_per_pack_bounds_the_images_of_every_pack(encoded, processors):  # noqa: F811
    """The vision tower runs every image of a pack at once: with `max_images_per_pack`, no pack holds more images
    (`image_grid_thw` rows) than the cap, every example is packed once with its images, and packs stay within
    `pack_len`. Without the cap (the control) the same packing puts more images in some pack."""
    lengths = np.array([len(ids) for ids in encoded["input_ids"]])
    images = np.array([0 if grid is None else len(grid) for grid in encoded["image_grid_thw"]])
    pack_len, cap = int(lengths.sum()), int(images.max())
    assert cap >= 2
    free = pack_dataset(encoded, pack_len)
    assert max(sum(len(g or []) for g in pack) for pack in free["image_grid_thw"]) > cap
    packed, stats = pack_dataset(encoded, pack_len, max_images_per_pack=cap, return_stats=True)
    per_pack = [sum(len(g or []) for g in pack) for pack in packed["image_grid_thw"]]
    assert max(per_pack) <= cap and sum(per_pack) == images.sum()
    assert sorted(n for row in packed["seq_lengths"] for n in row) == sorted(lengths.tolist())
    assert max(sum(row) for row in packed["seq_lengths"]) <= pack_len and stats.num_packs == len(packed)
    for pack in packed:  # each example's placeholders still meet its own grids
        ids, start = np.asarray(pack["input_ids"]), 0
        for n, grid in zip(pack["seq_lengths"], pack["image_grid_thw"], strict=True):
            expected = 0 if grid is None else int(np.prod(grid, axis=-1).sum()) // 4
            assert int((ids[start : start + n] == processors["qwen2_vl"].image_token_id).sum()) == expected
            start += n
    stream = pack_dataset(encoded.to_iterable_dataset(), pack_len, max_images_per_pack=cap, batch_size=4)
    assert max(sum(len(g or []) for g in pack["image_grid_thw"]) for pack in stream) <= cap
    with pytest.raises(ValueError, match=rf"row \d+ carries {cap} images > max_images_per_pack {cap - 1}"):
        pack_dataset(encoded, pack_len, max_images_per_pack=cap - 1)


def test_max_patches_per_pack_bounds_the_vision_patches_of_every_pack(encoded, processors):  # noqa: F811
    """The vision tower's memory follows the patches it encodes per pack: with `max_patches_per_pack`, no pack's
    examples hold more patches (t*h*w of each `image_grid_thw` row; Qwen2-VL's `pixel_values` has one row per
    patch) than the cap, every example is packed once with its images, and packs stay within `pack_len`. Without the
    cap (the control) the same packing puts more patches in some pack."""

    def patches(grid):
        return 0 if grid is None else int(np.prod(grid, axis=-1).sum())

    lengths = np.array([len(ids) for ids in encoded["input_ids"]])
    per_row = np.array([patches(grid) for grid in encoded["image_grid_thw"]])
    assert [0 if p is None else len(p) for p in encoded["pixel_values"]] == per_row.tolist()  # one row per patch
    pack_len, cap = int(lengths.sum()), int(per_row.max())
    free = pack_dataset(encoded, pack_len)
    assert max(sum(patches(g) for g in pack) for pack in free["image_grid_thw"]) > cap
    packed, stats = pack_dataset(encoded, pack_len, max_patches_per_pack=cap, return_stats=True)
    per_pack = [sum(patches(g) for g in pack) for pack in packed["image_grid_thw"]]
    assert max(per_pack) <= cap and sum(per_pack) == per_row.sum()
    assert [sum(0 if p is None else len(p) for p in pack) for pack in packed["pixel_values"]] == per_pack
    assert sorted(n for row in packed["seq_lengths"] for n in row) == sorted(lengths.tolist())
    assert max(sum(row) for row in packed["seq_lengths"]) <= pack_len and stats.num_packs == len(packed)
    for pack in packed:  # each example's placeholders still meet its own grids
        ids, start = np.asarray(pack["input_ids"]), 0
        for n, grid in zip(pack["seq_lengths"], pack["image_grid_thw"], strict=True):
            assert int((ids[start : start + n] == processors["qwen2_vl"].image_token_id).sum()) == patches(grid) // 4
            start += n
    most_images = max(len(g or []) for g in encoded["image_grid_thw"])  # both caps: splitting for one keeps the other
    both = pack_dataset(encoded, pack_len, max_patches_per_pack=cap, max_images_per_pack=most_images)
    assert max(sum(len(g or []) for g in pack) for pack in both["image_grid_thw"]) <= most_images
    assert max(sum(patches(g) for g in pack) for pack in both["image_grid_thw"]) <= cap
    stream = pack_dataset(encoded.to_iterable_dataset(), pack_len, max_patches_per_pack=cap, batch_size=4)
    assert max(sum(patches(g) for g in pack["image_grid_thw"]) for pack in stream) <= cap
    row = int(per_row.argmax())
    with pytest.raises(ValueError, match=rf"row {row} carries {cap} vision patches > max_patches_per_pack {cap - 1}"):
        pack_dataset(encoded, pack_len, max_patches_per_pack=cap - 1)
    with pytest.raises(ValueError, match=r"max_patches_per_pack must be a positive int, got 0"):
        pack_dataset(encoded, pack_len, max_patches_per_pack=0)


def test_max_patches_per_pack_refuses_rows_that_do_not_state_patch_counts(encoded):
    """`pixel_values` alone lays out images, tiles or patches by family: without a grid, the option is refused,
    naming it and the fields the rows have."""
    rows = encoded.remove_columns("image_grid_thw")
    with pytest.raises(ValueError, match=r"max_patches_per_pack .*image_grid_thw.*these rows have pixel_values"):
        pack_dataset(rows, 10**6, max_patches_per_pack=10**6)
    pack_dataset(rows, 10**6)  # the control: the same rows pack without the option
