"""`DataCollatorForCompletionOnlyLM` takes what TRL 0.x's class took: arguments, example forms, padding side."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from flatcollate import DataCollatorForCompletionOnlyLM
from flatcollate.collate.completion_only import pad_flat
from flatcollate.collate.flattening import flatten_features

R = [90, 91]  # response template ids
U = [80, 81]  # instruction template ids
BOTH_MODES = pytest.mark.parametrize("padding_free", [False, True], ids=["padded", "flattened"])


def pad_tokenizer(padding_side="right", pad_token_id=0):
    return SimpleNamespace(pad_token_id=pad_token_id, padding_side=padding_side)


def test_tokenizer_is_the_third_positional_argument():
    tokenizer = pad_tokenizer()
    collator = DataCollatorForCompletionOnlyLM(R, U, tokenizer, padding_free=False)
    assert collator.tokenizer is tokenizer
    batch = collator([{"input_ids": [*U, 1, *R, 5, 6]}, {"input_ids": [*U, *R, 7]}])
    assert batch["labels"].tolist() == [[-100] * 5 + [5, 6], [-100] * 4 + [7, -100, -100]]
    with pytest.raises(TypeError):
        DataCollatorForCompletionOnlyLM(R, U, tokenizer, False)  # mlm and the rest stay keyword-only


@BOTH_MODES
@pytest.mark.parametrize("container", [list, tuple, np.array, torch.tensor], ids=["list", "tuple", "numpy", "tensor"])
def test_examples_may_be_plain_sequences_of_ids(padding_free, container):
    collator = DataCollatorForCompletionOnlyLM(R, tokenizer=pad_tokenizer(), padding_free=padding_free)
    plain = collator([container([1, *R, 5, 6]), container([*R, 7])])
    as_dicts = collator([{"input_ids": [1, *R, 5, 6]}, {"input_ids": [*R, 7]}])
    assert set(plain) == set(as_dicts)
    for key in as_dicts:
        torch.testing.assert_close(plain[key], as_dicts[key], msg=key)


@pytest.mark.parametrize(
    ("example", "error", "pattern"),
    [
        ("1 90 91 5", TypeError, r"example 1 must be a dict with 'input_ids' or a sequence of token ids, got str"),
        (7, TypeError, r"example 1 must be a dict with 'input_ids' or a sequence of token ids, got int"),
        ([[1, 90], [91, 5]], ValueError, r"example 1: field 'input_ids' must be 1-D"),
        ({"labels": [1, 2]}, ValueError, r"example 1 has no 'input_ids'"),
    ],
)
def test_malformed_example_names_its_index(example, error, pattern):
    with pytest.raises(error, match=pattern):
        DataCollatorForCompletionOnlyLM(R)([[1, *R, 5], example])


def test_torch_call_numpy_call_and_return_tensors_argument():
    collator = DataCollatorForCompletionOnlyLM(R)
    examples = [[1, *R, 5, 6], [*R, 7]]
    expected = [[-100, -100, -100, 5, 6, -100, -100, 7]]
    torch_batch = collator.torch_call(examples)
    assert isinstance(torch_batch["labels"], torch.Tensor) and torch_batch["labels"].tolist() == expected
    numpy_batch = collator.numpy_call(examples)
    assert isinstance(numpy_batch["labels"], np.ndarray) and numpy_batch["labels"].tolist() == expected
    assert isinstance(collator(examples, return_tensors="np")["position_ids"], np.ndarray)
    with pytest.raises(ValueError, match=r"return_tensors must be 'pt' or 'np', got 'tf'"):
        collator(examples, return_tensors="tf")


def test_padded_mode_pads_on_the_tokenizer_side():
    tokenizer = pad_tokenizer("left")
    collator = DataCollatorForCompletionOnlyLM(R, tokenizer=tokenizer, padding_free=False, pad_to_multiple_of=3)
    batch = collator([[1, *R, 5, 6], [*R, 7]])
    torch.testing.assert_close(batch["input_ids"], torch.tensor([[0, 1, 90, 91, 5, 6], [0, 0, 0, 90, 91, 7]]))
    torch.testing.assert_close(batch["labels"], torch.tensor([[-100] * 4 + [5, 6], [-100] * 5 + [7]]))
    torch.testing.assert_close(batch["attention_mask"], torch.tensor([[0, 1, 1, 1, 1, 1], [0, 0, 0, 1, 1, 1]]))
    tokenizer.padding_side = "right"  # read at every call, like `tokenizer.pad`
    assert collator([[1, *R, 5, 6], [*R, 7]])["input_ids"][1].tolist() == [90, 91, 7, 0, 0, 0]


@pytest.mark.parametrize("padding_side", ["left", "right"])
def test_pad_flat_matches_per_example_padding_on_random_lengths(padding_side):
    rng = np.random.default_rng(4)
    for _ in range(30):
        examples = [rng.integers(1, 50, int(rng.integers(1, 12))).tolist() for _ in range(int(rng.integers(1, 6)))]
        multiple = int(rng.integers(1, 5))
        flat = flatten_features([{"input_ids": ids} for ids in examples])
        padded = pad_flat(flat, pad_token_id=0, pad_to_multiple_of=multiple, padding_side=padding_side)
        width = -(-max(map(len, examples)) // multiple) * multiple
        for row, ids in enumerate(examples):  # one example at a time, padded by hand
            pad = [0] * (width - len(ids))
            mask = [1] * len(ids)
            if padding_side == "left":
                assert padded["input_ids"][row].tolist() == pad + ids
                assert padded["attention_mask"][row].tolist() == pad + mask
            else:
                assert padded["input_ids"][row].tolist() == ids + pad
                assert padded["attention_mask"][row].tolist() == mask + pad


def test_unknown_padding_side_is_refused():
    collator = DataCollatorForCompletionOnlyLM(R, tokenizer=pad_tokenizer("middle"), padding_free=False)
    with pytest.raises(ValueError, match=r"padding_side must be 'left' or 'right', got 'middle'"):
        collator([[1, *R, 5]])


def test_missing_pad_token_says_how_to_set_one():
    with pytest.raises(ValueError, match=r"has no pad token.*tokenizer\.pad_token = tokenizer\.eos_token"):
        DataCollatorForCompletionOnlyLM(R, tokenizer=pad_tokenizer(pad_token_id=None), padding_free=False)
    with pytest.raises(ValueError, match=r"needs a `tokenizer`.*padding_free=True"):
        DataCollatorForCompletionOnlyLM(R, padding_free=False)


@BOTH_MODES
def test_tokens_equal_to_the_pad_id_keep_their_labels(tokenizer_dir, padding_free):
    # TRL 0.x set every label equal to the pad id to -100, so with pad = eos the model never learned to stop.
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir("gpt2"))
    with pytest.raises(ValueError, match=r"tokenizer\.pad_token = tokenizer\.eos_token"):
        DataCollatorForCompletionOnlyLM("### Answer:", tokenizer=tokenizer, padding_free=False)
    tokenizer.pad_token = tokenizer.eos_token
    collator = DataCollatorForCompletionOnlyLM("### Answer:", tokenizer=tokenizer, padding_free=padding_free)
    texts = ("Q?\n### Answer: yes", "Hi\n### Answer: no no")
    examples = [[*tokenizer.encode(text), tokenizer.eos_token_id] for text in texts]
    labels = collator(examples)["labels"]
    trained = labels[labels != -100].tolist()
    assert trained.count(tokenizer.eos_token_id) == 2
    assert tokenizer.decode(trained) == f" yes{tokenizer.eos_token} no no{tokenizer.eos_token}"


def trl_0x_turn_labels(ids, response, instruction):
    """TRL 0.x's multi-turn rule, re-stated from `trl/trainer/utils.py` (v0.19.1) as a slow reference.

    It pairs the k-th instruction template with the k-th response template, and masks everything after the last
    instruction when there are fewer responses than instructions.
    """
    def starts(pattern):
        return [i for i in range(len(ids)) if ids[i : i + len(pattern)] == pattern]

    labels = list(ids)
    response_ends = [i + len(response) for i in starts(response)]
    instructions = starts(instruction)
    if not response_ends or not instructions:
        return [-100] * len(ids)
    if instructions[0] > response_ends[0]:
        instructions = [0, *instructions]
    for turn, (start, end) in enumerate(zip(instructions, response_ends)):  # noqa: B905 - pairs as TRL did
        labels[(0 if turn == 0 else start) : end] = [-100] * (end - (0 if turn == 0 else start))
    if len(response_ends) < len(instructions):
        labels[instructions[-1] :] = [-100] * (len(ids) - instructions[-1])
    return labels


def test_multi_turn_labels_match_trl_on_alternating_turns():
    rng = np.random.default_rng(5)
    collator = DataCollatorForCompletionOnlyLM(R, U)
    for _ in range(100):
        ids = rng.integers(0, 50, int(rng.integers(0, 3))).tolist()  # an optional preamble (a system prompt)
        for _turn in range(int(rng.integers(1, 4))):
            ids += U + rng.integers(0, 50, int(rng.integers(0, 4))).tolist()
            ids += R + rng.integers(0, 50, int(rng.integers(0, 4))).tolist()
        if rng.random() < 0.3:  # a last user turn without its answer
            ids += U + rng.integers(0, 50, int(rng.integers(0, 4))).tolist()
        labels, _ = collator.completion_labels({"input_ids": ids}, index=0)
        assert labels.tolist() == trl_0x_turn_labels(ids, R, U)


def test_two_instruction_templates_in_a_row_keep_the_completions():
    # Deliberately different: a user turn right after another (or a system prompt using the instruction template)
    # shifts TRL 0.x's pairing of instructions with responses, and it trained on nothing here.
    ids = [*U, 1, *U, 2, *R, 3, *U, 4, *R, 5]
    labels, _ = DataCollatorForCompletionOnlyLM(R, U).completion_labels({"input_ids": ids}, index=0)
    assert [t for t in labels.tolist() if t != -100] == [3, 5]
    assert set(trl_0x_turn_labels(ids, R, U)) == {-100}
