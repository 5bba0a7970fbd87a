"""One optimizer step of `FlatDPOTrainer` equals `DPOTrainer`'s padded step on the same batch: loss, the logged
metrics (rewards, margins, accuracies, log-probs) and every parameter after one SGD step, fp32 CPU, within 1e-5, for
the loss types people use, a precomputed reference, `ld_alpha` and LoRA. HH-RLHF pairs, Qwen2.5's tokenizer."""

import copy
import tempfile

import pytest
from datasets import Dataset
from transformers import AutoTokenizer

from flatcollate.integrations.trl import FlatDPOTrainer
from flatcollate.preference import DataCollatorForPreference
from flatcollate.testing import tiny_causal_lm

pytestmark = pytest.mark.slow

trl = pytest.importorskip("trl")
dpo_trainer_module = pytest.importorskip("trl.trainer.dpo_trainer")
TOL = 1e-5
METRICS = (
    "loss",
    "rewards/chosen",
    "rewards/rejected",
    "rewards/accuracies",
    "rewards/margins",
    "logps/chosen",
    "logps/rejected",
    "entropy",
    "num_tokens",
    "mean_token_accuracy",
)


@pytest.fixture(scope="module")
def qwen(tokenizer_dir):
    return AutoTokenizer.from_pretrained(tokenizer_dir("qwen2.5-instruct"))


@pytest.fixture(scope="module")
def pairs(hh_rlhf_prompt_pairs):
    """The first HH-RLHF pairs, split at their last assistant turn: prompt, chosen reply, rejected reply."""
    rows = [
        {"prompt": head[-300:] + "\n\nAssistant:", "chosen": chosen, "rejected": rejected}
        for head, chosen, rejected in hh_rlhf_prompt_pairs(8)
    ]
    return Dataset.from_list(rows)


def one_step(trainer_class, qwen, pairs, tmp, *, peft_config=None, **options):
    """Parameters after one SGD step, the training loss and the logged metrics."""
    model = tiny_causal_lm("llama", vocab_size=len(qwen), seed=0)
    args = trl.DPOConfig(
        output_dir=tmp,
        per_device_train_batch_size=4,
        max_steps=1,
        learning_rate=0.5,
        optim="sgd",
        lr_scheduler_type="constant",
        report_to=[],
        use_cpu=True,
        bf16=False,
        seed=0,
        disable_tqdm=True,
        logging_steps=1,
        save_strategy="no",
        train_sampling_strategy="sequential",
        **options,
    )
    ref_model = None if peft_config is not None else copy.deepcopy(model)
    trainer = trainer_class(
        model=model,
        ref_model=ref_model,
        args=args,
        train_dataset=pairs,
        processing_class=qwen,
        peft_config=peft_config,
    )
    result = trainer.train()
    params = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    return params, result.training_loss, trainer.state.log_history[0]


CASES = [
    {"loss_type": ["sigmoid"]},
    {"loss_type": ["ipo"]},
    {"loss_type": ["hinge"]},
    {"loss_type": ["apo_zero"]},
    {"loss_type": ["sigmoid", "sft"], "loss_weights": [1.0, 0.5]},
    {"loss_type": ["sigmoid"], "ld_alpha": 0.5},
    {"loss_type": ["sigmoid"], "precompute_ref_log_probs": True},
    {"loss_type": ["sigmoid"], "use_weighting": True},
]


