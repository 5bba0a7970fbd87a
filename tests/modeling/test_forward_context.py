"""One forward, one explicit context: a flattened forward reads what its own batch and its own model state, never a
fact left over from another forward (a tensor's attribute), a proxy for a fact (a mask's presence, a `model_type`
string, the top-level config of a composite model), nor labels that cross a boundary.

Every proof runs the prepared model on a flattened batch against an unprepared twin with identical weights running
each sequence alone (`per_sequence`, `assert_exact` in conftest), and has a negative control: the same proof with one
boundary moved by a token fails.
"""

import copy

import numpy as np
import pytest
import torch
from transformers import MambaConfig, MambaForCausalLM

from flatcollate import DataCollatorWithFlattening, prepare_model_for_flattening
from flatcollate._conventions import STATE_ATTRIBUTE
from flatcollate.check.runs import gradients
from flatcollate.testing import tiny_causal_lm, tiny_vision_lm


def sequences(lengths, seed=0, vocab=256):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=generator) for n in lengths]


def collate(parts, **options):
    return DataCollatorWithFlattening(**options)([{"input_ids": part.tolist()} for part in parts])


def flat(model, **inputs):
    """`(logits, loss, grads)` of one forward and backward of the model's own loss."""
    model.zero_grad(set_to_none=True)
    out = model(**inputs)
    out.loss.backward()
    return out.logits.detach().reshape(1, -1, out.logits.shape[-1]), out.loss.detach(), gradients(model)


def twins(family, seed=0, **overrides):
    base = tiny_causal_lm(family, seed=seed, **overrides)
    return base, prepare_model_for_flattening(copy.deepcopy(base))


def shifted(position_ids: torch.Tensor) -> torch.Tensor:
    """Restarting positions with their second boundary moved one token later (the negative control)."""
    moved = position_ids.clone().reshape(-1)
    start = int(torch.nonzero(moved[1:] == 0)[0]) + 1
    moved[start] = moved[start - 1] + 1
    end = start + 1
    while end < len(moved) and moved[end] != 0:  # the rest of the second sequence, one position lower
        moved[end] -= 1
        end += 1
    return moved.reshape(position_ids.shape)


def recut(parts):
    """The same tokens with the second sequence's first token moved to the end of the first (the negative control of
    a per-sequence reference: a proof that passes against both proves nothing about boundaries)."""
    return [torch.cat([parts[0], parts[1][:1]]), parts[1][1:], *parts[2:]]


def test_shifted_moves_one_boundary_by_one_token():
    assert shifted(torch.tensor([[0, 1, 2, 0, 1, 2, 0, 1]])).tolist() == [[0, 1, 2, 3, 0, 1, 0, 1]]


# ---- 1. nothing outlives its forward --------------------------------------------------------------------------------


def test_tensors_refilled_through_data_get_the_new_batchs_boundaries(per_sequence, assert_exact):
    base, model = twins("llama")
    first, second = sequences([5, 3, 8], 0), sequences([8, 2, 6], 1)  # same total: the same tensors are reused
    batch = collate(first, return_flash_attn_kwargs=False)
    model(**batch)
    refill = collate(second, return_flash_attn_kwargs=False)
    for key in ("input_ids", "labels", "position_ids"):
        batch[key].data = refill[key]
    inputs = {key: batch[key] for key in ("input_ids", "labels", "position_ids")}
    got = flat(model, **inputs, attention_mask=torch.ones_like(batch["input_ids"]))
    assert_exact(got, per_sequence(base, second))
    with pytest.raises(AssertionError):  # negative control
        moved = {**inputs, "position_ids": shifted(inputs["position_ids"])}
        assert_exact(flat(model, **moved), per_sequence(base, second))


