"""One optimizer step of `FlatKTOTrainer` equals `KTOTrainer`'s padded step on the same batch: loss, the logged
metrics (KL, rewards, margins, log-probs, logits, entropy, tokens) and every parameter after one SGD step, fp32 CPU,
within 1e-5, for KTO with its KL term, APO-zero (unpaired), a precomputed reference, desirable/undesirable weights and
LoRA, with a `max_length` that cuts most sequences. Unpaired rows from HH-RLHF pairs, Qwen2.5's tokenizer, a tiny
Qwen2; the reference model differs from the policy, so the KL term and the rewards are not zero."""

import tempfile

import pytest
import torch
from datasets import Dataset
from transformers import AutoTokenizer

from flatcollate.integrations.trl import FlatKTOTrainer
from flatcollate.preference import DataCollatorForUnpairedPreference
from flatcollate.testing import tiny_causal_lm

pytestmark = pytest.mark.slow

trl = pytest.importorskip("trl")
TOL = 1e-5
METRICS = (
    "loss",
    "kl",
    "rewards/chosen",
    "rewards/rejected",
    "rewards/margins",
    "logps/chosen",
    "logps/rejected",
    "logits/chosen",
    "logits/rejected",
    "entropy",
    "num_tokens",
)
LABELS = (True, False, True, True, False, True, True, False)
"""Row `i` is pair `i`'s chosen reply (True) or its rejected one (False): the first batch of 4 is 3 desirable, 1 not."""


@pytest.fixture(scope="module")
def qwen(tokenizer_dir):
    return AutoTokenizer.from_pretrained(tokenizer_dir("qwen2.5-instruct"))


@pytest.fixture(scope="module")
def rows(hh_rlhf_prompt_pairs):
    """Unpaired rows from the first HH-RLHF pairs, split at their last assistant turn: prompt, one reply, label."""
    found = [
        {"prompt": head[-150:] + "\n\nAssistant:", "completion": chosen if label else rejected, "label": label}
        for (head, chosen, rejected), label in zip(hh_rlhf_prompt_pairs(len(LABELS)), LABELS, strict=True)
    ]
    return Dataset.from_list(found)


ONE_SGD_STEP = {
    "per_device_train_batch_size": 4,
    "max_length": 64,  # prompts of 17-43 tokens: most sequences are cut, as TRL cuts them
    "max_steps": 1,
    "learning_rate": 0.5,
    "optim": "sgd",
    "lr_scheduler_type": "constant",
    "report_to": [],
    "use_cpu": True,
    "bf16": False,
    "seed": 0,
    "disable_tqdm": True,
    "logging_steps": 1,
    "save_strategy": "no",
}


def make_trainer(trainer_class, qwen, rows, tmp, *, peft_config=None, **options):
    """A tiny Qwen2 policy and, without PEFT, a reference model with other weights (seed 1)."""
    model = tiny_causal_lm("qwen2", vocab_size=len(qwen), seed=0)
    ref_model = None if peft_config is not None else tiny_causal_lm("qwen2", vocab_size=len(qwen), seed=1)
    args = trl.KTOConfig(output_dir=tmp, **{**ONE_SGD_STEP, **options})
    return trainer_class(
        model=model, ref_model=ref_model, args=args, train_dataset=rows, processing_class=qwen, peft_config=peft_config
    )


def one_step(trainer_class, qwen, rows, tmp, **options):
    """Trainable parameters before and after one SGD step, the training loss and the logged metrics."""
    trainer = make_trainer(trainer_class, qwen, rows, tmp, **options)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    result = trainer.train()
    after = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    return before, after, result.training_loss, trainer.state.log_history[0]


def assert_same_step(expected, got):
    """Same loss, metrics and parameters; the step moved the parameters, so their equality says something."""
    before, expected_after, expected_loss, expected_logs = expected
    _, after, loss, logs = got
    assert abs(loss - expected_loss) <= TOL, (loss, expected_loss)
    assert set(METRICS) <= expected_logs.keys(), sorted(expected_logs)
    gaps = {key: abs(logs[key] - expected_logs[key]) for key in METRICS}
    assert max(gaps.values()) <= TOL, gaps
    assert after.keys() == expected_after.keys()
    assert max((expected_after[n] - p).abs().max().item() for n, p in after.items()) <= TOL
    assert max((expected_after[n] - p).abs().max().item() for n, p in before.items()) > 1e-4


CASES = [
    {},
    {"loss_type": "apo_zero_unpaired"},
    {"precompute_ref_log_probs": True},
    {"desirable_weight": 0.7, "undesirable_weight": 1.4},
]


@pytest.fixture(scope="module")
def kto_trainer_step(qwen, rows, tmp_path_factory):
    """`KTOTrainer`'s padded step for some options, run once per options for the whole module."""
    steps = {}

    def get(**options):
        key = repr(sorted(options.items()))
        if key not in steps:
            steps[key] = one_step(trl.KTOTrainer, qwen, rows, tmp_path_factory.mktemp("kto"), **options)
        return steps[key]

    return get


@pytest.mark.parametrize("options", CASES, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()) or "kto")
def test_one_step_equals_kto_trainer(qwen, rows, kto_trainer_step, options):
    expected = kto_trainer_step(**options)
    with tempfile.TemporaryDirectory() as tmp:
        got = one_step(FlatKTOTrainer, qwen, rows, tmp, **options)
    if options.get("loss_type", "kto") == "kto":
        assert expected[3]["kl"] > 0.1, expected[3]["kl"]  # the KL rows are read: a mix-up would change it
    assert_same_step(expected, got)


