"""The `flatcollate` command line: user mistakes end in one-line messages and exit 2, never in a traceback."""

import subprocess
import sys

import pytest
import torch

import flatcollate
from flatcollate.bench import cli as bench_cli
from flatcollate.cli import build_parser, main


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _assert_usage_error(code: int, err: str, *fragments: str) -> None:
    """Exit 2, no traceback, and one error line (argparse's own errors come after its usage lines)."""
    assert code == 2, err
    assert "Traceback" not in err
    *usage, message = err.strip().splitlines()
    assert " error: " in message and all(line.startswith(("usage:", " ")) for line in usage), err
    for fragment in fragments:
        assert fragment in message, err


def test_version(capsys):
    code, out, _ = _run(capsys, "--version")
    assert code == 0 and out.strip() == f"flatcollate {flatcollate.__version__}"


def test_python_dash_m_runs_the_cli():
    done = subprocess.run(
        [sys.executable, "-m", "flatcollate", "check", "./no-such-dir"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "flatcollate check: error:" in done.stderr and "not found" in done.stderr


@pytest.mark.parametrize("command", ["check", "bench"])
def test_every_option_has_a_description_and_its_default_in_help(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args([command, "--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    parser = build_parser()._subparsers._group_actions[0].choices[command]
    options = [a for a in parser._actions if a.option_strings and a.dest != "help"]
    assert options
    for action in options:
        assert action.help, action.option_strings
        if not (action.default is None or action.default is False or action.default == []):
            assert f"(default: {action.default})" in text, action.option_strings


# ---- flatcollate check ----------------------------------------------------------------------------------------------


def test_check_missing_folder(capsys):
    code, _, err = _run(capsys, "check", "./no-such-dir")
    _assert_usage_error(code, err, "./no-such-dir", "not found")
    assert "Should contain one of" not in err


def test_check_hub_id_needs_a_local_folder(capsys):
    code, _, err = _run(capsys, "check", "meta-llama/Llama-3.2-1B")
    _assert_usage_error(code, err, "meta-llama/Llama-3.2-1B", "config.json", "offline")


def test_check_unknown_model_type_suggests_a_close_one(capsys):
    code, _, err = _run(capsys, "check", "lama")
    _assert_usage_error(code, err, "'lama'", "llama")


def test_check_folder_without_config(capsys, tmp_path):
    code, _, err = _run(capsys, "check", str(tmp_path))
    _assert_usage_error(code, err, "config.json")


@pytest.mark.parametrize(
    ("family", "reason"), [("t5", "encoder-decoder"), ("rwkv", "carry state across sequence boundaries")]
)
def test_check_unsupported_family_gives_its_reason(family, reason, capsys):
    code, out, err = _run(capsys, "check", family)
    assert code == 1 and "Traceback" not in err
    assert f"verdict: {family} is NOT safe with flatcollate" in out and reason in out


def test_check_missing_flash_attn_is_a_usage_error(capsys):
    from transformers.utils import is_flash_attn_2_available

    if is_flash_attn_2_available():
        pytest.skip("flash-attn is installed")
    code, _, err = _run(capsys, "check", "llama", "--backends", "flash_attention_2")
    _assert_usage_error(code, err, "flash_attention_2", "flash-attn")


def test_check_flex_attention_cannot_train_on_the_cpu(capsys):
    code, _, err = _run(capsys, "check", "llama", "--backends", "flex_attention")
    _assert_usage_error(code, err, "flex attention", "CPU")


def test_check_unknown_backend(capsys):
    code, _, err = _run(capsys, "check", "llama", "--backends", "flashy")
    _assert_usage_error(code, err, "flashy", "sdpa")


@pytest.mark.parametrize("value", ["-1", "0", "nan", "inf"])
def test_check_tolerance_must_be_positive_and_finite(value, capsys):
    code, _, err = _run(capsys, "check", "llama", "--tolerance", value)
    _assert_usage_error(code, err, "--tolerance")


def test_check_refuses_lengths_whose_reference_would_not_fit(capsys):
    code, _, err = _run(capsys, "check", "llama", "--lengths", "100000", "3")
    _assert_usage_error(code, err, "--lengths", "4096")


def test_check_exit_status_is_the_flatcollate_backend(capsys):
    # opt's own sdpa/eager mix sequences; the backend prepare_model_for_flattening selects is exact.
    code, out, _ = _run(capsys, "check", "opt", "--lengths", "3", "5")
    assert code == 0
    assert "| sdpa | contaminated |" in out and "| flatcollate | exact |" in out
    assert "verdict: opt is safe with flatcollate" in out
    code, out, _ = _run(capsys, "check", "opt", "--lengths", "3", "5", "--require-all-backends")
    assert code == 1 and "verdict: opt is NOT safe" in out


# ---- flatcollate bench ----------------------------------------------------------------------------------------------


@pytest.fixture
def no_run(monkeypatch):
    """Usage errors must be found before any training starts."""

    def refuse(*args, **kwargs):
        raise AssertionError("the benchmark ran despite a usage error")

    monkeypatch.setattr(bench_cli, "run_and_report", refuse)


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--steps", "0"], "--steps"),
        (["--batch-size", "0"], "--batch-size"),
        (["--repeats", "0"], "--repeats"),
        (["--threads", "0"], "--threads"),
        (["--max-length", "-3"], "--max-length"),
        (["--warmup-steps", "-1"], "--warmup-steps"),
        (["--lr", "nan"], "--lr"),
        (["--lr=-1e-3"], "--lr"),
        (["--set", "hidden_size=-5"], "hidden_size"),
        (["--set", "hidden_size=1.5"], "hidden_size"),
        (["--set", "hidden_sise=256"], "did you mean hidden_size"),
        (["--set", "bogus_key=3"], "bogus_key"),
        (["--set", "hidden_size"], "KEY=VALUE"),
        (["--profile", "no-such-profile"], "no-such-profile"),
    ],
)
def test_bench_usage_errors(argv, fragment, capsys, no_run, tmp_path):
    code, _, err = _run(capsys, "bench", "--out-dir", str(tmp_path / "out"), *argv)
    _assert_usage_error(code, err, fragment)


def test_bench_cuda_without_cuda(capsys, no_run, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("CUDA is available")
    code, _, err = _run(capsys, "bench", "--device", "cuda", "--out-dir", str(tmp_path))
    _assert_usage_error(code, err, "--device cuda", "CUDA")


def test_bench_out_dir_is_checked_before_the_run(capsys, no_run, tmp_path):
    a_file = tmp_path / "report.txt"
    a_file.write_text("")
    code, _, err = _run(capsys, "bench", "--out-dir", str(a_file))
    _assert_usage_error(code, err, "--out-dir", "not a folder")
    code, _, err = _run(capsys, "bench", "--out-dir", str(a_file / "sub"))
    _assert_usage_error(code, err, "--out-dir", "cannot")
    assert not (tmp_path / "out").exists()
