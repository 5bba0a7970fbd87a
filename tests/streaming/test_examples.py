"""Row encoding: masks fold into labels exactly as the flattening collator folds them; no per-token field is dropped."""

import numpy as np
import pytest
import torch

from flatcollate import DataCollatorWithFlattening
from flatcollate.streaming import StreamingPacker
from flatcollate.streaming.examples import encode_row

MASK_ROWS = [
    {"input_ids": [1, 2, 3, 4], "completion_mask": [0, 0, 1, 1]},
    {"input_ids": [5, 6, 7], "assistant_masks": [1, 0, 1]},
    {"input_ids": [8, 9, 10], "labels": [-100, 90, 100], "completion_mask": [1, 1, 0]},
    {"input_ids": [11, 12], "completion_mask": torch.tensor([0, 1])},
    {"input_ids": [13, 14, 15], "completion_mask": np.array([True, True, False])},
    {"input_ids": [16], "labels": None, "completion_mask": None},
]


@pytest.mark.parametrize("through", ["row", "encode_fn"])
def test_packed_labels_equal_unpacked_collator_labels_for_mask_rows(through):
    collator = DataCollatorWithFlattening()
    expected = collator(MASK_ROWS)
    if through == "row":
        packer = StreamingPacker(MASK_ROWS, pack_len=64)
    else:
        packer = StreamingPacker(
            [{"index": i} for i in range(len(MASK_ROWS))], pack_len=64, encode_fn=lambda row: MASK_ROWS[row["index"]]
        )
    packs = list(packer)
    assert len(packs) == 1
    got = collator(packs)
    torch.testing.assert_close(got["input_ids"], expected["input_ids"])
    torch.testing.assert_close(got["labels"], expected["labels"])
    torch.testing.assert_close(got["cu_seq_lens_q"], expected["cu_seq_lens_q"])


def test_issue_example_keeps_prompt_out_of_the_loss():
    (pack,) = StreamingPacker([{"input_ids": [1, 2, 3, 4], "completion_mask": [0, 0, 1, 1]}], pack_len=8)
    assert pack["labels"].tolist() == [-100, -100, 3, 4]
    assert DataCollatorWithFlattening()([pack])["labels"].tolist() == [[-100, -100, 3, 4]]


def test_both_masks_apply_together():
    row = {"input_ids": [1, 2, 3, 4], "completion_mask": [0, 1, 1, 1], "assistant_masks": [1, 1, 0, 1]}
    _, labels = encode_row(row, encode_fn=None, origin="row 0")
    assert labels.tolist() == [-100, 2, -100, 4]


@pytest.mark.parametrize(
    ("mask", "error", "message"),
    [
        ([0, 1], ValueError, r"row 3: field `completion_mask` has 2 entries but `input_ids` has 3"),
        ([0, 1, 2], ValueError, r"row 3: field `completion_mask` must hold only 0 and 1, found 2"),
        ([0, -1, 1], ValueError, r"row 3: field `completion_mask` must hold only 0 and 1, found -1"),
        ([0.0, 1.0, 1.0], TypeError, r"row 3: field `completion_mask` must hold ints"),
    ],
)
def test_bad_mask_names_row_and_field(mask, error, message):
    with pytest.raises(error, match=message):
        encode_row({"input_ids": [1, 2, 3], "completion_mask": mask}, encode_fn=None, origin="row 3")


@pytest.mark.parametrize("field", ["loss_weights", "token_type_ids"])
def test_unknown_per_token_field_is_refused(field):
    rows = [{"input_ids": [1, 2]}, {"input_ids": [1, 2, 3], field: [0, 1, 1], "text": "abc"}]
    with pytest.raises(ValueError, match=rf"row 1: per-token field\(s\) \['{field}'\].*dropped.*remove"):
        list(StreamingPacker(rows, pack_len=8))
    encode_fn_rows = [{"text": "abc"}]
    with pytest.raises(ValueError, match=rf"row 0: per-token field\(s\) \['{field}'\]"):
        list(StreamingPacker(encode_fn_rows, pack_len=8, encode_fn=lambda row: {"input_ids": [1, 2], field: [1, 1]}))


def test_fields_that_carry_nothing_per_token_pass():
    row = {"input_ids": [1, 2, 3], "attention_mask": [1, 1, 1], "position_ids": [0, 1, 2], "id": 7, "text": "abc"}
    ids, labels = encode_row(row, encode_fn=None, origin="row 0")
    assert ids.tolist() == labels.tolist() == [1, 2, 3]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"attention_mask": [1, 0, 1]}, r"row 0: field `attention_mask` has zeros"),
        ({"position_ids": [0, 1, 0]}, r"row 0: field `position_ids` .* several sequences"),
        ({"seq_lengths": [2, 1]}, r"row 0: field `seq_lengths` .* several sequences"),
    ],
)
def test_fields_whose_loss_would_change_training_are_refused(extra, message):
    with pytest.raises(ValueError, match=message):
        encode_row({"input_ids": [1, 2, 3], **extra}, encode_fn=None, origin="row 0")


def test_image_rows_are_refused_not_stripped_of_their_images():
    """The packer keeps `input_ids` and `labels` only: an image row would train its placeholders without the image."""
    rows = [{"input_ids": [1, 2]}, {"input_ids": [1, 9, 9], "pixel_values": [[0.0] * 6] * 4}]
    with pytest.raises(ValueError, match=r"row 1: `pixel_values` is an image field.*VisionDataCollatorWithFlattening"):
        list(StreamingPacker(rows, pack_len=8))