def test_numpy_buffers_refilled_behind_the_tensors_reach_the_inner_model_as_they_are_now(per_sequence):
    base, model = twins("llama")
    first, second = sequences([4, 9, 3], 0), sequences([7, 7, 2], 1)
    ids, positions = np.zeros((1, 16), np.int64), np.zeros((1, 16), np.int64)
    ids_tensor, positions_tensor = torch.from_numpy(ids), torch.from_numpy(positions)

    def fill(parts):
        batch = collate(parts, return_flash_attn_kwargs=False)
        ids[:], positions[:] = batch["input_ids"].numpy(), batch["position_ids"].numpy()

    fill(first)
    model(input_ids=ids_tensor, position_ids=positions_tensor)
    fill(second)
    with torch.no_grad():  # the inner model, as value heads and embedding extraction call it
        logits = model.lm_head(model.model(input_ids=ids_tensor, position_ids=positions_tensor).last_hidden_state)
    expected = per_sequence(base, second, backward=False)[0]
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=0)
    fill(sequences([7, 8, 1], 1))  # negative control: the same tokens cut elsewhere
    with torch.no_grad():
        moved = model.lm_head(model.model(input_ids=ids_tensor, position_ids=positions_tensor).last_hidden_state)
    assert not torch.allclose(moved, expected, atol=1e-3)


@pytest.mark.parametrize("use_reentrant", [True, False], ids=["reentrant", "non-reentrant"])
@pytest.mark.parametrize("family", ["llama", "mamba2"])
def test_checkpointed_recompute_reads_its_own_forwards_boundaries(family, use_reentrant, per_sequence):
    base, model = twins(family)
    model.train().gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": use_reentrant})
    micro = [sequences([5, 3, 8], 0), sequences([8, 2, 6], 1)]
    static = torch.zeros(1, 16, dtype=torch.long)  # a static buffer refilled in place for every micro-batch
    total = 0.0
    for parts in micro:
        batch = collate(parts, return_flash_attn_kwargs=False)
        static.copy_(batch["position_ids"])
        total = total + model(input_ids=batch["input_ids"], position_ids=static, labels=batch["labels"]).loss
    model.zero_grad(set_to_none=True)
    total.backward()
    got = gradients(model)
    runs = [per_sequence(base.train(), parts)[2] for parts in micro]
    for name in runs[0]:
        torch.testing.assert_close(got[name], runs[0][name] + runs[1][name], atol=1e-5, rtol=0, msg=name)
    moved = per_sequence(base, recut(micro[0]))[2]  # negative control
    assert max(float((got[name] - moved[name] - runs[1][name]).abs().max()) for name in moved) > 1e-4


def test_a_forward_leaves_nothing_on_the_batchs_tensors():
    _, model = twins("llama")
    batch = collate(sequences([3, 4, 2]))
    model(**batch)
    tensors = {key: value for key, value in batch.items() if isinstance(value, torch.Tensor)}
    assert [key for key, value in tensors.items() if hasattr(value, STATE_ATTRIBUTE)] == []
    assert not hasattr(copy.deepcopy(batch["position_ids"]), STATE_ATTRIBUTE)


# ---- 2. a mask decides "ordinary" only where it can -----------------------------------------------------------------


MASKED_FAMILIES = [
    ("llama", {}),
    ("mistral", {"sliding_window": 4}),
    ("gemma2", {"sliding_window": 4}),
    ("falcon", {}),
]


@pytest.mark.parametrize("family, overrides", MASKED_FAMILIES, ids=[f for f, _ in MASKED_FAMILIES])
def test_restarting_positions_with_an_all_ones_mask_are_flattened(family, overrides, per_sequence, assert_exact):
    base, model = twins(family, **overrides)
    parts = sequences([7, 3, 9], vocab=base.config.vocab_size)
    batch = collate(parts, return_flash_attn_kwargs=False)
    inputs = {key: batch[key] for key in ("input_ids", "labels", "position_ids")}
    inputs["attention_mask"] = torch.ones_like(batch["input_ids"])
    expected = per_sequence(base, parts)
    assert_exact(flat(model, **inputs), expected)
    with pytest.raises(AssertionError):  # negative control
        assert_exact(flat(model, **{**inputs, "position_ids": shifted(inputs["position_ids"])}), expected)


def test_sequence_id_masks_are_flattened(per_sequence, assert_exact):
    base, model = twins("mistral", sliding_window=4)
    parts = sequences([6, 2, 9])
    batch = collate(parts, return_flash_attn_kwargs=False)
    ids_mask = batch["seq_idx"].long() + 1  # 1 1 1 1 1 1 2 2 3 ... as sample-packing collators emit
    inputs = {key: batch[key] for key in ("input_ids", "labels", "position_ids")}
    got = flat(model, **inputs, attention_mask=ids_mask)
    assert_exact(got, per_sequence(base, parts))
    with pytest.raises(AssertionError):  # negative control
        assert_exact(got, per_sequence(base, recut(parts)))


