"""`prepare_model_for_flattening` and its guard on tiny llama / qwen2 models, against the known-bad setups."""

import itertools

import numpy as np
import pytest
import torch

from flatcollate.boundaries import cu_seqlens_to_position_ids, lengths_to_cu_seqlens
from flatcollate.modeling import guard as guard_module
from flatcollate.modeling import prepare_model_for_flattening, unsupported_reason
from flatcollate.modeling.guard import install_guard
from flatcollate.modeling.prepared_state import is_prepared
from flatcollate.testing import tiny_causal_lm

LENGTHS = [5, 1, 9, 3]


def flattened_batch(lengths, *, vocab_size=256, seed=0) -> dict:
    """A flattened row with the collator's keys, built from `flatcollate.boundaries`."""
    cu = lengths_to_cu_seqlens(np.array(lengths))
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, vocab_size, (1, int(cu[-1])), generator=generator)
    cu_t = torch.from_numpy(cu)
    return {
        "input_ids": input_ids,
        "position_ids": torch.from_numpy(cu_seqlens_to_position_ids(cu))[None],
        "cu_seq_lens_q": cu_t,
        "cu_seq_lens_k": cu_t,
        "max_length_q": max(lengths),
        "max_length_k": max(lengths),
    }


@pytest.fixture(params=["llama", "qwen2"])
def model(request):
    return prepare_model_for_flattening(tiny_causal_lm(request.param))


def test_prepare_selects_the_backend_and_leaves_the_cache_settings(model):
    assert model.config.use_cache is True
    assert model.generation_config.use_cache is True
    assert model.config._attn_implementation == "flatcollate"


def test_flattened_batch_matches_each_sequence_alone(model):
    batch = flattened_batch(LENGTHS)
    flat = model(**batch).logits
    cu = batch["cu_seq_lens_q"].tolist()
    ids = batch["input_ids"]
    # Reference: each sequence through the model on its own (a loop over sequences, not tokens).
    alone = torch.cat([model(input_ids=ids[:, s:e]).logits for s, e in itertools.pairwise(cu)], dim=1)
    torch.testing.assert_close(flat, alone, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    ("bad", "words", "with_kwargs"),
    [
        ({"attention_mask": "ones"}, "attention_mask", True),
        ({"use_cache": True}, "use_cache=True", True),
        ({"use_cache": True}, "use_cache=True", False),
    ],
    ids=["cu_seq_lens-attention_mask", "cu_seq_lens-use_cache", "position_ids_only-use_cache"],
)
def test_guard_refuses_known_bad_setups(model, bad, words, with_kwargs):
    """Boundaries with a mask or a cache, and restarting positions with `use_cache=True`; restarting positions with a
    mask and no boundaries are an ordinary batch (`test_guard_ordinary_batches`)."""
    batch = flattened_batch(LENGTHS)
    if not with_kwargs:
        batch = {k: batch[k] for k in ("input_ids", "position_ids")}
    extra = {k: (torch.ones_like(batch["input_ids"]) if v == "ones" else v) for k, v in bad.items()}
    with pytest.raises(
        ValueError, match=r"(?s)flattened batch.*" + words.replace("=", ".") + r".*attend to each other"
    ):
        model(**batch, **extra)


def test_guard_refuses_past_key_values(model):
    from transformers import DynamicCache

    batch = flattened_batch(LENGTHS)
    with pytest.raises(ValueError, match="past_key_values"):
        model(**batch, past_key_values=DynamicCache(config=model.config))


def test_config_use_cache_on_runs_flattened_batches_without_a_cache(model):
    model.config.use_cache = True
    out = model(**flattened_batch(LENGTHS))
    assert out.past_key_values is None
    with pytest.raises(ValueError, match="use_cache"):
        model(**flattened_batch(LENGTHS), use_cache=True)


