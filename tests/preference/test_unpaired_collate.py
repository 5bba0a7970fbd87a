"""`DataCollatorForUnpairedPreference` holds what TRL's padded `DataCollatorForUnpairedPreference` holds, row for
sequence: the same ids, completion masks, labels and reference log-probabilities, the KL sequences in their own row,
truncated at `max_length` exactly as TRL truncates; bad input names the example and the field."""

import random

import pytest
import torch

from flatcollate.preference import DataCollatorForUnpairedPreference

from .reference import flattened, unpadded

trl_kto = pytest.importorskip("trl.trainer.kto_trainer")


def random_examples(count: int, *, seed: int, kl: bool = True, reference: bool = False) -> list[dict]:
    """Prompts of 1-9 tokens and completions of 0-7, KL completions rotated as TRL rotates them."""
    rng = random.Random(seed)
    examples = []
    for _ in range(count):
        prompt = [rng.randrange(1, 100) for _ in range(rng.randrange(1, 10))]
        completion = [rng.randrange(1, 100) for _ in range(rng.randrange(0, 8))]
        examples.append({"prompt_ids": prompt, "completion_ids": completion, "label": rng.random() < 0.6})
    for index, example in enumerate(examples):
        if kl:
            example["KL_completion_ids"] = examples[index - 1]["completion_ids"]
        if reference:
            example["ref_logps"], example["ref_KL_logps"] = -rng.random() * 50, -rng.random() * 50
    return examples


CASES = {
    "many": dict(count=8, max_length=None),
    "one example": dict(count=1, max_length=None),
    "truncated": dict(count=8, max_length=6),
    "length 1": dict(count=5, max_length=1),
    "no kl": dict(count=6, max_length=None, kl=False),
    "precomputed reference": dict(count=4, max_length=9, reference=True),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
@pytest.mark.parametrize("seed", range(3))
def test_same_sequences_as_trls_padded_collator(case, seed):
    examples = random_examples(case["count"], seed=seed, kl=case.get("kl", True), reference=case.get("reference"))
    padded = trl_kto.DataCollatorForUnpairedPreference(pad_token_id=0, max_length=case["max_length"])(examples)
    batch = DataCollatorForUnpairedPreference(max_length=case["max_length"])(examples)
    row = ("input_ids", "labels", "position_ids", "completion_mask", "cu_seq_lens_q", "cu_seq_lens_k")
    row += ("max_length_q", "max_length_k")
    expected_keys = {*row, "label"} | ({f"KL_{key}" for key in row} if case.get("kl", True) else set())
    expected_keys |= {"ref_logps", "ref_KL_logps"} if case.get("reference") else set()
    assert batch.keys() == expected_keys
    for prefix in ("", "KL_") if case.get("kl", True) else ("",):
        assert flattened(batch, prefix) == unpadded(padded, prefix)
        assert batch[f"{prefix}input_ids"].dtype == batch[f"{prefix}completion_mask"].dtype == torch.int64
    for key in ("label", "ref_logps", "ref_KL_logps"):
        if key in padded:
            torch.testing.assert_close(batch[key], padded[key], rtol=0, atol=0)


def test_truncation_keeps_the_first_max_length_tokens_of_each_sequence():
    examples = [
        {"prompt_ids": [1, 2, 3], "completion_ids": [4, 5], "KL_completion_ids": [6, 7, 8], "label": True},
        {"prompt_ids": [9, 10, 11, 12], "completion_ids": [13], "KL_completion_ids": [14], "label": False},
    ]
    batch = DataCollatorForUnpairedPreference(max_length=4)(examples)
    assert batch["input_ids"].tolist() == [[1, 2, 3, 4, 9, 10, 11, 12]]
    assert batch["completion_mask"].tolist() == [[0, 0, 0, 1, 0, 0, 0, 0]]
    assert batch["KL_input_ids"].tolist() == [[1, 2, 3, 6, 9, 10, 11, 12]]
    assert batch["cu_seq_lens_q"].tolist() == batch["KL_cu_seq_lens_q"].tolist() == [0, 4, 8]


BAD = [
    ([], ValueError, r"non-empty list"),
    ({"prompt_ids": [1]}, ValueError, r"non-empty list"),
    ([{"prompt_ids": [1], "label": True}], ValueError, r"example 0 has no `completion_ids`.*KTOTrainer"),
    ([{"prompt_ids": [1], "completion_ids": [2]}], ValueError, r"example 0 has no `label`"),
    ([{"prompt_ids": [1], "completion_ids": [2.0], "label": True}], TypeError, r"example 0: `completion_ids` must"),
    ([{"prompt_ids": [1], "completion_ids": [2], "label": "yes"}], TypeError, r"example 0: `label` must"),
    ([{"prompt_ids": [1], "completion_ids": [2], "label": 2}], ValueError, r"example 0: `label` must"),
    (
        [
            {"prompt_ids": [1], "completion_ids": [2], "label": True},
            {"prompt_ids": [], "completion_ids": [], "label": 0},
        ],
        ValueError,
        r"example 1: `completion_ids` and `prompt_ids` are both empty",
    ),
    (
        [
            {"prompt_ids": [1], "completion_ids": [2], "KL_completion_ids": [3], "label": True},
            {"prompt_ids": [1], "completion_ids": [2], "label": False},
        ],
        ValueError,
        r"example 1 has no `KL_completion_ids` while example 0 has one",
    ),
    (
        [
            {"prompt_ids": [1], "completion_ids": [2], "label": True, "ref_logps": -1.0},
            {"prompt_ids": [1], "completion_ids": [2], "label": False},
        ],
        ValueError,
        r"`ref_logps` is in some examples.*missing from example 1",
    ),
]


@pytest.mark.parametrize(("examples", "error", "match"), BAD)
def test_bad_input_names_the_example_and_the_field(examples, error, match):
    with pytest.raises(error, match=match):
        DataCollatorForUnpairedPreference()(examples)


@pytest.mark.parametrize("max_length", [0, -3, 2.5, True])
def test_bad_max_length_is_refused(max_length):
    with pytest.raises(ValueError, match="max_length must be a positive number of tokens"):
        DataCollatorForUnpairedPreference(max_length=max_length)