@pytest.mark.parametrize("pad_positions", ["restart", "zeros"])
@pytest.mark.parametrize("family", ["llama", "falcon"])
def test_a_flattened_row_padded_with_mask_zeros_is_exact_on_its_tokens(family, pad_positions, per_sequence):
    base, model = twins(family)
    parts = sequences([7, 3, 9], vocab=base.config.vocab_size)
    batch = collate(parts, return_flash_attn_kwargs=False)
    pad = 32 - 19
    positions = torch.arange(pad) if pad_positions == "restart" else torch.zeros(pad, dtype=torch.long)
    inputs = {
        "input_ids": torch.cat([batch["input_ids"], torch.zeros(1, pad, dtype=torch.long)], 1),
        "labels": torch.cat([batch["labels"], torch.full((1, pad), -100)], 1),
        "position_ids": torch.cat([batch["position_ids"], positions[None]], 1),
        "attention_mask": torch.cat([torch.ones(1, 19, dtype=torch.long), torch.zeros(1, pad, dtype=torch.long)], 1),
    }
    model.zero_grad(set_to_none=True)
    out = model(**inputs)
    out.loss.backward()
    expected = per_sequence(base, parts)
    torch.testing.assert_close(out.logits[:, :19].detach(), expected[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(out.loss.detach(), expected[1], atol=1e-5, rtol=0)
    for name, grad in expected[2].items():
        torch.testing.assert_close(gradients(model)[name], grad, atol=1e-5, rtol=0, msg=name)
    moved = per_sequence(base, recut(parts))[0]  # negative control
    assert not torch.allclose(out.logits[:, :19].detach(), moved, atol=1e-3)


def test_a_mask_hole_inside_a_sequence_of_a_flattened_row_is_refused():
    _, model = twins("llama")
    batch = collate(sequences([7, 3, 9]), return_flash_attn_kwargs=False)
    mask = torch.ones_like(batch["input_ids"])
    mask[0, 3] = 0  # positions go on through the hole: padding or part of the sequence, the batch does not say
    with pytest.raises(ValueError, match=r"attention_mask.*token 4"):
        model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], attention_mask=mask)


def test_left_padded_rows_stay_ordinary_and_exact():
    base, model = twins("llama")
    ids = torch.randint(0, 256, (2, 6), generator=torch.Generator().manual_seed(3))
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        got = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        expected = base(input_ids=ids, attention_mask=mask, position_ids=positions).logits
    torch.testing.assert_close(got[mask.bool()], expected[mask.bool()], atol=1e-5, rtol=0)


def test_prompt_tuning_refuses_restarting_positions_with_an_all_ones_mask():
    peft = pytest.importorskip("peft")
    model = prepare_model_for_flattening(tiny_causal_lm("llama"))
    wrapped = peft.get_peft_model(model, peft.PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=3))
    batch = collate(sequences([4, 5]), return_flash_attn_kwargs=False)
    with pytest.raises(ValueError, match="prompt tuning"):
        wrapped(
            input_ids=batch["input_ids"],
            position_ids=batch["position_ids"],
            attention_mask=torch.ones_like(batch["input_ids"]),
        )


# ---- 3. state-carrying layers found from the modules ----------------------------------------------------------------


class RenamedMambaConfig(MambaConfig):
    model_type = "renamed_mamba"


class RenamedMambaForCausalLM(MambaForCausalLM):
    config_class = RenamedMambaConfig


def renamed_mamba(base):
    """`base`'s weights in a subclass registered under a `model_type` of its own, as `trust_remote_code` models are."""
    settings = {key: value for key, value in base.config.to_dict().items() if key != "model_type"}
    renamed = RenamedMambaForCausalLM(RenamedMambaConfig(**settings)).eval()
    assert renamed.config.model_type == "renamed_mamba"
    renamed.load_state_dict(base.state_dict())
    return renamed


def edited_mamba(base):
    """`base` with its config's `model_type` edited."""
    edited = copy.deepcopy(base)
    edited.config.model_type = "my_mamba"
    return edited


