"""TRL's padding-free tests of `DataCollatorForLanguageModeling`, ported to flatcollate's `DataCollatorWithFlattening`.

Upstream: huggingface/trl `tests/test_sft_trainer.py`, class `TestDataCollatorForLanguageModeling`, at two
revisions: v0.19.1 (`accf7383a33c618a2edc7205107120b5f32e28a3`) and `f2cd57710ae345ea6428ae95363267fcf38a3dc8` (the
main branch after v1.9.0, version 1.10.0.dev0: the newest revision stored here; trl 1.16.0, the installed version,
is not tagged in that copy). Only the padding-free tests apply: TRL's padded mode has no flatcollate counterpart
(use TRL's collator or `DataCollatorForCompletionOnlyLM(padding_free=False)`). Each ported test names its upstream
test. The installed trl 1.16.0 collator is also run on the same inputs and compared value for value.

Where flatcollate deliberately differs, the test asserts flatcollate's behaviour and the upstream expectation side
by side (docs/peers.md, D9-D11):

- `pad_to_multiple_of`: TRL gives each pad token position 0, so every pad token is a length-1 sequence of its own;
  flatcollate makes the padding one sequence (positions 0, 1, 2, ...), one `cu_seq_lens` entry, one `seq_idx`.
- `completion_mask` / `assistant_masks` next to `labels`: TRL's collator ignores them (TRL folds the masks into
  `labels` while preparing the dataset); flatcollate folds them into `labels`. `FlatSFTTrainer` removes such leftover
  masks, so it trains on TRL's tokens.
- TRL v0.19.1 returned an all-ones `attention_mask` unless packed `position_ids` were given, and kept the first label
  of every sequence; flatcollate never returns an `attention_mask` (transformers' SDPA and eager paths would attend
  across sequences) and labels the first token of every sequence -100 (as TRL does since).
"""

import pytest
import torch
from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

from flatcollate import DataCollatorWithFlattening

TRL_1_10_KEYS = {"input_ids", "position_ids", "labels"}  # what trl 1.10.0.dev0 returned in padding-free mode
BOUNDARY_KEYS = {"cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "seq_idx"}


def plain_collator(**options):
    """flatcollate's collator with TRL 1.10's key set: no flash-attention kwargs, no `seq_idx`."""
    return DataCollatorWithFlattening(return_flash_attn_kwargs=False, return_seq_idx=False, **options)


def assert_batch(result, keys, **expected):
    assert set(result) == keys
    for name, value in expected.items():
        torch.testing.assert_close(result[name], torch.tensor(value))


def assert_same_as_installed_trl(examples, **options):
    """Every key and value equal to the installed TRL collator's (trl 1.16 emits the boundary kwargs too)."""
    ours = DataCollatorWithFlattening(**options)(examples)
    theirs = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True, **options)(examples)
    assert set(ours) == set(theirs)
    for name in theirs:
        if isinstance(theirs[name], torch.Tensor):
            torch.testing.assert_close(ours[name], theirs[name], msg=name)
        else:
            assert ours[name] == theirs[name], name


TWO = [{"input_ids": [1, 2, 3], "labels": [1, 2, 3]}, {"input_ids": [4, 5], "labels": [4, 5]}]


# Upstream (1.10.0.dev0): test_padding_free_mode
def test_padding_free_mode():
    assert_batch(
        plain_collator()(TWO), TRL_1_10_KEYS,
        input_ids=[[1, 2, 3, 4, 5]], position_ids=[[0, 1, 2, 0, 1]], labels=[[-100, 2, 3, -100, 5]],
    )
    assert_same_as_installed_trl(TWO)


# Upstream (1.10.0.dev0): test_padding_free_without_labels
def test_padding_free_without_labels():
    examples = [{"input_ids": [1, 2, 3]}, {"input_ids": [4, 5]}]
    assert_batch(
        plain_collator()(examples), TRL_1_10_KEYS,
        input_ids=[[1, 2, 3, 4, 5]], position_ids=[[0, 1, 2, 0, 1]], labels=[[-100, 2, 3, -100, 5]],
    )
    assert_same_as_installed_trl(examples)


