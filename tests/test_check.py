"""`check_model` and `flatcollate check` on a representative, fast subset of families."""

import pytest

from flatcollate.check import check_model
from flatcollate.cli import main

LENGTHS = (6, 1, 11, 3)


@pytest.mark.parametrize(
    ("family", "overrides"),
    [
        ("llama", {}),
        ("qwen2", {}),
        ("mistral", {"sliding_window": 4}),  # windows shorter than the sequences
        ("gemma2", {"sliding_window": 4}),  # soft-capping + alternating sliding layers
        ("mixtral", {}),  # MoE
        ("opt", {}),  # mask builder drops position_ids; the packed backend does not need it
        ("falcon", {}),  # attention outside the interface; mask builders patched
    ],
)
def test_flatcollate_backend_is_exact(family, overrides):
    report = check_model(family, backends=("flatcollate",), lengths=LENGTHS, overrides=overrides)
    (result,) = report.results
    assert result.status == "exact", report.to_markdown()
    assert max(result.logits_diff, result.loss_diff, result.grad_diff) <= 1e-5
    assert report.passed


def test_check_detects_contamination_of_vanilla_backends():
    report = check_model("opt", backends=("sdpa", "eager", "flatcollate"), lengths=LENGTHS)
    statuses = {r.backend: r.status for r in report.results}
    assert statuses == {"sdpa": "contaminated", "eager": "contaminated", "flatcollate": "exact"}
    assert not report.passed
    assert all(r.logits_diff > 1e-3 for r in report.results if r.status == "contaminated")


def test_unsupported_backend_and_family_are_reported_with_reasons():
    report = check_model("gemma2", backends=("sdpa",), lengths=(4, 2))
    assert report.results[0].status == "unsupported" and "does not support" in report.results[0].reason
    rwkv = check_model("rwkv", backends=("flatcollate",), lengths=(4, 2))
    assert rwkv.results[0].status == "unsupported" and "carry state" in rwkv.results[0].reason


def test_bad_lengths_raise():
    with pytest.raises(ValueError, match=r"positive sequence lengths, got \[3, 0\]"):
        check_model("llama", lengths=(3, 0))


def test_cli_exit_status(capsys):
    assert main(["check", "llama", "--backends", "flatcollate", "--lengths", "3", "1", "5"]) == 0
    assert "| flatcollate | exact |" in capsys.readouterr().out
    assert main(["check", "opt", "--backends", "sdpa", "--lengths", "3", "5"]) == 1
    assert "| sdpa | contaminated |" in capsys.readouterr().out


@pytest.mark.parametrize("lengths", [(12,), ()])
def test_a_check_without_a_boundary_is_refused(lengths):
    with pytest.raises(ValueError, match="at least two sequences"):
        check_model("llama", backends=("flatcollate",), lengths=lengths)


def test_cli_refuses_a_single_length_without_a_traceback(capsys):
    assert main(["check", "llama", "--lengths", "12"]) == 2
    err = capsys.readouterr().err
    assert "at least two positive sequence lengths" in err and "Traceback" not in err