@pytest.mark.parametrize("disguise", [renamed_mamba, edited_mamba], ids=["subclass", "edited config"])
def test_a_mamba_under_another_model_type_runs_its_mixers_per_sequence(disguise, per_sequence, assert_exact):
    base = tiny_causal_lm("mamba")
    model = prepare_model_for_flattening(disguise(base))
    parts = sequences([6, 3, 8])
    got = flat(model, **collate(parts))
    assert_exact(got, per_sequence(base, parts))
    with pytest.raises(AssertionError):  # negative control
        assert_exact(got, per_sequence(base, recut(parts)))


def test_a_refused_family_under_another_model_type_is_still_refused():
    base = tiny_causal_lm("openai-gpt")
    config_class = type("RenamedGPTConfig", (type(base.config),), {"model_type": "renamed_gpt"})
    renamed = type("RenamedGPT", (type(base),), {"config_class": config_class})
    settings = {key: value for key, value in base.config.to_dict().items() if key != "model_type"}
    model = renamed(renamed.config_class(**settings))
    assert model.config.model_type == "renamed_gpt"
    with pytest.raises(ValueError, match="fixed causal bias"):
        prepare_model_for_flattening(model)


class ShortConvolution(torch.nn.Module):
    """A token mixer the registry does not know: a depthwise causal convolution along the row."""

    def __init__(self, hidden: int):
        super().__init__()
        self.conv = torch.nn.Conv1d(hidden, hidden, kernel_size=3, groups=hidden, padding=2)

    def forward(self, hidden_states):
        return self.conv(hidden_states.transpose(1, 2))[..., : hidden_states.shape[1]].transpose(1, 2)


def test_an_unknown_module_that_mixes_tokens_along_the_row_is_refused():
    model = tiny_causal_lm("llama")
    model.model.layers[0].mlp = ShortConvolution(model.config.hidden_size)
    with pytest.raises(ValueError, match=r"model\.layers\.0\.mlp\.conv.*Conv1d"):
        prepare_model_for_flattening(model)


# ---- 4. settings of composite models from their language model's config ---------------------------------------------


@pytest.mark.parametrize("family", ["qwen3_5", "lfm3_vl"])
def test_composite_models_run_flattened_text_without_a_cache(family, per_sequence, assert_exact):
    base = tiny_vision_lm(family)
    assert base.config.get_text_config().use_cache
    model = prepare_model_for_flattening(copy.deepcopy(base))
    parts = sequences([6, 3, 8])
    batch = collate(parts)
    with torch.no_grad():
        logits = model(**batch).logits
    torch.testing.assert_close(logits, per_sequence(base, parts, backward=False)[0], atol=1e-5, rtol=0)
    got = flat(model, **batch)
    assert_exact(got, per_sequence(base, parts))
    with pytest.raises(AssertionError):  # negative control
        assert_exact(got, per_sequence(base, recut(parts)))


# ---- 5. the loss never crosses a boundary ---------------------------------------------------------------------------


@pytest.mark.parametrize("boundaries", ["position_ids", "cu_seq_lens"])
def test_labels_on_every_token_never_predict_the_next_sequence(boundaries, per_sequence, assert_exact):
    base, model = twins("llama")
    parts = sequences([6, 4, 9])
    batch = collate(parts)
    inputs = {"input_ids": batch["input_ids"], "labels": batch["input_ids"].clone()}
    if boundaries == "position_ids":
        inputs["position_ids"] = batch["position_ids"]
    else:
        inputs.update({key: batch[key] for key in ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")})
    got = flat(model, **inputs)
    assert_exact(got, per_sequence(base, parts))
    with pytest.raises(AssertionError):  # negative control
        assert_exact(got, per_sequence(base, recut(parts)))


# ---- 6. rows sharing one row of positions ---------------------------------------------------------------------------


def test_two_rows_sharing_one_row_of_restarting_positions(per_sequence, assert_exact):
    base, model = twins("llama")
    first, second = sequences([3, 5], 0), sequences([3, 5], 1)
    ids = torch.stack([torch.cat(first), torch.cat(second)])
    positions = torch.tensor([[0, 1, 2, 0, 1, 2, 3, 4]])
    got = flat(model, input_ids=ids, position_ids=positions, labels=ids.clone())
    assert_exact(got, per_sequence(base, first + second))
    with pytest.raises(AssertionError):  # negative control
        assert_exact(got, per_sequence(base, recut(first) + second))