def test_one_step_with_lora_equals_kto_trainer(qwen, rows, kto_trainer_step):
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    expected = kto_trainer_step(peft_config=config)
    with tempfile.TemporaryDirectory() as tmp:
        got = one_step(FlatKTOTrainer, qwen, rows, tmp, peft_config=config)
    assert_same_step(expected, got)


def shift_first_boundary(batch: dict, prefix: str) -> dict:
    """Move the first token of sequence 1 of the `prefix` row into sequence 0."""
    bounds = batch[f"{prefix}cu_seq_lens_q"].clone()
    bounds[1] += 1
    batch[f"{prefix}cu_seq_lens_q"] = batch[f"{prefix}cu_seq_lens_k"] = bounds
    batch[f"{prefix}max_length_q"] = batch[f"{prefix}max_length_k"] = int((bounds[1:] - bounds[:-1]).max())
    positions = batch[f"{prefix}position_ids"][0]
    start = int(bounds[1]) - 1
    positions[start] = positions[start - 1] + 1
    positions[start + 1 : int(bounds[2])] -= 1
    return batch


@pytest.mark.parametrize(("prefix", "metric"), [("", "logps/rejected"), ("KL_", "kl")])
def test_a_shifted_boundary_changes_the_step(qwen, rows, kto_trainer_step, monkeypatch, prefix, metric):
    """Negative control: the same comparison fails when one token moves from a sequence to the one before, in the
    main row (sequence 1, a rejected reply, loses its first token: the rejected log-probabilities change) or in the KL
    row (the KL term changes)."""
    call = DataCollatorForUnpairedPreference.__call__
    _, _, _, expected_logs = kto_trainer_step()
    with tempfile.TemporaryDirectory() as tmp:
        monkeypatch.setattr(
            DataCollatorForUnpairedPreference,
            "__call__",
            lambda self, examples: shift_first_boundary(call(self, examples), prefix),
        )
        _, _, _, logs = one_step(FlatKTOTrainer, qwen, rows, tmp)
    assert abs(logs[metric] - expected_logs[metric]) > 1e-3, (logs[metric], expected_logs[metric])


def test_the_step_count_is_kto_trainers(qwen, rows):
    """Eight rows in batches of 3: three steps each, the last batch of 2 (the smallest learning rate keeps it cheap)."""
    with tempfile.TemporaryDirectory() as tmp:
        steps = []
        for trainer_class in (trl.KTOTrainer, FlatKTOTrainer):
            trainer = make_trainer(
                trainer_class, qwen, rows, tmp, per_device_train_batch_size=3, max_steps=-1, num_train_epochs=1
            )
            steps.append(trainer.train().global_step)
    assert steps[0] == steps[1] == 3


def test_batches_are_one_flattened_row_without_padding(qwen, rows):
    with tempfile.TemporaryDirectory() as tmp:
        trainer = make_trainer(FlatKTOTrainer, qwen, rows, tmp)
        batch = next(iter(trainer.get_train_dataloader()))
    for prefix in ("", "KL_"):
        lengths = (batch[f"{prefix}cu_seq_lens_q"][1:] - batch[f"{prefix}cu_seq_lens_q"][:-1]).tolist()
        assert batch[f"{prefix}input_ids"].shape == (1, sum(lengths)) and len(lengths) == 4
        assert f"{prefix}attention_mask" not in batch
    assert batch["label"].tolist() == list(LABELS[:4])


def test_image_rows_are_refused(qwen, rows):
    with tempfile.TemporaryDirectory() as tmp, pytest.raises(ValueError, match=r"Use trl\.KTOTrainer"):
        make_trainer(FlatKTOTrainer, qwen, rows.add_column("images", [None] * len(rows)), tmp)


def test_kl_and_reference_log_probs_of_a_flattened_batch_equal_the_padded_batchs(qwen, rows):
    """`_compute_kl_logps` and `compute_ref_log_probs` called with a flattened batch equal `KTOTrainer`'s own on TRL's
    padded batch of the same examples, with the same (prepared) models."""
    with tempfile.TemporaryDirectory() as tmp:
        trainer = make_trainer(FlatKTOTrainer, qwen, rows, tmp)
    examples = [trainer.train_dataset[index] for index in range(4)]
    collate = trl.trainer.kto_trainer.DataCollatorForUnpairedPreference
    padded = collate(pad_token_id=qwen.pad_token_id, max_length=trainer.args.max_length)(examples)
    flat = trainer.data_collator(examples)
    got = [trainer._compute_kl_logps(trainer.model, flat), *trainer.compute_ref_log_probs(trainer.ref_model, flat)]
    expected = [
        trl.KTOTrainer._compute_kl_logps(trainer, trainer.model, padded),
        *trl.KTOTrainer.compute_ref_log_probs(trainer, trainer.ref_model, padded),
    ]
    for value, reference in zip(got, expected, strict=True):
        torch.testing.assert_close(value, reference, rtol=0, atol=TOL)
    assert not torch.allclose(expected[1], expected[2])  # the completions' and the KL completions' are told apart
