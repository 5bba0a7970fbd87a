"""Layers that carry state along the row (Mamba, gated delta rule, short convolutions) run once per sequence."""

import collections
import copy
from itertools import pairwise

import pytest
import torch

from flatcollate import DataCollatorWithFlattening
from flatcollate.boundaries import Boundaries
from flatcollate.check import check_model
from flatcollate.families import FAMILIES, is_mixer
from flatcollate.forward_slot import enter_forward, leave_forward
from flatcollate.modeling import prepare_model_for_flattening
from flatcollate.modeling.stateful_layers import _concat, _gather_back, missing_kernels, segment_mixers
from flatcollate.testing import tiny_causal_lm
from flatcollate.testing.tiny_hybrids import TINY_HYBRID_LAYERS

LENGTHS = (7, 1, 12, 4)
FAST = ("bamba", "jamba", "lfm2", "lfm3", "qwen3_5_text")


@pytest.mark.parametrize(
    "model_type",
    [name if name in FAST else pytest.param(name, marks=pytest.mark.slow) for name in ("mamba2", *TINY_HYBRID_LAYERS)],
)
def test_stateful_families_are_exact_only_with_segmented_mixers(model_type):
    """Model-level proof: logits, loss and gradients of the flattened row equal every sequence run alone. A hybrid's
    tiny model passes a state-carrying layer, an attention layer, then another (`tiny_hybrids`), as released hybrids
    do; the unprepared model mixes the sequences, or transformers refuses the row where the kernels that take
    boundaries are missing (the control)."""
    model = tiny_causal_lm(model_type)
    kinds = [is_mixer(m) for m in model.modules() if is_mixer(m) or is_attention(m)]
    if model_type in TINY_HYBRID_LAYERS:
        attention = kinds.index(False)
        assert True in kinds[:attention] and True in kinds[attention + 1 :], kinds
    assert True in kinds, kinds
    report = check_model(model_type, backends=("eager", "flatcollate"), lengths=LENGTHS)
    statuses = {r.backend: r for r in report.results}
    assert statuses["flatcollate"].status == "exact", statuses["flatcollate"]
    refused = bool(missing_kernels(model))  # chunk_gated_delta_rule "can't keep packed sequences apart" without fla
    assert statuses["eager"].status == ("unsupported" if refused else "contaminated"), statuses["eager"]


def is_attention(module: torch.nn.Module) -> bool:
    return type(module).__name__.endswith("Attention")


@pytest.mark.parametrize(("mode", "calls"), [("batched", [(4, 12)]), ("per_sequence", [(1, n) for n in LENGTHS])])
def test_one_call_on_the_padded_sequences_or_one_per_sequence_and_unflattened_rows_one_call(mode, calls):
    model = tiny_causal_lm("mamba2", seed=0)
    mixer = next(m for m in model.modules() if type(m).__name__ == "Mamba2Mixer")
    seen, inner = [], mixer.forward

    def counting(hidden_states, *args, **kwargs):
        seen.append(tuple(hidden_states.shape[:2]))
        return inner(hidden_states, *args, **kwargs)

    mixer.forward = counting  # installed first, so the wrapper calls it
    segment_mixers(model, mode=mode)
    prepare_model_for_flattening(model)
    ids = torch.randint(0, model.config.vocab_size, (1, sum(LENGTHS)))
    positions = torch.cat([torch.arange(n) for n in LENGTHS])[None]
    model(input_ids=ids, position_ids=positions)
    assert seen == calls
    seen.clear()
    model(input_ids=ids[:, :9])
    assert seen == [(1, 9)]


MIXER_FAMILIES = [  # every family with state-carrying layers; one in the fast tier
    name if name == "mamba2" else pytest.param(name, marks=pytest.mark.slow)
    for name in sorted(name for name, family in FAMILIES.items() if family.mixers)
]


