"""A prepared model still behaves like the model it was: ordinary and padded batches, cached generation, checkpoints.

Only flattened batches take the packed path; every other call runs exactly as the unprepared model would.
"""

import copy
import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from flatcollate import DataCollatorWithFlattening
from flatcollate.modeling import prepare_model_for_flattening
from flatcollate.testing import tiny_causal_lm

FAMILIES = [("llama", {}), ("gemma2", {"sliding_window": 4}), ("mistral", {"sliding_window": 3})]


@pytest.fixture(params=FAMILIES, ids=[family for family, _ in FAMILIES])
def pair(request):
    """The same weights twice: unprepared (its own default backend) and prepared."""
    family, overrides = request.param
    plain = tiny_causal_lm(family, seed=4, **overrides)
    plain.set_attn_implementation("eager" if family == "gemma2" else "sdpa")  # softcap needs eager in transformers
    return plain.eval(), prepare_model_for_flattening(copy.deepcopy(plain)).eval()


def padded(lengths, *, left: bool, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    longest = max(lengths)
    ids = torch.zeros(len(lengths), longest, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):  # a loop over rows builds the reference padding
        span = slice(longest - n, longest) if left else slice(0, n)
        ids[row, span] = torch.randint(1, 256, (n,), generator=generator)
        mask[row, span] = 1
    return ids, mask


def test_ordinary_rows_without_positions_run_as_before(pair):
    plain, prepared = pair
    ids = torch.randint(0, 256, (3, 7))
    torch.testing.assert_close(prepared(input_ids=ids).logits, plain(input_ids=ids).logits, atol=1e-5, rtol=0)


@pytest.mark.parametrize("left", [False, True], ids=["right-padded", "left-padded"])
def test_padded_batches_run_as_before(pair, left):
    plain, prepared = pair
    ids, mask = padded([6, 2, 9], left=left)
    expected = plain(input_ids=ids, attention_mask=mask).logits
    got = prepared(input_ids=ids, attention_mask=mask).logits
    real = mask.bool()
    torch.testing.assert_close(got[real], expected[real], atol=1e-5, rtol=0)


def test_cached_generation_matches_the_unprepared_model(pair):
    plain, prepared = pair
    ids, mask = padded([5, 3], left=True, seed=1)
    options = {"max_new_tokens": 6, "do_sample": False, "use_cache": True, "pad_token_id": 0}
    expected = plain.generate(input_ids=ids, attention_mask=mask, **options)
    torch.testing.assert_close(prepared.generate(input_ids=ids, attention_mask=mask, **options), expected)


def test_flattened_batches_still_train_exactly_with_the_config_cache_default_on(pair):
    _, prepared = pair
    assert prepared.config.use_cache is True, "prepare must not change the saved configuration"
    generator = torch.Generator().manual_seed(2)
    features = [{"input_ids": torch.randint(0, 256, (n,), generator=generator).tolist()} for n in (5, 1, 7)]
    batch = DataCollatorWithFlattening()(features)
    batch.pop("labels")
    flat = prepared(**batch).logits
    alone = torch.cat([prepared(input_ids=torch.tensor([f["input_ids"]])).logits for f in features], dim=1)
    torch.testing.assert_close(flat, alone, atol=1e-5, rtol=0)


def test_flattened_batch_with_an_explicit_cache_or_mask_is_still_refused(pair):
    _, prepared = pair
    batch = DataCollatorWithFlattening()([{"input_ids": [1, 2, 3]}, {"input_ids": [4, 5]}])
    with pytest.raises(ValueError, match="use_cache=True"):
        prepared(**batch, use_cache=True)
    with pytest.raises(ValueError, match="attention_mask"):
        prepared(**batch, attention_mask=torch.ones_like(batch["input_ids"]))


def test_saved_checkpoint_looks_like_the_unprepared_model(tmp_path):
    plain = tiny_causal_lm("llama", seed=5)
    plain.save_pretrained(tmp_path / "plain")
    prepare_model_for_flattening(copy.deepcopy(plain)).save_pretrained(tmp_path / "prepared")
    for name in ("config.json", "generation_config.json"):
        saved = json.loads((tmp_path / "prepared" / name).read_text())
        original = json.loads((tmp_path / "plain" / name).read_text())
        assert saved == original, name
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "prepared")
    assert reloaded.config.use_cache is True and reloaded.config._attn_implementation != "flatcollate"
