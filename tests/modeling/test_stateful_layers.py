"""Layers that carry state along the row (Mamba, gated delta rule, short convolutions) run once per sequence."""

import copy

import pytest
import torch

from flatcollate import DataCollatorWithFlattening
from flatcollate.boundaries import Boundaries
from flatcollate.check import check_model
from flatcollate.forward_slot import enter_forward, leave_forward
from flatcollate.modeling import prepare_model_for_flattening
from flatcollate.modeling.stateful_layers import _concat, segment_mixers
from flatcollate.testing import tiny_causal_lm

LENGTHS = (7, 1, 12, 4)


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["mamba2", "jamba", "qwen3_next", "lfm3"])
def test_stateful_families_are_exact_only_with_segmented_mixers(model_type):
    # Model-level proof: logits, loss and gradients of the flattened row equal every sequence run alone.
    report = check_model(model_type, backends=("eager", "flatcollate"), lengths=LENGTHS)
    statuses = {r.backend: r for r in report.results}
    assert statuses["flatcollate"].status == "exact", statuses["flatcollate"]
    assert statuses["eager"].status != "exact", "without segmenting, state must leak (or the family refuse)"


def test_each_sequence_gets_its_own_call_and_unflattened_rows_one_call():
    model = tiny_causal_lm("mamba2", seed=0)
    mixer = next(m for m in model.modules() if type(m).__name__ == "Mamba2Mixer")
    seen, inner = [], mixer.forward

    def counting(hidden_states, *args, **kwargs):
        seen.append(hidden_states.shape[1])
        return inner(hidden_states, *args, **kwargs)

    mixer.forward = counting  # installed first, so the per-sequence wrapper calls it
    prepare_model_for_flattening(model)
    ids = torch.randint(0, model.config.vocab_size, (1, sum(LENGTHS)))
    positions = torch.cat([torch.arange(n) for n in LENGTHS])[None]
    model(input_ids=ids, position_ids=positions)
    assert seen == list(LENGTHS)
    seen.clear()
    model(input_ids=ids[:, :9])
    assert seen == [9]


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
    assert calls == [3, 1]  # once per sequence
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


def test_a_copy_of_a_prepared_model_runs_its_own_layers():
    original = prepare_model_for_flattening(tiny_causal_lm("mamba2"))
    copy_ = copy.deepcopy(original)
    ids = torch.randint(0, original.config.vocab_size, (1, 8))
    positions = torch.tensor([[0, 1, 2, 0, 1, 2, 3, 4]])
    copy_(input_ids=ids, position_ids=positions, labels=ids).loss.backward()
    assert all(p.grad is None for p in original.parameters()), "the copy ran the original's layers"
    assert all(p.grad is not None for n, p in copy_.named_parameters() if ".mixer." in n)
