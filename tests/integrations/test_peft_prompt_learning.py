"""PEFT's prompt-learning adapters (prompt tuning, P-tuning, prefix tuning) put their virtual tokens once at the start
of each row: on a flattened batch every sequence after the first would attend to them through the sequences before
it. A prepared model refuses a flattened batch through such an adapter at its first forward, naming the method and the
fix, whichever is wrapped first and whichever collator built the batch; padded batches run as unprepared."""

import copy
import itertools

import pytest
import torch
from transformers import DataCollatorWithFlattening as TransformersFlattening

from flatcollate import DataCollatorWithFlattening, prepare_model_for_flattening
from flatcollate.testing import tiny_causal_lm

peft = pytest.importorskip("peft")

LENGTHS = [5, 3, 6]
VIRTUAL_TOKENS = 3

METHODS = {
    "prompt tuning": lambda: peft.PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=VIRTUAL_TOKENS),
    "P-tuning": lambda: peft.PromptEncoderConfig(
        task_type="CAUSAL_LM", num_virtual_tokens=VIRTUAL_TOKENS, encoder_hidden_size=16
    ),
    "prefix tuning": lambda: peft.PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=VIRTUAL_TOKENS),
}

COLLATORS = {
    "flatcollate": DataCollatorWithFlattening(),
    "flatcollate_positions_only": DataCollatorWithFlattening(return_flash_attn_kwargs=False, return_seq_idx=False),
    "transformers": TransformersFlattening(),
}


def features():
    generator = torch.Generator().manual_seed(0)
    return [{"input_ids": torch.randint(3, 200, (n,), generator=generator).tolist()} for n in LENGTHS]


def adapter(model, method: str):
    """`model` under the PEFT method, its prompt parameters seeded so that they move the logits."""
    torch.manual_seed(1)
    return peft.get_peft_model(model, METHODS[method]())


def wrapped(method: str, order: str):
    base = tiny_causal_lm("llama", seed=7)
    if order == "wrap-then-prepare":
        return prepare_model_for_flattening(adapter(base, method))
    return adapter(prepare_model_for_flattening(base), method)


@pytest.mark.filterwarnings("ignore:Position ids are not supported")
@pytest.mark.parametrize("collator", list(COLLATORS))
@pytest.mark.parametrize("order", ["wrap-then-prepare", "prepare-then-wrap"])
@pytest.mark.parametrize("method", list(METHODS))
def test_a_flattened_batch_through_a_prompt_learning_adapter_is_refused(method, order, collator):
    model = wrapped(method, order)
    batch = COLLATORS[collator](features())
    with pytest.raises(ValueError, match=rf"(?s){method}.*virtual tokens.*padded batches.*LoRA"):
        model(**batch)


def alone(model, batch) -> torch.Tensor:
    """Reference: each sequence through the adapter on its own, with its own virtual tokens; the logits of its tokens
    side by side, `(1, T, V)`."""
    ids, bounds = batch["input_ids"], [0, *itertools.accumulate(LENGTHS)]
    logits = [model(input_ids=ids[:, a:b]).logits[:, -(b - a) :] for a, b in itertools.pairwise(bounds)]
    return torch.cat(logits, dim=1)


@pytest.mark.filterwarnings("ignore:Position ids are not supported")
@pytest.mark.parametrize("method", ["prompt tuning", "P-tuning"])
def test_what_the_refusal_prevents(method):
    """Negative control: past the refusal (PEFT's forward called directly), a positions-only batch runs and its later
    sequences differ from each sequence with its own virtual tokens; prompt tuning and P-tuning prepend them."""
    model = wrapped(method, "prepare-then-wrap")
    batch = COLLATORS["transformers"](features())
    batch.pop("labels")
    with torch.no_grad():
        flat = type(model).forward(model, **batch).logits[:, VIRTUAL_TOKENS:]
        expected = alone(model, batch)
    first = LENGTHS[0]
    torch.testing.assert_close(flat[:, :first], expected[:, :first], rtol=0, atol=1e-5)  # the first sequence's own
    assert (flat[:, first:] - expected[:, first:]).abs().max() > 1e-2


@pytest.mark.parametrize("method", list(METHODS))
def test_padded_batches_run_as_unprepared(method):
    plain = adapter(tiny_causal_lm("llama", seed=7), method)
    prepared = prepare_model_for_flattening(copy.deepcopy(plain))
    ids = torch.randint(3, 200, (2, 6), generator=torch.Generator().manual_seed(2))
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    with torch.no_grad():
        expected, got = plain(input_ids=ids, attention_mask=mask).logits, prepared(input_ids=ids, attention_mask=mask)
    torch.testing.assert_close(got.logits, expected, rtol=0, atol=1e-5)