@pytest.mark.parametrize("model_type", MIXER_FAMILIES)
def test_one_call_per_state_carrying_layer_per_flattened_forward_equal_to_one_call_per_sequence(model_type):
    base = tiny_causal_lm(model_type, seed=0)
    batched = copy.deepcopy(base)
    segment_mixers(batched, mode="batched")
    prepare_model_for_flattening(batched)
    looped = prepare_model_for_flattening(copy.deepcopy(base))  # the default: one call per sequence
    layers = [m for m in batched.modules() if is_mixer(m)]
    calls = collections.Counter()
    for layer in layers:
        layer.register_forward_pre_hook(lambda module, args: calls.update([id(module)]))
    generator = torch.Generator().manual_seed(0)
    batch = DataCollatorWithFlattening()(
        [{"input_ids": torch.randint(0, base.config.vocab_size, (n,), generator=generator).tolist()} for n in LENGTHS]
    )
    with torch.no_grad():
        got, expected = batched(**batch).logits, looped(**batch).logits
    assert layers and sorted(calls.values()) == [1] * len(layers)  # one call per layer, whatever the row holds
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    bounds = pairwise(batch["cu_seq_lens_q"].tolist())
    alone = torch.cat([base(input_ids=batch["input_ids"][:, s:e], use_cache=False).logits for s, e in bounds], 1)
    torch.testing.assert_close(got, alone, atol=1e-5, rtol=0)


def test_segment_mixers_wraps_only_stateful_families_and_only_once():
    mamba = tiny_causal_lm("mamba2")
    assert segment_mixers(mamba) == mamba.config.num_hidden_layers
    assert segment_mixers(mamba) == 0
    assert segment_mixers(tiny_causal_lm("llama")) == 0


def test_mixers_read_their_own_models_forward_from_the_slot(monkeypatch):
    model = prepare_model_for_flattening(tiny_causal_lm("mamba2"))
    layer = next(m for m in model.modules() if type(m).__name__ == "Mamba2Mixer")
    calls, original = [], type(layer).forward

    def counted(module, hidden_states, *args, **kwargs):
        calls.append(hidden_states.shape[1]) if module is layer else None
        return original(module, hidden_states, *args, **kwargs)

    monkeypatch.setattr(type(layer), "forward", counted)
    model(**DataCollatorWithFlattening()([{"input_ids": [1, 2, 3]}, {"input_ids": [4]}]))
    assert calls == [3, 1]  # once per sequence (the default)
    calls.clear()
    token = enter_forward(object(), Boundaries.from_lengths([2, 2]))  # another model's forward in flight
    try:
        layer(torch.zeros(1, 4, model.config.hidden_size))
    finally:
        leave_forward(token)
    assert calls == [4]  # the row as one: not its model's forward


def test_outputs_that_are_not_per_token_are_refused_as_main_output_and_dropped_as_extras():
    parts = [torch.zeros(1, 3, 2), torch.zeros(1, 1, 2)]
    assert _concat(parts, [3, 1], "Mixer").shape == (1, 4, 2)
    weights = [torch.zeros(1, 2, 3, 3), torch.zeros(1, 2, 1, 1)]
    out, extra = _concat(list(zip(parts, weights, strict=True)), [3, 1], "Mixer")
    assert out.shape == (1, 4, 2) and extra is None
    with pytest.raises(ValueError, match="Mixer returned a tensor that is not per token"):
        _concat(weights, [3, 1], "Mixer")
    valid = torch.tensor([[True, True, True], [True, False, False]])
    out, extra = _gather_back((torch.arange(6.0).reshape(2, 3, 1), torch.zeros(2, 2, 3, 3)), valid, "Mixer")
    assert out.reshape(-1).tolist() == [0.0, 1.0, 2.0, 3.0] and extra is None
    with pytest.raises(ValueError, match="Mixer returned a tensor that is not per token"):
        _gather_back(torch.zeros(2, 2, 3, 3), valid, "Mixer")


def test_a_copy_of_a_prepared_model_runs_its_own_layers():
    original = prepare_model_for_flattening(tiny_causal_lm("mamba2"))
    copy_ = copy.deepcopy(original)
    ids = torch.randint(0, original.config.vocab_size, (1, 8))
    positions = torch.tensor([[0, 1, 2, 0, 1, 2, 3, 4]])
    copy_(input_ids=ids, position_ids=positions, labels=ids).loss.backward()
    assert all(p.grad is None for p in original.parameters()), "the copy ran the original's layers"
    assert all(p.grad is not None for n, p in copy_.named_parameters() if ".mixer." in n)
