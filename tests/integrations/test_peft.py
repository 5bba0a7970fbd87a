"""LoRA through PEFT: a prepared PEFT model is exact on flattened batches and guarded, whichever is wrapped first."""

import copy
import itertools

import pytest
import torch

from flatcollate import DataCollatorWithFlattening, prepare_model_for_flattening
from flatcollate.testing import tiny_causal_lm

peft = pytest.importorskip("peft")

LENGTHS = [7, 1, 10, 4]


def lora(model):
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    wrapped = peft.get_peft_model(model, config)
    for name, parameter in wrapped.named_parameters():  # non-zero B so LoRA changes the outputs
        if "lora_B" in name:
            torch.nn.init.normal_(parameter, std=0.5, generator=torch.Generator().manual_seed(len(name)))
    return wrapped


def flattened():
    generator = torch.Generator().manual_seed(0)
    features = [{"input_ids": torch.randint(0, 256, (n,), generator=generator).tolist()} for n in LENGTHS]
    return DataCollatorWithFlattening()(features)


def lora_grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad and p.grad is not None}


@pytest.mark.parametrize("order", ["wrap-then-prepare", "prepare-then-wrap"])
def test_lora_model_is_exact_on_flattened_batches(order):
    base = tiny_causal_lm("llama", seed=7)
    if order == "wrap-then-prepare":
        model = prepare_model_for_flattening(lora(base))
        assert isinstance(model, peft.PeftModel)
    else:
        model = lora(prepare_model_for_flattening(base))
    batch = flattened()
    out = model(**batch)
    out.loss.backward()
    flat_grads = lora_grads(model)
    assert flat_grads, "no LoRA gradients"
    model.zero_grad(set_to_none=True)

    bounds = [0, *itertools.accumulate(LENGTHS)]
    logits, total = [], 0.0
    for start, end in itertools.pairwise(bounds):  # reference: each sequence alone
        seq_logits = model(input_ids=batch["input_ids"][:, start:end]).logits
        total = total + torch.nn.functional.cross_entropy(
            seq_logits[0, :-1], batch["labels"][0, start + 1 : end], reduction="sum"
        )
        logits.append(seq_logits)
    loss = total / (batch["labels"][0, 1:] != -100).sum()
    loss.backward()
    torch.testing.assert_close(out.logits, torch.cat(logits, dim=1), atol=1e-5, rtol=0)
    torch.testing.assert_close(out.loss, loss, atol=1e-5, rtol=0)
    for name, grad in lora_grads(model).items():
        torch.testing.assert_close(flat_grads[name], grad, atol=1e-5, rtol=0, msg=name)


@pytest.mark.parametrize("order", ["wrap-then-prepare", "prepare-then-wrap"])
def test_lora_model_is_guarded(order):
    base = tiny_causal_lm("llama", seed=7)
    model = prepare_model_for_flattening(lora(base)) if order == "wrap-then-prepare" else lora(
        prepare_model_for_flattening(base)
    )
    batch = flattened()
    with pytest.raises(ValueError, match="attention_mask"):
        model(**batch, attention_mask=torch.ones_like(batch["input_ids"]))
    batch["position_ids"] = torch.arange(sum(LENGTHS))[None]
    with pytest.raises(ValueError, match="do not restart"):
        model(**batch)


def test_trainer_keeps_the_collator_columns_of_a_lora_model(tmp_path):
    from transformers import Trainer, TrainingArguments

    model = prepare_model_for_flattening(lora(tiny_causal_lm("llama")))
    args = TrainingArguments(output_dir=str(tmp_path / "unused"), report_to=[], use_cpu=True)
    trainer = Trainer(model=model, args=args)
    trainer._set_signature_columns_if_needed()
    assert {"seq_lengths", "completion_mask", "assistant_masks", "position_ids"} <= set(trainer._signature_columns)


def test_a_copy_of_a_prepared_lora_model_is_guarded_on_its_own():
    model = prepare_model_for_flattening(lora(tiny_causal_lm("llama")))
    clone = copy.deepcopy(model)
    batch = flattened()
    with pytest.raises(ValueError, match="attention_mask"):
        clone(**batch, attention_mask=torch.ones_like(batch["input_ids"]))