# Upstream (1.10.0.dev0): test_packing
def test_packing():
    examples = [
        {"input_ids": [1, 2, 3, 4, 5, 6], "seq_lengths": [3, 3], "labels": [1, 2, 3, 4, 5, 6]},
        {"input_ids": [7, 8, 9, 10, 11], "seq_lengths": [4, 1], "labels": [7, 8, 9, 10, 11]},
    ]
    assert_batch(
        plain_collator()(examples), TRL_1_10_KEYS,
        input_ids=[list(range(1, 12))],
        position_ids=[[0, 1, 2, 0, 1, 2, 0, 1, 2, 3, 0]],
        labels=[[-100, 2, 3, -100, 5, 6, -100, 8, 9, 10, -100]],
    )
    assert_same_as_installed_trl(examples)


# Upstream (1.10.0.dev0): test_pad_to_multiple_of_and_padding_free. Deliberately different (D9).
def test_pad_to_multiple_of_and_padding_free():
    examples = [{"input_ids": [1, 2, 3], "labels": [1, 2, 3]}, {"input_ids": [4, 5], "labels": [4, 5]}]
    result = DataCollatorWithFlattening(pad_to_multiple_of=4)(examples)
    assert set(result) == TRL_1_10_KEYS | BOUNDARY_KEYS
    torch.testing.assert_close(result["input_ids"], torch.tensor([[1, 2, 3, 4, 5, 0, 0, 0]]))  # as upstream
    torch.testing.assert_close(result["labels"], torch.tensor([[-100, 2, 3, -100, 5, -100, -100, -100]]))  # as upstream
    # Upstream: position_ids [[0, 1, 2, 0, 1, 0, 0, 0]], three pad sequences of one token. Here: one pad sequence.
    torch.testing.assert_close(result["position_ids"], torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2]]))
    torch.testing.assert_close(result["cu_seq_lens_q"], torch.tensor([0, 3, 5, 8], dtype=torch.int32))
    torch.testing.assert_close(result["seq_idx"], torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2]], dtype=torch.int32))
    theirs = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True, pad_to_multiple_of=4)(examples)
    torch.testing.assert_close(theirs["position_ids"], torch.tensor([[0, 1, 2, 0, 1, 0, 0, 0]]))
    torch.testing.assert_close(theirs["cu_seq_lens_q"], torch.tensor([0, 3, 5, 6, 7, 8], dtype=torch.int32))
    for name in ("input_ids", "labels"):
        torch.testing.assert_close(result[name], theirs[name])


# Upstream (1.10.0.dev0): test_provided_labels_not_reconstructed_from_masks, in padding-free mode. Deliberately
# different (D10): masks next to labels are folded in.
def test_provided_labels_and_masks():
    examples = [
        {"input_ids": [1, 2, 3], "labels": [1, 2, 3], "completion_mask": [0, 0, 1], "assistant_masks": [0, 0, 1]},
        {"input_ids": [4, 5], "labels": [4, 5], "completion_mask": [0, 1], "assistant_masks": [0, 1]},
    ]
    result = plain_collator()(examples)
    assert_batch(result, TRL_1_10_KEYS, labels=[[-100, -100, 3, -100, 5]])
    theirs = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)(examples)
    torch.testing.assert_close(theirs["labels"], torch.tensor([[-100, 2, 3, -100, 5]]))  # masks ignored
    without_masks = [{k: v for k, v in e.items() if k in ("input_ids", "labels")} for e in examples]
    torch.testing.assert_close(plain_collator()(without_masks)["labels"], theirs["labels"])


