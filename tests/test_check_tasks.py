"""`flatcollate check --task dpo|reward` proves the per-sequence outputs of training after SFT and can fail: a
family whose state leaks across sequences in vanilla transformers is reported contaminated, and so is a pooling one
token late. `--task dpo` takes image-text families too (examples with 1, 2 and 0 images); `--task reward` refuses
them."""

import pytest

from flatcollate.boundaries import Boundaries
from flatcollate.check import check_model
from flatcollate.check import cli as check_cli
from flatcollate.check.tasks import TASKS
from flatcollate.cli import main
from flatcollate.testing import tiny_vision as tiny


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


@pytest.mark.parametrize(("family", "vanilla"), [("qwen2_vl", "contaminated"), ("llava", "exact")])
def test_dpo_log_probabilities_of_image_text_families_are_exact(family, vanilla):
    """Qwen2-VL's vanilla backend numbers the row's multimodal-RoPE positions as one sequence; LLaVA's is kept apart
    by transformers' own packed-sequence detection. The prepared model is exact on both, and the check sees its
    images."""
    report = check_model(family, task="dpo", backends=("sdpa", "flatcollate"))
    assert {r.backend: r.status for r in report.results} == {"sdpa": vanilla, "flatcollate": "exact"}, (
        report.to_markdown()
    )
    assert report.exercised["task"].startswith("dpo") and report.exercised["images"].startswith("1, 2, 0 per example")
    shift = report.exercised["images reversed across examples (control)"]
    assert shift.startswith("the completion log-probabilities move by"), shift
    assert "parameters get one" in report.exercised["image-path gradients (control)"]


def test_the_image_text_dpo_check_sees_a_boundary_one_token_early(monkeypatch):
    import flatcollate.preference.logprobs as logprobs

    bounds = logprobs.sequence_bounds

    def early(batch):
        moved = bounds(batch).cu_seqlens.clone()
        moved[1] -= 1
        return Boundaries(moved, int(moved.diff().max()))

    monkeypatch.setattr(logprobs, "sequence_bounds", early)
    report = check_model("qwen2_vl", task="dpo", backends=("flatcollate",))
    assert report.results[0].status == "contaminated" and report.results[0].loss_diff > 1e-2, report.to_markdown()


def test_an_image_text_dpo_check_blind_to_its_images_is_unverified(monkeypatch):
    """Gemma 3 as transformers initialises it ignores its pixels: its log-probabilities would agree whatever image
    reached whichever sequence, so the check reports it `unverified`."""
    monkeypatch.setattr(tiny, "WEIGHT_NOISE", 0.0)
    (result,) = check_model("gemma3", task="dpo", backends=("flatcollate",)).results
    assert result.status == "unverified" and result.reason.startswith("blind to its images"), result


def test_tasks_refuse_what_they_do_not_check():
    import torch

    with pytest.raises(ValueError, match=r"task='reward' takes text families: qwen2_vl is an image-text-to-text"):
        check_model("qwen2_vl", task="reward")
    with pytest.raises(ValueError, match=r"qwen2_vl.*lengths"):
        check_model("qwen2_vl", task="dpo", lengths=(3, 4))
    with pytest.raises(ValueError, match="runs in float32 on the CPU"):
        check_model("llama", task="reward", dtype=torch.bfloat16)


def test_the_command_line_checks_a_task(capsys):
    assert main(["check", "llama", "--task", "dpo", "--backends", "flatcollate"]) == 0
    assert "task: dpo" in capsys.readouterr().out
    assert main(["check", "qwen2_vl", "--task", "dpo", "--backends", "flatcollate"]) == 0
    out = capsys.readouterr().out
    assert "task: dpo" in out and "verdict: qwen2_vl is safe with flatcollate" in out
    for argv in (
        ["qwen2_vl", "--task", "reward"],
        ["qwen2_vl", "--task", "dpo", "--lengths", "3", "4"],
        ["llama", "--task", "dpo", "--dtype", "bfloat16"],
    ):
        assert main(["check", *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "flatcollate check: error: " in err, err
    assert main(["check", "qwen2_vl", "--task", "reward"]) == 2
    assert "the reward check takes text families" in capsys.readouterr().err
    assert check_cli.TASKS == TASKS
