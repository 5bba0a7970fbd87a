"""`sequence_logprobs` of a flattened row equals each sequence run alone: summed and per token, with gradients, for
attention, sliding-window and state-space families; the label shift never crosses a boundary."""

import copy
import itertools

import pytest
import torch

from flatcollate import DataCollatorWithFlattening, prepare_model_for_flattening
from flatcollate.preference import DataCollatorForPreference, sequence_logprobs
from flatcollate.testing import tiny_causal_lm

TOL = 1e-5
LENGTHS = (9, 1, 6, 12)


def examples(vocab_size: int, *, seed: int = 0) -> list[dict]:
    """Sequences with their labels; labels -100 on a prompt of 2 tokens."""
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for length in LENGTHS:
        ids = torch.randint(0, vocab_size, (length,), generator=generator).tolist()
        rows.append({"input_ids": ids, "labels": [-100] * min(2, length - 1) + ids[min(2, length - 1) :]})
    return rows


def alone(model, rows: list[dict]) -> list[torch.Tensor]:
    """Reference: per sequence, the log-probability of each labelled next token, from a forward of that sequence."""
    out = []
    for row in rows:
        ids, labels = torch.tensor([row["input_ids"]]), torch.tensor(row["labels"])
        logps = torch.log_softmax(model(input_ids=ids, use_cache=False).logits[0].float(), dim=-1)
        targets = labels[1:]
        scored = targets != -100
        picked = logps[:-1].gather(-1, targets.clamp(min=0)[:, None])[:, 0]
        out.append(torch.where(scored, picked, torch.zeros_like(picked)))
    return out


def grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("model_type", ["llama", "qwen3", "gemma2", "mistral", "mamba2", "jamba"])
def test_flattened_logprobs_equal_each_sequence_alone(model_type):
    base = tiny_causal_lm(model_type, seed=0, attn_implementation="eager", sliding_window=4)
    rows = examples(base.config.vocab_size)
    reference = alone(base, rows)
    torch.stack([r.sum() for r in reference]).sum().backward()
    expected_grads = grads(base)

    model = copy.deepcopy(base)
    model.zero_grad(set_to_none=True)
    prepare_model_for_flattening(model)
    batch = DataCollatorWithFlattening()(rows)
    per_token = sequence_logprobs(model, batch, per_token=True)
    assert [len(t) for t in per_token] == [n - 1 for n in LENGTHS]
    for got, want in zip(per_token, reference, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=TOL)
    sums = sequence_logprobs(model, batch)
    torch.testing.assert_close(sums, torch.stack([r.sum() for r in reference]), rtol=0, atol=TOL)
    sums.sum().backward()
    got_grads = grads(model)
    assert got_grads.keys() == expected_grads.keys()
    for name, value in expected_grads.items():
        torch.testing.assert_close(got_grads[name], value, rtol=0, atol=TOL, msg=name)


def test_the_shift_stops_at_boundaries_even_when_first_labels_are_kept():
    """Labels equal to `input_ids` (as an RL rollout row may come): a shift over the whole row would score each
    sequence's first token from the end of the sequence before it (the control measures that gap); ours does not."""
    model = tiny_causal_lm("llama", seed=1)
    rows = [{"input_ids": r["input_ids"], "labels": list(r["input_ids"])} for r in examples(model.config.vocab_size)]
    reference = torch.stack([r.sum() for r in alone(model, rows)])
    prepare_model_for_flattening(model)
    batch = DataCollatorWithFlattening(separator_id=None)(rows)
    with torch.no_grad():
        torch.testing.assert_close(sequence_logprobs(model, batch), reference, rtol=0, atol=TOL)
        logps = torch.log_softmax(model(**{k: v for k, v in batch.items() if k != "labels"}).logits[0], dim=-1)
    rolled = logps[:-1].gather(-1, batch["labels"][0, 1:, None])[:, 0]  # the shift over the row, across boundaries
    bounds = batch["cu_seq_lens_q"].tolist()
    naive = torch.stack(
        [rolled[start : end - 1 if end == bounds[-1] else end].sum() for start, end in itertools.pairwise(bounds)]
    )
    assert (naive - reference).abs().max() > 1e-2


