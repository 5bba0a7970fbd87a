"""`flatcollate check --task dpo|reward` proves the per-sequence outputs of training after SFT and can fail: a
family whose state leaks across sequences in vanilla transformers is reported contaminated, and so is a pooling one
token late."""

import pytest

from flatcollate.check import check_model
from flatcollate.check import cli as check_cli
from flatcollate.check.tasks import TASKS
from flatcollate.cli import main


@pytest.mark.parametrize("model_type", ["llama", "mistral", "jamba"])
def test_dpo_log_probabilities_are_exact(model_type):
    report = check_model(model_type, task="dpo", backends=("flatcollate",))
    assert report.passed, report.to_markdown()
    assert report.exercised["task"].startswith("dpo")


def test_the_dpo_check_sees_a_state_leak():
    """Negative control: Jamba's state-space layers carry state across sequences in transformers' own backends."""
    report = check_model("jamba", task="dpo", backends=("sdpa",))
    assert report.results[0].status == "contaminated" and report.results[0].grad_diff > 1e-3


@pytest.mark.parametrize("model_type", ["llama", "gemma2", "jamba"])
def test_reward_scores_are_exact(model_type):
    report = check_model(model_type, task="reward", backends=("flatcollate",))
    assert report.passed, report.to_markdown()


def test_the_reward_check_sees_pooling_one_token_late(monkeypatch):
    import flatcollate.preference.scores as scores

    pooled = scores.pooled_indices
    monkeypatch.setattr(scores, "pooled_indices", lambda *args, **kwargs: (pooled(*args, **kwargs) - 1).clamp(min=0))
    report = check_model("llama", task="reward", backends=("flatcollate",))
    assert report.results[0].status == "contaminated" and report.results[0].logits_diff > 1e-3


def test_a_family_without_a_classifier_is_unsupported_with_its_reason():
    report = check_model("mamba2", task="reward", backends=("flatcollate",))
    assert report.results[0].status == "unsupported"
    assert "no sequence-classification model for mamba2" in report.results[0].reason


def test_tasks_refuse_what_they_do_not_check():
    import torch

    with pytest.raises(ValueError, match="checks text families in float32 on the CPU"):
        check_model("qwen2_vl", task="dpo")
    with pytest.raises(ValueError, match="checks text families in float32 on the CPU"):
        check_model("llama", task="reward", dtype=torch.bfloat16)


def test_the_command_line_checks_a_task(capsys):
    assert main(["check", "llama", "--task", "dpo", "--backends", "flatcollate"]) == 0
    assert "task: dpo" in capsys.readouterr().out
    for argv in (["qwen2_vl", "--task", "reward"], ["llama", "--task", "dpo", "--dtype", "bfloat16"]):
        assert main(["check", *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "flatcollate check: error: " in err, err
    assert check_cli.TASKS == TASKS