# Upstream (1.10.0.dev0): test_single_example_single_doc, test_single_example_multiple_docs, test_multiple_examples
# (TRL's `get_position_ids_from_packed_seq_lengths`; here through the collator's `seq_lengths` input).
@pytest.mark.parametrize(
    ("seq_lengths", "positions"),
    [([[5]], [0, 1, 2, 3, 4]), ([[3, 2]], [0, 1, 2, 0, 1]), ([[2, 2], [3]], [0, 1, 0, 1, 0, 1, 2])],
    ids=["single_example_single_doc", "single_example_multiple_docs", "multiple_examples"],
)
def test_positions_from_packed_seq_lengths(seq_lengths, positions):
    examples = [{"input_ids": list(range(1, sum(s) + 1)), "seq_lengths": s} for s in seq_lengths]
    torch.testing.assert_close(plain_collator()(examples)["position_ids"], torch.tensor([positions]))
    assert_same_as_installed_trl(examples)


# Upstream (v0.19.1): test_padding_free_mode. Deliberately different (D11): no attention_mask, first labels -100.
def test_v0_19_padding_free_mode():
    result = plain_collator()([{"input_ids": [1, 2, 3]}, {"input_ids": [4, 5]}])
    # v0.19.1: attention_mask [[1, 1, 1, 1, 1]], labels [[1, 2, 3, 4, 5]]
    assert_batch(
        result, TRL_1_10_KEYS,
        input_ids=[[1, 2, 3, 4, 5]], position_ids=[[0, 1, 2, 0, 1]], labels=[[-100, 2, 3, -100, 5]],
    )


# Upstream (v0.19.1): test_padding_free_with_completion_mask. Deliberately different (D11): the first label of the
# second sequence is -100 although its completion mask is 1 (it would be predicted from the first sequence).
def test_v0_19_padding_free_with_completion_mask():
    examples = [
        {"input_ids": [1, 2, 3], "completion_mask": [0, 1, 1]},
        {"input_ids": [4, 5], "completion_mask": [1, 1]},
    ]
    # v0.19.1: labels [[-100, 2, 3, 4, 5]]
    assert_batch(plain_collator()(examples), TRL_1_10_KEYS, labels=[[-100, 2, 3, -100, 5]])


# Upstream (v0.19.1): test_packing_drops_attention_mask_for_flash_attention. No attention_mask, as upstream; labels
# differ (D11): v0.19.1 kept [[1, 2, 3, 4, 5, 6, 7, 8]].
def test_v0_19_packed_position_ids_drop_attention_mask():
    examples = [{"input_ids": [1, 2, 3, 4, 5, 6, 7, 8], "position_ids": [0, 1, 2, 0, 1, 0, 1, 2]}]
    assert_batch(
        plain_collator()(examples), TRL_1_10_KEYS,
        input_ids=[[1, 2, 3, 4, 5, 6, 7, 8]], position_ids=[[0, 1, 2, 0, 1, 0, 1, 2]],
        labels=[[-100, 2, 3, -100, 5, -100, 7, 8]],
    )


# Upstream (v0.19.1): test_padding_free_without_position_ids_keeps_attention_mask. Deliberately different (D11):
# never an attention_mask.
def test_v0_19_without_position_ids_no_attention_mask():
    result = plain_collator()([{"input_ids": [1, 2, 3, 4, 5]}])
    assert_batch(result, TRL_1_10_KEYS, position_ids=[[0, 1, 2, 3, 4]], labels=[[-100, 2, 3, 4, 5]])


@pytest.mark.parametrize("seed", range(3))
def test_same_as_installed_trl_on_random_examples(seed):
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 40, (9,), generator=generator).tolist()
    examples = [{"input_ids": torch.randint(1, 500, (n,), generator=generator).tolist()} for n in lengths]
    for example in examples[::2]:
        example["labels"] = [-100 if t % 3 == 0 else t for t in example["input_ids"]]
    assert_same_as_installed_trl(examples)
