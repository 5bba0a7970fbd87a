"""transformers' tests of `DataCollatorWithFlattening`, ported to flatcollate's class of the same name.

Upstream: huggingface/transformers `tests/trainer/test_data_collator.py`, class `TestDataCollatorWithFlattening`, read
at commit 333839c694fb5b13b012d69dcea312e7a8ef36af of the fork evalstate/transformers (newer than v5.23.0; the v5.23.0
tag itself could not be fetched here). Its `return_cu_seqlens` tests are left out: transformers 5.23.0, the version
this project pins, has no such option (passing it raises `TypeError` in both classes).

flatcollate emits the flash-attention kwargs and `seq_idx` by default where transformers needs them asked for; the
tests pass transformers' defaults explicitly where they compare key sets, and assert flatcollate's defaults
separately. docs/peers.md lists each difference and why.
"""

import copy

import numpy as np
import pytest
import torch
import transformers

from flatcollate import DataCollatorWithFlattening

TRANSFORMERS_DEFAULTS = {"return_flash_attn_kwargs": False, "return_seq_idx": False}


def three_examples():
    return [
        {"input_ids": [10, 11, 12]},
        {"input_ids": [20, 21, 22, 23, 24, 25]},
        {"input_ids": [30, 31, 32, 33, 34, 35, 36]},
    ]


FLAT_IDS = [10, 11, 12, 20, 21, 22, 23, 24, 25, 30, 31, 32, 33, 34, 35, 36]
FLAT_POSITIONS = [0, 1, 2, 0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5, 6]


def test_basic_flattening():
    # upstream: test_basic_flattening
    batch = DataCollatorWithFlattening(return_tensors="pt", **TRANSFORMERS_DEFAULTS)(three_examples())
    assert set(batch) == {"input_ids", "labels", "position_ids"}
    assert batch["input_ids"].shape == (1, 16)
    assert batch["input_ids"][0].tolist() == FLAT_IDS
    assert batch["position_ids"][0].tolist() == FLAT_POSITIONS


def test_default_keys_add_boundaries():
    # upstream: test_basic_flattening (its key check, against flatcollate's defaults)
    # Deliberately different: boundaries on by default (transformers: off), so flash-attention kernels and
    # state-space layers never fall back to guessing sequence starts from `position_ids`. Never an attention mask.
    batch = DataCollatorWithFlattening()(three_examples())
    assert set(batch) == {
        "input_ids", "labels", "position_ids", "seq_idx", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q",
        "max_length_k",
    }  # fmt: skip
    assert batch["input_ids"][0].tolist() == FLAT_IDS


def test_flash_attn_kwargs():
    # upstream: test_flash_attn_kwargs
    batch = DataCollatorWithFlattening(return_tensors="pt", return_flash_attn_kwargs=True)(three_examples())
    assert batch["cu_seq_lens_q"].tolist() == batch["cu_seq_lens_k"].tolist() == [0, 3, 9, 16]
    assert batch["cu_seq_lens_q"].dtype == torch.int32
    assert batch["max_length_q"] == batch["max_length_k"] == 7
    assert type(batch["max_length_q"]) is int


def test_seq_idx():
    # upstream: test_seq_idx
    batch = DataCollatorWithFlattening(return_tensors="pt", return_seq_idx=True)(three_examples())
    assert batch["seq_idx"][0].tolist() == [0, 0, 0, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2]
    assert batch["seq_idx"].dtype == torch.int32


@pytest.mark.parametrize("container", [torch.tensor, list], ids=["tensor", "list"])
def test_with_labels(container):
    # upstream: test_with_labels
    examples = [
        {"input_ids": container([1, 2, 3]), "labels": container([10, 11, 12])},
        {"input_ids": container([4, 5]), "labels": container([13, 14])},
    ]
    batch = DataCollatorWithFlattening(return_tensors="pt")(examples)
    assert batch["input_ids"].shape == batch["labels"].shape == (1, 5)
    assert batch["labels"].tolist() == [[-100, 11, 12, -100, 14]]  # the first label of each sequence separates


def test_numpy_output():
    # upstream: test_numpy_output
    batch = DataCollatorWithFlattening(return_tensors="np")(three_examples())
    assert isinstance(batch["input_ids"], np.ndarray)
    assert batch["input_ids"].shape == batch["position_ids"].shape == (1, 16)


def test_numpy_flash_attn_kwargs():
    # upstream: test_numpy_flash_attn_kwargs
    batch = DataCollatorWithFlattening(return_tensors="np", return_flash_attn_kwargs=True)(three_examples())
    assert batch["cu_seq_lens_q"].tolist() == batch["cu_seq_lens_k"].tolist() == [0, 3, 9, 16]
    assert batch["cu_seq_lens_q"].dtype == np.int32
    assert batch["max_length_k"] == 7


@pytest.mark.parametrize("return_tensors", ["pt", "np"])
@pytest.mark.parametrize("container", [list, np.array, torch.tensor], ids=["list", "numpy", "tensor"])
def test_immutability(return_tensors, container):
    # upstream: test_immutability (also numpy and tensor inputs, and writes into the batch)
    examples = [{key: container(value) for key, value in example.items()} for example in three_examples()]
    examples[0]["labels"] = container([-100, 11, 12])
    before = copy.deepcopy(examples)
    batch = DataCollatorWithFlattening(return_tensors=return_tensors)(examples)
    batch["labels"][...] = 0  # writing into the batch must not reach the examples either
    batch["input_ids"][...] = 0
    for original, example in zip(before, examples, strict=True):
        assert original.keys() == example.keys()
        for key in original:
            assert type(example[key]) is type(original[key])
            assert list(map(int, example[key])) == list(map(int, original[key]))


@pytest.mark.parametrize("return_tensors", ["pt", "np"])
@pytest.mark.parametrize("with_labels", [False, True])
def test_same_values_as_transformers_with_its_defaults(return_tensors, with_labels):
    # upstream: none; checks against the installed transformers class itself
    examples = three_examples()
    if with_labels:
        examples = [{**example, "labels": [-100, *example["input_ids"][1:-1], 5]} for example in examples]
    ours = DataCollatorWithFlattening(return_tensors=return_tensors, **TRANSFORMERS_DEFAULTS)(copy.deepcopy(examples))
    theirs = transformers.DataCollatorWithFlattening(return_tensors=return_tensors)(copy.deepcopy(examples))
    assert set(ours) == set(theirs)
    for key in theirs:
        assert ours[key].dtype == theirs[key].dtype, key
        assert ours[key].tolist() == theirs[key].tolist(), key


def test_labels_of_every_example_are_used():
    # upstream: none; a deliberate difference
    # Deliberately different: transformers reads `labels` only when the first example has them (and fails on a
    # later example without); flatcollate takes each example's own labels, or its input ids where it has none.
    examples = [{"input_ids": [1, 2, 3]}, {"input_ids": [4, 5, 6], "labels": [-100, -100, 6]}]
    assert DataCollatorWithFlattening()(examples)["labels"].tolist() == [[-100, 2, 3, -100, -100, 6]]
    theirs = transformers.DataCollatorWithFlattening()(copy.deepcopy(examples))
    assert theirs["labels"].tolist() == [[-100, 2, 3, -100, 5, 6]]  # the second example's mask is lost
