"""Families that number positions from `padding_idx + 1` (RoBERTa and its descendants) are exact when flattened.

Alone, `RobertaForCausalLM` numbers a sequence's tokens `padding_idx + 1, padding_idx + 2, ...`; a flattened row
numbered from 0 reads the `padding_idx` embedding row for every sequence's second token (logits off by ~0.5). The
reference here runs each sequence as users do, `model(input_ids=sequence)`, with no `position_ids`.
"""

import itertools

import pytest
import torch

from flatcollate import DataCollatorWithFlattening, prepare_model_for_flattening
from flatcollate.check import check_model
from flatcollate.testing import tiny_causal_lm

FAMILIES = ["roberta", "roberta-prelayernorm", "xlm-roberta", "xlm-roberta-xl", "camembert", "data2vec-text"]
LENGTHS = [5, 1, 8, 3]


def features(pad_token_id: int) -> list[dict]:
    generator = torch.Generator().manual_seed(0)
    ids = [torch.randint(3, 256, (n,), generator=generator) for n in LENGTHS]
    assert all((row != pad_token_id).all() for row in ids)
    return [{"input_ids": row.tolist()} for row in ids]


def alone(model, batch) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Each sequence through the model on its own, as users run it (the model numbers its own positions)."""
    model.zero_grad(set_to_none=True)
    bounds = [0, *itertools.accumulate(LENGTHS)]
    logits, total = [], 0.0
    for start, end in itertools.pairwise(bounds):
        out = model(input_ids=batch["input_ids"][:, start:end])
        total = total + torch.nn.functional.cross_entropy(
            out.logits[0, :-1], batch["labels"][0, start + 1 : end], reduction="sum"
        )
        logits.append(out.logits)
    loss = total / (batch["labels"][0, 1:] != -100).sum()
    loss.backward()
    return torch.cat(logits, 1).detach(), loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def flattened(model, batch) -> tuple[torch.Tensor, torch.Tensor, dict]:
    model.zero_grad(set_to_none=True)
    out = model(**batch)
    out.loss.backward()
    return out.logits.detach(), out.loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(
    "options",
    [{}, {"return_position_ids": False}, {"return_flash_attn_kwargs": False, "return_seq_idx": False}],
    ids=["collator-positions", "derived-positions", "positions-only"],
)
def test_flattened_batch_equals_each_sequence_alone(family, options):
    model = prepare_model_for_flattening(tiny_causal_lm(family, seed=1))
    batch = DataCollatorWithFlattening(**options)(features(model.config.pad_token_id))
    ref_logits, ref_loss, ref_grads = alone(model, batch)
    logits, loss, grads = flattened(model, batch)
    torch.testing.assert_close(logits, ref_logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(loss, ref_loss, atol=1e-5, rtol=0)
    for name, grad in ref_grads.items():
        torch.testing.assert_close(grads[name], grad, atol=1e-5, rtol=0, msg=name)


def test_negative_control_positions_from_zero_are_far_from_the_model_alone():
    model = tiny_causal_lm("roberta", seed=1)  # unprepared: nothing renumbers the collator's positions
    batch = DataCollatorWithFlattening()(features(model.config.pad_token_id))
    right = alone(model, batch)[0]
    with torch.no_grad():
        wrong = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits
    assert (wrong - right).abs().max() > 0.1


def test_positions_numbered_as_the_family_does_are_accepted_and_others_refused():
    model = prepare_model_for_flattening(tiny_causal_lm("roberta", seed=1))
    start = model.config.pad_token_id + 1
    batch = DataCollatorWithFlattening(position_ids_start=start)(features(model.config.pad_token_id))
    torch.testing.assert_close(model(**batch).logits, alone(model, batch)[0], atol=1e-5, rtol=0)
    batch["position_ids"] = batch["position_ids"] + 3  # restart where the boundaries are, at the wrong number
    with pytest.raises(ValueError, match=r"(?s)RobertaForCausalLM numbers.*padding_idx \+ 1 = 2.*got 5"):
        model(**batch)


def test_a_pad_token_inside_a_flattened_sequence_is_refused():
    model = prepare_model_for_flattening(tiny_causal_lm("roberta", seed=1))
    rows = features(model.config.pad_token_id)
    rows[2]["input_ids"][3] = model.config.pad_token_id
    with pytest.raises(ValueError, match=r"(?s)pad_token_id.*token 9"):
        model(**DataCollatorWithFlattening()(rows))


def test_check_reference_runs_each_sequence_as_users_do():
    """`flatcollate check` compares with `model(input_ids=sequence)`; with its old arange reference it called these
    families exact while they were off by 0.5."""
    report = check_model("roberta", backends=("flatcollate",), lengths=(5, 1, 8, 3))
    assert report.passed, report.to_markdown()


@pytest.mark.parametrize("family", ["roberta", "bert"])
def test_ordinary_calls_run_as_the_unprepared_model(family):
    """Their attention layers see no positions: an ordinary call (no boundaries) is one sequence per row, not an
    error; padded batches and cached generation are the unprepared model's."""
    plain = tiny_causal_lm(family, seed=1)
    prepared = prepare_model_for_flattening(tiny_causal_lm(family, seed=1))
    ids = torch.randint(3, 256, (2, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    with torch.no_grad():
        torch.testing.assert_close(prepared(input_ids=ids).logits, plain(input_ids=ids).logits, atol=1e-5, rtol=0)
        torch.testing.assert_close(
            prepared(input_ids=ids, attention_mask=mask).logits[mask.bool()],
            plain(input_ids=ids, attention_mask=mask).logits[mask.bool()],
            atol=1e-5,
            rtol=0,
        )
    options = {"max_new_tokens": 4, "do_sample": False, "pad_token_id": plain.config.pad_token_id}
    assert prepared.generate(ids[:1], **options).tolist() == plain.generate(ids[:1], **options).tolist()
