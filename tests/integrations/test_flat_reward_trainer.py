"""`FlatRewardTrainer` trains exactly what `trl.RewardTrainer` trains, padding-free.

Both trainers run the same SGD steps from the same weights on the same real preference pairs (HH-RLHF harmless, two
real tokenizers, two batches of which the last is short): the loss of every step, every logged metric, every parameter
after training and the evaluation that follows agree within 1e-5 (fp32, CPU; the gradient norm relatively), with and
without `margin` and `center_rewards_coefficient`, full fine-tuning and LoRA. A collator that moves one boundary by
one token makes the comparison fail.
"""

import copy
import gzip
import json
from dataclasses import dataclass

import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForSequenceClassification, AutoTokenizer
from trl import RewardConfig, RewardTrainer

from flatcollate.integrations.trl import FlatRewardTrainer
from flatcollate.preference import DataCollatorForRewardPairs
from flatcollate.testing import tiny_config

pytestmark = pytest.mark.slow

peft = pytest.importorskip("peft")

NUM_PAIRS = 6  # batches of 4 and 2
TOLERANCE = 1e-5
METRICS = ("loss", "grad_norm", "accuracy", "margin", "min_reward", "mean_reward", "max_reward", "num_tokens")
EVAL_METRICS = ("eval_loss", "eval_accuracy", "eval_margin", "eval_min_reward", "eval_mean_reward", "eval_max_reward")


@pytest.fixture(scope="module")
def pairs(shared_data) -> list[dict]:
    path = shared_data / "datasets" / "hh_rlhf_harmless_base_test.jsonl.gz"
    if not path.is_file():
        pytest.skip(f"{path.name} not in {shared_data}")
    rows = []
    with gzip.open(path, "rt") as lines:
        for line in lines:  # the shortest conversations of the first rows keep the test fast
            row = json.loads(line)
            if len(row["chosen"]) + len(row["rejected"]) < 1200:
                rows.append({"chosen": row["chosen"], "rejected": row["rejected"]})
            if len(rows) == NUM_PAIRS:
                return rows
    return rows


@dataclass
class Run:
    losses: list[float]
    logs: list[dict]
    parameters: dict[str, torch.Tensor]
    steps: int
    evaluation: dict[str, float]


def reward_model(tokenizer_path) -> torch.nn.Module:
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    torch.manual_seed(0)
    config = tiny_config("qwen2", vocab_size=len(tokenizer), num_labels=1)
    return AutoModelForSequenceClassification.from_config(config)


def train(trainer_class, model, tokenizer_path, dataset, tmp_path, *, peft_config=None, collator=None, **options):
    args = RewardConfig(
        output_dir=str(tmp_path / trainer_class.__name__),
        per_device_train_batch_size=4,
        num_train_epochs=1,
        optim="sgd",
        learning_rate=1.0,
        lr_scheduler_type="constant",
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        bf16=False,
        seed=0,
        disable_tqdm=True,
        **options,
    )
    extra = {"data_collator": collator} if collator is not None else {}
    trainer = trainer_class(
        model=model,
        args=args,
        train_dataset=dataset,
        processing_class=AutoTokenizer.from_pretrained(tokenizer_path),
        peft_config=peft_config,
        **extra,
    )
    losses, compute_loss = [], trainer.compute_loss

    def recording(*args, **kwargs):
        loss = compute_loss(*args, **kwargs)
        losses.append(loss.item())
        return loss

    trainer.compute_loss = recording
    trainer.train()
    del trainer.compute_loss  # the class's again: evaluation asks it for outputs too
    logs = [{k: entry[k] for k in METRICS} for entry in trainer.state.log_history if "loss" in entry]
    parameters = {name: p.detach().clone() for name, p in trainer.model.named_parameters() if p.requires_grad}
    evaluation = trainer.evaluate(dataset)  # one batch of every pair, after the steps
    return Run(losses, logs, parameters, trainer.state.global_step, {k: evaluation[k] for k in EVAL_METRICS})


def differences(padded: Run, flat: Run) -> dict[str, float]:
    """Largest absolute difference per compared quantity."""
    assert padded.steps == flat.steps == 2
    assert padded.parameters.keys() == flat.parameters.keys()
    found = {"loss": max(abs(a - b) for a, b in zip(padded.losses, flat.losses, strict=True))}
    for key in METRICS:
        found[f"log {key}"] = max(abs(a[key] - b[key]) for a, b in zip(padded.logs, flat.logs, strict=True))
    # The gradient norm sums ~10M squared fp32 entries (the embedding of a real vocabulary) in another order: relative.
    found["log grad_norm"] = max(
        abs(a["grad_norm"] - b["grad_norm"]) / a["grad_norm"] for a, b in zip(padded.logs, flat.logs, strict=True)
    )
    for key in EVAL_METRICS:
        found[key] = abs(padded.evaluation[key] - flat.evaluation[key])
    found["parameters"] = max((padded.parameters[k] - flat.parameters[k]).abs().max().item() for k in flat.parameters)
    return found