def test_preference_rows_score_each_completion_as_alone():
    """`DataCollatorForPreference` rows: chosen and rejected completions, each scored as its `prompt + completion`."""
    model = tiny_causal_lm("qwen2", seed=2)
    pairs = [
        {"prompt_ids": [5, 6, 7], "chosen_ids": [8, 9], "rejected_ids": [10, 11, 12, 13]},
        {"prompt_ids": [14], "chosen_ids": [15, 16, 17], "rejected_ids": [18]},
    ]
    rows = []
    for side in ("chosen_ids", "rejected_ids"):
        for pair in pairs:
            ids = pair["prompt_ids"] + pair[side]
            rows.append({"input_ids": ids, "labels": [-100] * len(pair["prompt_ids"]) + pair[side]})
    reference = torch.stack([r.sum() for r in alone(model, rows)])
    prepare_model_for_flattening(model)
    with torch.no_grad():
        got = sequence_logprobs(model, DataCollatorForPreference()(pairs))
    torch.testing.assert_close(got, reference, rtol=0, atol=TOL)


def test_bad_batches_are_refused():
    model = tiny_causal_lm("llama")
    prepare_model_for_flattening(model)
    batch = DataCollatorWithFlattening()([{"input_ids": [1, 2, 3]}, {"input_ids": [4, 5]}])
    with pytest.raises(ValueError, match="temperature must be positive"):
        sequence_logprobs(model, batch, temperature=0)
    with pytest.raises(ValueError, match="no `labels`"):
        sequence_logprobs(model, {k: v for k, v in batch.items() if k != "labels"})
    with pytest.raises(ValueError, match="one flattened row"):
        sequence_logprobs(model, {**batch, "labels": batch["labels"][:, :-1]})
    with pytest.raises(ValueError, match="cu_seq_lens_q` or `position_ids"):
        sequence_logprobs(model, {"input_ids": batch["input_ids"], "labels": batch["labels"]})


@pytest.mark.parametrize("model_type", ["opt", "mamba2"])
def test_an_unprepared_model_is_refused_and_would_have_been_wrong(model_type):
    """Transformers' own backends on a flattened row: OPT's mask builder drops positions, Mamba 2 carries its state
    across the boundary. `sequence_logprobs` refuses such a model; the same row through it gives other numbers."""
    generator = torch.Generator().manual_seed(0)
    features = [{"input_ids": torch.randint(3, 200, (n,), generator=generator).tolist()} for n in (9, 6)]
    batch = DataCollatorWithFlattening()(features)
    model = tiny_causal_lm(model_type)
    with pytest.raises(ValueError, match=r"not prepared.*prepare_model_for_flattening"):
        sequence_logprobs(model, batch)
    from flatcollate.preference.logprobs import flattened_logprobs

    with torch.no_grad():
        unprepared = flattened_logprobs(model, batch)
        prepared = sequence_logprobs(prepare_model_for_flattening(copy.deepcopy(model)), batch)
    assert (unprepared - prepared).abs().max() > 1e-3  # what the refusal saves the user from


def test_wrapped_prepared_models_are_accepted():
    model = prepare_model_for_flattening(tiny_causal_lm("llama"))
    batch = DataCollatorWithFlattening()([{"input_ids": [5, 6, 7]}, {"input_ids": [8, 9]}])
    wrapper = torch.nn.Module()
    wrapper.module = model  # as DistributedDataParallel holds it
    wrapper.forward = model.forward
    torch.testing.assert_close(sequence_logprobs(wrapper, batch), sequence_logprobs(model, batch))


def test_a_compiled_prepared_model_counts_as_prepared():
    from flatcollate.modeling import is_prepared

    model = prepare_model_for_flattening(tiny_causal_lm("llama"))
    assert is_prepared(torch.compile(model))  # OptimizedModule holds the model as its submodule `_orig_mod`
    assert not is_prepared(torch.compile(tiny_causal_lm("llama")))  # negative control
