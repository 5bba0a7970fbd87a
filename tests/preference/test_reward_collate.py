"""`DataCollatorForRewardPairs`: a batch of pairs as one row, every chosen sequence then every rejected one."""

import pytest
import torch

from flatcollate.preference import DataCollatorForRewardPairs

PAIRS = [
    {"chosen_ids": [1, 2, 3], "rejected_ids": [4, 5]},
    {"chosen_ids": [6, 7], "rejected_ids": [8]},
]


def test_chosen_then_rejected_in_one_row():
    batch = DataCollatorForRewardPairs()(PAIRS)
    assert sorted(batch) == [
        "cu_seq_lens_k",
        "cu_seq_lens_q",
        "input_ids",
        "max_length_k",
        "max_length_q",
        "position_ids",
        "seq_idx",
    ]
    torch.testing.assert_close(batch["input_ids"], torch.tensor([[1, 2, 3, 6, 7, 4, 5, 8]]))
    torch.testing.assert_close(batch["position_ids"], torch.tensor([[0, 1, 2, 0, 1, 0, 1, 0]]))
    torch.testing.assert_close(batch["seq_idx"], torch.tensor([[0, 0, 0, 1, 1, 2, 2, 3]], dtype=torch.int32))
    torch.testing.assert_close(batch["cu_seq_lens_q"], torch.tensor([0, 3, 5, 7, 8], dtype=torch.int32))
    torch.testing.assert_close(batch["cu_seq_lens_k"], batch["cu_seq_lens_q"])
    assert batch["max_length_q"] == batch["max_length_k"] == 3


def test_margin_is_kept_per_pair():
    pairs = [{**pair, "margin": margin} for pair, margin in zip(PAIRS, [0.5, 0.0], strict=True)]
    batch = DataCollatorForRewardPairs()(pairs)
    torch.testing.assert_close(batch["margin"], torch.tensor([0.5, 0.0]))
    assert batch["input_ids"].shape == (1, 8)


def test_numpy_output():
    batch = DataCollatorForRewardPairs()(PAIRS, return_tensors="np")
    assert batch["input_ids"].tolist() == [[1, 2, 3, 6, 7, 4, 5, 8]]


@pytest.mark.parametrize(
    ("pairs", "error", "match"),
    [
        ([{"chosen_ids": [1]}], ValueError, r"example 0.*rejected_ids"),
        ([PAIRS[0], {"chosen_ids": [1], "rejected": "no"}], ValueError, r"example 1.*rejected_ids"),
        ([{**PAIRS[0], "margin": 1.0}, PAIRS[1]], ValueError, r"example 1.*margin"),
        ([PAIRS[0], {"chosen_ids": [1], "rejected_ids": []}], ValueError, r"example 1.*rejected_ids.*empty"),
        ([PAIRS[0], "ids"], TypeError, r"example 1"),
        ([], ValueError, "empty batch"),
    ],
    ids=["no-rejected", "second-without-rejected", "margin-in-some", "empty-rejected", "not-a-dict", "empty"],
)
def test_bad_pairs_name_the_example_and_field(pairs, error, match):
    with pytest.raises(error, match=match):
        DataCollatorForRewardPairs()(pairs)


def test_token_errors_name_the_pair_and_field():
    pairs = [PAIRS[0], {"chosen_ids": [1], "rejected_ids": [300]}]
    with pytest.raises(ValueError, match=r"example 1.*rejected_ids"):
        DataCollatorForRewardPairs(vocab_size=256)(pairs)