def compare(
    pairs, tokenizer_dir, tmp_path, tokenizer="qwen2.5-instruct", *, margin=False, lora=False, collator=None, **options
):
    path = tokenizer_dir(tokenizer)
    rows = [{**row, "margin": 0.25 * i - 0.5} for i, row in enumerate(pairs)] if margin else pairs
    dataset = Dataset.from_list(rows)
    model = reward_model(path)
    runs = []
    for trainer_class in (RewardTrainer, FlatRewardTrainer):
        peft_config = None
        if lora:
            peft_config = peft.LoraConfig(
                task_type="SEQ_CLS", r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], modules_to_save=["score"]
            )
        flat_collator = collator if trainer_class is FlatRewardTrainer else None
        runs.append(
            train(
                trainer_class,
                copy.deepcopy(model),
                path,
                dataset,
                tmp_path,
                peft_config=peft_config,
                collator=flat_collator,
                **options,
            )
        )
    before = {name: p for name, p in model.named_parameters()}
    moved = max(
        ((runs[1].parameters[k] - before[k]).abs().max().item() for k in runs[1].parameters if k in before), default=0.0
    )
    return differences(*runs), moved


@pytest.mark.parametrize(
    ("margin", "center"),
    [(False, None), (True, None), (False, 0.01), (True, 0.01)],
    ids=["plain", "margin", "center", "margin-center"],
)
def test_same_steps_losses_metrics_and_parameters_as_reward_trainer(pairs, tokenizer_dir, tmp_path, margin, center):
    found, moved = compare(pairs, tokenizer_dir, tmp_path, margin=margin, center_rewards_coefficient=center)
    print(f"max abs differences: {found}")
    assert max(found.values()) <= TOLERANCE, found
    assert moved > 1e-3  # the steps changed the weights


def test_pad_token_that_is_the_eos_token(pairs, tokenizer_dir, tmp_path):
    """Llama 3.2's tokenizer has no pad token: TRL pads with the eos it appends to every text, and the model pools
    at the token before it; the flattened scores are read at the same token."""
    found, _ = compare(pairs, tokenizer_dir, tmp_path, "llama-3.2-instruct")
    print(f"max abs differences: {found}")
    assert max(found.values()) <= TOLERANCE, found


def test_lora_with_a_trained_score_head(pairs, tokenizer_dir, tmp_path):
    found, _ = compare(pairs, tokenizer_dir, tmp_path, lora=True, margin=True)
    print(f"max abs differences: {found}")
    assert max(found.values()) <= TOLERANCE, found


class OneBoundaryLate(DataCollatorForRewardPairs):
    """Negative control: the same row of tokens, with the first chosen sequence taking the second's first token."""

    def __call__(self, features, return_tensors=None):
        first, second = dict(features[0]), dict(features[1])
        first["chosen_ids"] = [*first["chosen_ids"], *second["chosen_ids"][:1]]
        second["chosen_ids"] = list(second["chosen_ids"][1:])
        return super().__call__([first, second, *features[2:]], return_tensors=return_tensors)


def test_a_boundary_one_token_late_fails_the_comparison(pairs, tokenizer_dir, tmp_path):
    found, _ = compare(pairs, tokenizer_dir, tmp_path, collator=OneBoundaryLate())
    print(f"max abs differences: {found}")
    assert found["loss"] > 1e-4 and found["parameters"] > 1e-3, found


def test_misuse_is_refused(pairs, tokenizer_dir, tmp_path):
    from trl.trainer.reward_trainer import DataCollatorForPreference

    path = tokenizer_dir("qwen2.5-instruct")
    dataset = Dataset.from_list(pairs[:2])
    with pytest.raises(ValueError, match=r"pad_to_multiple_of"):
        train(FlatRewardTrainer, reward_model(path), path, dataset, tmp_path, pad_to_multiple_of=8)
    padded = DataCollatorForPreference(pad_token_id=0)
    with pytest.raises(ValueError, match=r"(?s)cu_seq_lens_q.*DataCollatorForRewardPairs"):
        train(FlatRewardTrainer, reward_model(path), path, dataset, tmp_path, collator=padded)
