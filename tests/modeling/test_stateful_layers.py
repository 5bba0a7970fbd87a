"""Layers that carry state along the row (Mamba, gated delta rule, short convolutions) run once per sequence."""

import copy

import pytest
import torch

from flatcollate.boundaries import Boundaries
from flatcollate.check import check_model
from flatcollate.modeling import prepare_model_for_flattening
from flatcollate.modeling.prepared_state import FlatBatch
from flatcollate.modeling.stateful_layers import RowBounds, _concat, segment_mixers
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


def test_row_bounds_are_the_guards_boundaries_and_none_for_ordinary_batches():
    row, model = RowBounds([]), torch.nn.Module().eval()
    row.record(model, {}, FlatBatch(Boundaries.from_lengths([3, 1]), None))
    assert row.bounds == [0, 3, 4]
    row.record(model, {}, None)  # an ordinary batch (padded rows, a mask, a cache)
    assert row.bounds is None
    row.record(model, {}, FlatBatch(Boundaries.from_lengths([4]), None))  # one sequence: nothing to split
    assert row.bounds is None


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
