import numpy as np
import pytest
import torch

from flatcollate import DataCollatorForCompletionOnlyLM, DataCollatorWithFlattening

collate = DataCollatorWithFlattening()
GOOD = {"input_ids": [1, 2, 3]}


@pytest.mark.parametrize(
    ("features", "error", "pattern"),
    [
        ([], ValueError, "empty batch"),
        ({"input_ids": [1]}, TypeError, "list of examples"),
        ([GOOD, {"input_ids": []}], ValueError, r"example 1: 'input_ids' is empty"),
        ([GOOD, {"labels": [1]}], ValueError, r"example 1 has no 'input_ids' \(fields: \['labels'\]\)"),
        ([GOOD, [1, 2]], TypeError, "example 1 must be a dict"),
        ([{"input_ids": [1, 2], "labels": [1]}], ValueError, r"example 0: field 'labels' has 1 entries but"),
        ([{"input_ids": [1, 2], "completion_mask": [1, 1, 0]}], ValueError, r"example 0: field 'completion_mask' has"),
        ([{"input_ids": [1, 2], "assistant_masks": [1]}], ValueError, r"example 0: field 'assistant_masks' has 1"),
        ([{"input_ids": [1, 2], "completion_mask": [1, 2]}], ValueError, "must hold only 0 and 1"),
        ([GOOD, {"input_ids": [1.0, 2.0]}], TypeError, r"example 1: field 'input_ids' must hold integers, got float64"),
        ([{"input_ids": torch.tensor([0.5])}], TypeError, "must hold integers, got float32"),
        ([{"input_ids": [1, "a"]}], TypeError, "must hold integers"),
        ([{"input_ids": "hello"}], TypeError, "got str"),
        ([{"input_ids": 5}], TypeError, "got int"),
        ([GOOD, {"input_ids": [4, -1]}], ValueError, r"example 1: field 'input_ids' holds -1 at position 1"),
        ([{"input_ids": [[1, 2], [3, 4]]}], ValueError, r"must be 1-D .* got shape \(2, 2\)"),
        ([{"input_ids": torch.ones(2, 3, dtype=torch.long)}], ValueError, "must be 1-D"),
        ([{"input_ids": [[1, 2], [3]]}], ValueError, "nested list of uneven lengths"),
        ([{"input_ids": [1, 2], "labels": [-5, 1]}], ValueError, r"field 'labels' holds -5"),
        ([{"input_ids": [1, 2], "seq_lengths": [1, 2]}], ValueError, "must be positive and sum to the 2 tokens"),
        ([{"input_ids": [1, 2], "seq_lengths": [2, 0]}], ValueError, "must be positive"),
        ([{"input_ids": [1, 2], "attention_mask": [1, 0]}], ValueError, "example 0: 'attention_mask' has zeros"),
        ([{"input_ids": [1, 2, 3], "position_ids": [0, 1, 0], "seq_lengths": [3]}], ValueError, "restart at other"),
    ],
    ids=lambda v: None,
)
def test_bad_input_names_example_field_and_fix(features, error, pattern):
    with pytest.raises(error, match=pattern):
        collate(features)


def test_vocab_size_rejects_out_of_range_ids():
    with pytest.raises(ValueError, match=r"example 1: field 'input_ids' holds 300 .* \[0, 256\)"):
        DataCollatorWithFlattening(vocab_size=256)([GOOD, {"input_ids": [1, 300]}])
    with pytest.raises(ValueError, match=r"field 'labels' holds 256"):
        DataCollatorWithFlattening(vocab_size=256)([{"input_ids": [1, 2], "labels": [-100, 256]}])


def test_max_seq_len_raises_instead_of_truncating():
    with pytest.raises(ValueError, match="example 1: a sequence of 5 tokens exceeds max_seq_len=4"):
        DataCollatorWithFlattening(max_seq_len=4)([GOOD, {"input_ids": list(range(5))}])
    assert DataCollatorWithFlattening(max_seq_len=3)([GOOD])["input_ids"].shape == (1, 3)


def test_all_ones_attention_mask_is_accepted():
    batch = collate([{"input_ids": [1, 2], "attention_mask": [1, 1]}])
    assert "attention_mask" not in batch


def test_bool_and_uint_inputs_accepted():
    batch = collate([{"input_ids": np.array([1, 2], dtype=np.uint16), "completion_mask": np.array([False, True])}])
    assert batch["labels"].tolist() == [[-100, 2]]


def test_bad_constructor_options():
    with pytest.raises(ValueError, match="pad_to_multiple_of"):
        DataCollatorWithFlattening(pad_to_multiple_of=0)
    with pytest.raises(ValueError, match="return_tensors"):
        collate([GOOD], return_tensors="tf")


@pytest.mark.parametrize("field", ["pixel_values", "image_grid_thw", "pixel_values_videos"])
def test_image_fields_are_refused_not_dropped(field):
    """The text collator has no place for images: dropping them would train the placeholders without their images."""
    example = {"input_ids": [1, 9, 9, 2], field: torch.zeros(2, 6)}
    with pytest.raises(ValueError, match=rf"example 1: `{field}` is an image field.*VisionDataCollatorWithFlattening"):
        DataCollatorWithFlattening()([{"input_ids": [3, 4]}, example])


def test_a_collator_without_any_boundary_output_is_refused():
    """With every boundary output off the row is plain `input_ids`: a model would run it as one long sequence."""
    off = {"return_position_ids": False, "return_flash_attn_kwargs": False, "return_seq_idx": False}
    with pytest.raises(ValueError, match=r"(?s)no boundary.*one sequence.*return_position_ids"):
        DataCollatorWithFlattening(**off)
    with pytest.raises(ValueError, match=r"(?s)no boundary"):
        DataCollatorForCompletionOnlyLM([7], **off)
    for kept in off:  # any one of them is enough
        batch = DataCollatorWithFlattening(**{**off, kept: True})([GOOD, GOOD])
        assert batch.keys() & {"position_ids", "cu_seq_lens_q", "seq_idx"}