@pytest.mark.parametrize("options", CASES, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_one_step_equals_dpo_trainer(qwen, pairs, options):
    with tempfile.TemporaryDirectory() as tmp:
        expected, expected_loss, expected_logs = one_step(trl.DPOTrainer, qwen, pairs, tmp, **options)
        got, loss, logs = one_step(FlatDPOTrainer, qwen, pairs, tmp, **options)
    assert abs(loss - expected_loss) <= TOL, (loss, expected_loss)
    for key in METRICS:
        if key in expected_logs:
            assert abs(logs[key] - expected_logs[key]) <= TOL, (key, logs[key], expected_logs[key])
    assert got.keys() == expected.keys()
    moved = max((expected[n] - p).abs().max().item() for n, p in got.items())
    assert moved <= TOL, moved


def test_one_step_with_lora_equals_dpo_trainer(qwen, pairs):
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    with tempfile.TemporaryDirectory() as tmp:
        expected, expected_loss, _ = one_step(trl.DPOTrainer, qwen, pairs, tmp, peft_config=config)
        got, loss, _ = one_step(FlatDPOTrainer, qwen, pairs, tmp, peft_config=config)
    assert abs(loss - expected_loss) <= TOL
    assert max((expected[n] - p).abs().max().item() for n, p in got.items()) <= TOL


def test_a_shifted_boundary_changes_the_step(qwen, pairs, monkeypatch):
    """Negative control: the same comparison fails when one token moves from a chosen sequence to the next."""
    call = DataCollatorForPreference.__call__

    def shifted(self, examples):
        batch = call(self, examples)
        batch["cu_seq_lens_q"] = batch["cu_seq_lens_k"] = batch["cu_seq_lens_q"].clone()
        batch["cu_seq_lens_q"][1] += 1
        positions = batch["position_ids"][0]
        start = int(batch["cu_seq_lens_q"][1]) - 1
        positions[start] = positions[start - 1] + 1
        positions[start + 1 : int(batch["cu_seq_lens_q"][2])] -= 1
        return batch

    with tempfile.TemporaryDirectory() as tmp:
        _, _, expected_logs = one_step(trl.DPOTrainer, qwen, pairs, tmp)
        monkeypatch.setattr(DataCollatorForPreference, "__call__", shifted)
        _, _, logs = one_step(FlatDPOTrainer, qwen, pairs, tmp)
    assert abs(logs["logps/chosen"] - expected_logs["logps/chosen"]) > 1e-3


def test_the_step_count_is_dpo_trainers(qwen, pairs):
    with tempfile.TemporaryDirectory() as tmp:
        steps = []
        for trainer_class in (trl.DPOTrainer, FlatDPOTrainer):
            model = tiny_causal_lm("llama", vocab_size=len(qwen), seed=0)
            args = trl.DPOConfig(
                output_dir=tmp,
                per_device_train_batch_size=3,
                num_train_epochs=1,
                report_to=[],
                use_cpu=True,
                bf16=False,
                disable_tqdm=True,
                save_strategy="no",
                learning_rate=1e-6,
            )
            trainer = trainer_class(
                model=model, ref_model=copy.deepcopy(model), args=args, train_dataset=pairs, processing_class=qwen
            )
            steps.append(trainer.train().global_step)
    assert steps[0] == steps[1] == 3


def test_batches_are_one_flattened_row_without_padding(qwen, pairs):
    with tempfile.TemporaryDirectory() as tmp:
        model = tiny_causal_lm("llama", vocab_size=len(qwen), seed=0)
        args = trl.DPOConfig(output_dir=tmp, per_device_train_batch_size=4, report_to=[], use_cpu=True, bf16=False)
        trainer = FlatDPOTrainer(
            model=model, ref_model=copy.deepcopy(model), args=args, train_dataset=pairs, processing_class=qwen
        )
        batch = next(iter(trainer.get_train_dataloader()))
    lengths = (batch["cu_seq_lens_q"][1:] - batch["cu_seq_lens_q"][:-1]).tolist()
    assert batch["input_ids"].shape == (1, sum(lengths)) and len(lengths) == 8
    assert "attention_mask" not in batch


def test_without_args_the_collator_cuts_where_dpo_trainers_default_config_cuts(qwen, pairs, tmp_path, monkeypatch):
    """Without `args`, DPOTrainer trains with a default DPOConfig (max_length 1024, keep_start); the flattened
    collator must cut the same sequences, not keep them whole."""
    monkeypatch.chdir(tmp_path)  # the default config's output_dir is relative

    class CPUConfig(trl.DPOConfig):  # DPOTrainer's default config, where bf16 (its default) is refused on a CPU
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **{"bf16": False, "use_cpu": True, **kwargs})

    monkeypatch.setattr(dpo_trainer_module, "DPOConfig", CPUConfig)
    model = tiny_causal_lm("llama", vocab_size=len(qwen), seed=0)
    trainer = FlatDPOTrainer(model=model, ref_model=copy.deepcopy(model), train_dataset=pairs, processing_class=qwen)
    assert trainer.args.max_length is not None
    assert trainer.data_collator.max_length == trainer.args.max_length
    assert trainer.data_collator.truncation_mode == trainer.args.truncation_mode