def test_guard_reads_positional_attention_mask(model):
    batch = flattened_batch(LENGTHS)
    ids = batch.pop("input_ids")
    with pytest.raises(ValueError, match="attention_mask"):
        model(ids, torch.ones_like(ids), **batch)


def test_guard_allows_ordinary_batches_without_looking_at_them(model, monkeypatch):
    calls = []
    monkeypatch.setattr(guard_module, "is_flattened", lambda arguments: calls.append(1) or True)
    model(**flattened_batch(LENGTHS))
    assert calls == [], "the guard inspected a batch that had no offending argument"


def test_unflattened_batch_with_mask_and_cache_passes_the_guard():
    model = tiny_causal_lm("llama")
    handle = install_guard(model)
    assert install_guard(model) is handle
    ids = torch.randint(0, 256, (2, 6))
    out = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=True)
    assert out.logits.shape == (2, 6, 256)


def test_keep_backend_with_none_stays_exact_with_sdpa():
    model = prepare_model_for_flattening(tiny_causal_lm("llama"), attn_implementation=None)
    assert model.config._attn_implementation == "sdpa"
    batch = flattened_batch(LENGTHS)
    cu = batch["cu_seq_lens_q"].tolist()
    flat = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits
    alone = torch.cat([model(input_ids=batch["input_ids"][:, s:e]).logits for s, e in itertools.pairwise(cu)], dim=1)
    torch.testing.assert_close(flat, alone, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="use_cache"):
        model(**batch, use_cache=True)


def test_unsupported_family_raises_naming_family_and_reason():
    model = tiny_causal_lm("rwkv")
    assert "carry state" in unsupported_reason(model)
    with pytest.raises(ValueError, match=r"'rwkv'.*carry state.*strict=False"):
        prepare_model_for_flattening(model)
    with pytest.warns(UserWarning, match="rwkv"):
        prepare_model_for_flattening(model, strict=False)
    batch = flattened_batch(LENGTHS)
    with pytest.raises(ValueError, match=r"family 'rwkv' cannot keep sequences apart.*carry state"):
        model(input_ids=batch["input_ids"], position_ids=batch["position_ids"])
    # Unflattened rows still run (the tiny rwkv's own cache path fails upstream, hence use_cache=False).
    assert model(input_ids=batch["input_ids"][:, :5], use_cache=False).logits.shape[:2] == (1, 5)


def test_rejects_non_transformers_model():
    with pytest.raises(TypeError, match="PreTrainedModel"):
        prepare_model_for_flattening(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("backend", ["flash_attention_2", "no_such_backend"])
def test_a_backend_that_cannot_be_selected_leaves_the_model_unchanged(backend, monkeypatch):
    from flatcollate.attention import capabilities

    if backend == "flash_attention_2" and capabilities.flash_attn_varlen_func is not None:
        pytest.skip("flash-attn is installed here, so flash_attention_2 can be selected")
    model = tiny_causal_lm("llama")
    before = (model.config.use_cache, model.generation_config.use_cache, model.config._attn_implementation)
    with pytest.raises(ValueError, match=rf"(?s)attn_implementation='{backend}'.*left unchanged"):
        prepare_model_for_flattening(model, attn_implementation=backend)
    after = (model.config.use_cache, model.generation_config.use_cache, model.config._attn_implementation)
    assert after == before
    assert not is_prepared(model)


def test_guard_stays_when_another_library_replaces_forward_afterwards(model):
    # TRL installs its fused-loss forward on the instance after the model is built; the guard must survive it.
    import types

    model.forward = types.MethodType(lambda self, **kwargs: type(self).forward(self, **kwargs), model)
    batch = flattened_batch(LENGTHS)
    with pytest.raises(ValueError, match="attention_mask"):
        model(**batch, attention_mask=torch.ones_like(batch["input_ids"]))
    batch["position_ids"] = torch.arange(sum(LENGTHS))[None]
    with pytest.raises(ValueError, match="do not restart"):
        model(**batch)
