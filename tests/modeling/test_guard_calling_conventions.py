"""Every way of calling a prepared model reaches the same checks: `input_ids` by keyword or by position,
`inputs_embeds`, a PEFT wrapper, `accelerate.prepare`, and `torch.compile`.

Each convention is tried twice: a batch without positions must get restarting ones (GPT-2 learns absolute positions,
so without them its logits are off by ~0.5), and positions that disagree with `cu_seq_lens` must be refused.
"""

import itertools

import pytest
import torch

from flatcollate import DataCollatorWithFlattening, prepare_model_for_flattening
from flatcollate.testing import tiny_causal_lm

LENGTHS = [6, 1, 9, 3]


def batch(**options) -> dict:
    generator = torch.Generator().manual_seed(0)
    features = [{"input_ids": torch.randint(0, 256, (n,), generator=generator).tolist()} for n in LENGTHS]
    flat = DataCollatorWithFlattening(**options)(features)
    flat.pop("labels")
    return flat


def alone_logits(model, input_ids: torch.Tensor) -> torch.Tensor:
    bounds = [0, *itertools.accumulate(LENGTHS)]
    with torch.no_grad():
        return torch.cat([model(input_ids=input_ids[:, s:e]).logits for s, e in itertools.pairwise(bounds)], dim=1)


def _keyword(model, flat):
    return model(**flat)


def _positional(model, flat):
    ids = flat.pop("input_ids")
    return model(ids, **flat)


def _positional_with_none_positions(model, flat):
    """`input_ids`, `attention_mask=None`, `position_ids` given by position (None when the batch has none)."""
    ids = flat.pop("input_ids")
    return model(ids, None, flat.pop("position_ids", None), **flat)


def _embeds(model, flat):
    ids = flat.pop("input_ids")
    return model(inputs_embeds=model.get_input_embeddings()(ids), **flat)


CALLS = {
    "keyword": _keyword,
    "positional": _positional,
    "positional-with-none": _positional_with_none_positions,
    "inputs_embeds": _embeds,
}


def _plain(model):
    return model


def _peft(model):
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn", "q_proj", "v_proj"], lora_dropout=0.0)
    return peft.get_peft_model(model, config)


def _accelerate(model):
    accelerate = pytest.importorskip("accelerate")
    return accelerate.Accelerator(cpu=True, mixed_precision="no").prepare(model)


def _compiled(model):
    return torch.compile(model, backend="eager")


WRAPS = {"plain": _plain, "peft": _peft, "accelerate": _accelerate, "compiled": _compiled}

# Every call on the plain model, and the two ways of passing ids through every wrapper.
CASES = [(call, "plain") for call in CALLS] + [
    (call, wrap) for wrap in WRAPS if wrap != "plain" for call in ("keyword", "positional")
]


@pytest.mark.parametrize(("call", "wrap"), CASES, ids=[f"{call}-{wrap}" for call, wrap in CASES])
def test_every_calling_convention_gets_restarting_positions(call, wrap):
    model = WRAPS[wrap](prepare_model_for_flattening(tiny_causal_lm("gpt2", seed=3)).eval())
    flat = batch(return_position_ids=False)
    expected = alone_logits(model, flat["input_ids"])
    with torch.no_grad():
        got = CALLS[call](model, dict(flat)).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    # Negative control: the same row numbered as one sequence is far from the per-sequence run.
    with torch.no_grad():
        wrong = model(input_ids=flat["input_ids"], position_ids=torch.arange(sum(LENGTHS))[None]).logits
    assert (wrong - expected).abs().max() > 1e-2


@pytest.mark.parametrize(("call", "wrap"), CASES, ids=[f"{call}-{wrap}" for call, wrap in CASES])
def test_every_calling_convention_refuses_positions_that_disagree(call, wrap):
    model = WRAPS[wrap](prepare_model_for_flattening(tiny_causal_lm("llama", seed=3)).eval())
    flat = batch()
    flat["position_ids"] = batch()["position_ids"].roll(1, dims=-1)  # restarts one token late
    with pytest.raises(ValueError, match=r"position_ids.*cu_seq_lens_q"), torch.no_grad():
        CALLS[call](model, flat)
