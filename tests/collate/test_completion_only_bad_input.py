"""`DataCollatorForCompletionOnlyLM` validates examples like the base collator, flattened or padded."""

from types import SimpleNamespace

import pytest
import torch

from flatcollate import DataCollatorForCompletionOnlyLM

R = [90, 91]  # response template ids
U = [80, 81]  # instruction template ids
PAD = SimpleNamespace(pad_token_id=0)  # all `padding_free=False` needs from a tokenizer with id templates


def collator(padding_free, **kwargs):
    return DataCollatorForCompletionOnlyLM(R, tokenizer=PAD, padding_free=padding_free, **kwargs)


@pytest.mark.parametrize("padding_free", [True, False])
@pytest.mark.parametrize(
    ("features", "error", "pattern"),
    [
        # a length-1 `labels` used to broadcast over the example, a longer one to raise numpy's broadcast error
        ([{"input_ids": [1, *R, 5, 6], "labels": [7]}], ValueError,
         r"example 0: field 'labels' has 1 entries but 'input_ids' has 5; 'labels' needs one entry per token"),
        ([{"input_ids": [1, *R, 5]}, {"input_ids": [1, *R, 5, 6], "labels": [1, 2, 3]}], ValueError,
         r"example 1: field 'labels' has 3 entries but 'input_ids' has 5"),
        ([{"input_ids": [1, *R, 5], "labels": torch.tensor([1, 90, 91, 5, 5, 5])}], ValueError,
         r"example 0: field 'labels' has 6 entries but 'input_ids' has 4"),
        ([{"input_ids": [1, *R, 5], "completion_mask": [1, 1, 0]}], ValueError,
         r"example 0: field 'completion_mask' has 3 entries"),
        ([{"input_ids": [1, *R, 5], "completion_mask": [1, 1, 0, 2]}], ValueError, "must hold only 0 and 1"),
        ([{"input_ids": [1, *R, 5], "attention_mask": [1, 1, 1, 0]}], ValueError,
         "example 0: 'attention_mask' has zeros"),
        ([{"input_ids": [1, *R, 5], "token_type_ids": [0, 0, 1, 1]}], ValueError,
         r"example 0: per-token field\(s\) \['token_type_ids'\] are not handled"),
        ([{"input_ids": [1, *R, 5], "labels": [1, 90, 91, -7]}], ValueError, r"example 0: field 'labels' holds -7"),
        ([{"input_ids": [1, *R, 5], "labels": [1.0, 2.0, 3.0, 4.0]}], TypeError, "must hold integers"),
        ([{"input_ids": [1, *R, 5], "seq_lengths": [2, 1]}], ValueError, "must be positive and sum to the 4 tokens"),
    ],
    ids=lambda v: None,
)
def test_bad_input_names_example_field_and_fix(padding_free, features, error, pattern):
    with pytest.raises(error, match=pattern):
        collator(padding_free)(features)


def test_padded_mode_refuses_packed_examples():
    packed = {"input_ids": [1, *R, 5, 2, *R, 6], "seq_lengths": [4, 4]}
    with pytest.raises(ValueError, match=r"example 0 holds 2 sequences .* padding_free=True"):
        collator(False)([packed])


@pytest.mark.parametrize("padding_free", [True, False])
def test_completion_mask_is_folded_in_both_modes(padding_free):
    features = [{"input_ids": [1, *R, 5, 6], "completion_mask": [1, 1, 1, 1, 0]}, {"input_ids": [*R, 7]}]
    batch = collator(padding_free)(features)
    if padding_free:
        expected = [[-100, -100, -100, 5, -100, -100, -100, 7]]
    else:
        expected = [[-100, -100, -100, 5, -100], [-100, -100, 7, -100, -100]]
        torch.testing.assert_close(batch["attention_mask"], torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]))
    torch.testing.assert_close(batch["labels"], torch.tensor(expected))


def test_padded_mode_layout_and_pad_to_multiple_of():
    features = [{"input_ids": [1, *R, 5, 6]}, {"input_ids": torch.tensor([*R, 7])}]
    batch = collator(False, pad_to_multiple_of=4)(features)
    assert set(batch) == {"input_ids", "labels", "attention_mask"}
    torch.testing.assert_close(
        batch["input_ids"], torch.tensor([[1, 90, 91, 5, 6, 0, 0, 0], [90, 91, 7, 0, 0, 0, 0, 0]])
    )
    torch.testing.assert_close(
        batch["labels"], torch.tensor([[-100, -100, -100, 5, 6] + [-100] * 3, [-100, -100, 7] + [-100] * 5])
    )
    torch.testing.assert_close(batch["attention_mask"], (batch["input_ids"] != 0).long())
    numpy_batch = collator(False, return_tensors="np")(features)
    assert numpy_batch["input_ids"].shape == (2, 5) and numpy_batch["labels"].dtype == "int64"
