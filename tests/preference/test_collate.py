"""`DataCollatorForPreference` holds what TRL's padded DPO `DataCollatorForPreference` holds, row for sequence: every
chosen sequence then every rejected one, the same ids, completion masks and reference log-probabilities, truncated at
`max_length` as TRL truncates (`keep_start`, `keep_end`); bad input names the example and the field."""

import random

import pytest
import torch

from flatcollate.preference import DataCollatorForPreference

from .reference import flattened, unpadded

trl_dpo = pytest.importorskip("trl.trainer.dpo_trainer")


def random_pairs(count: int, *, seed: int, reference: bool) -> list[dict]:
    """Prompts of 0-9 tokens, chosen and rejected completions of 1-7."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(count):
        pair = {
            key: [rng.randrange(1, 100) for _ in range(rng.randrange(low, 10))]
            for key, low in (("prompt_ids", 0), ("chosen_ids", 1), ("rejected_ids", 1))
        }
        if reference:
            pair["ref_chosen_logps"], pair["ref_rejected_logps"] = -rng.random() * 50, -rng.random() * 50
        pairs.append(pair)
    return pairs


@pytest.mark.parametrize("truncation_mode", ["keep_start", "keep_end"])
@pytest.mark.parametrize(("count", "max_length", "reference"), [(6, None, False), (1, None, True), (8, 5, True)])
@pytest.mark.parametrize("seed", range(3))
def test_same_sequences_as_trls_padded_collator(truncation_mode, count, max_length, reference, seed):
    pairs = random_pairs(count, seed=seed, reference=reference)
    options = {"max_length": max_length, "truncation_mode": truncation_mode}
    padded = trl_dpo.DataCollatorForPreference(pad_token_id=0, **options)(pairs)
    batch = DataCollatorForPreference(**options)(pairs)
    assert flattened(batch, "") == unpadded(padded, "")
    for key in ("ref_chosen_logps", "ref_rejected_logps"):
        assert (key in batch) == reference
        if reference:
            torch.testing.assert_close(batch[key], padded[key], rtol=0, atol=0)


BAD = [
    ([], ValueError, r"non-empty list"),
    ([{"prompt_ids": [1], "chosen_ids": [2]}], ValueError, r"example 0 has no `rejected_ids`.*DPOTrainer"),
    ([{"prompt_ids": [1], "chosen_ids": [2], "rejected_ids": []}], ValueError, r"example 0: `rejected_ids` is empty"),
    ([{"prompt_ids": [1], "chosen_ids": ["a"], "rejected_ids": [2]}], TypeError, r"example 0: `chosen_ids` must"),
]


@pytest.mark.parametrize(("examples", "error", "match"), BAD)
def test_bad_input_names_the_example_and_the_field(examples, error, match):
    with pytest.raises(error, match=match):
        DataCollatorForPreference()(examples)


def test_bad_truncation_mode_is_refused():
    with pytest.raises(ValueError, match="truncation_mode must be one of"):
        DataCollatorForPreference(truncation_mode="keep_middle")
