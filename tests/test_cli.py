"""The `flatcollate` command line: user mistakes end in one-line messages and exit 2, never in a traceback."""

import json
import subprocess
import sys

import pytest
import torch
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

import flatcollate
from flatcollate.cli import UsageError, build_parser, main


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _assert_usage_error(code: int, err: str, *fragments: str) -> None:
    """Exit 2 and exactly one line on stderr, `flatcollate[ <command>]: error: ...`: no usage block, no traceback."""
    assert code == 2, err
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert err.startswith("flatcollate") and ": error: " in err, err
    for fragment in fragments:
        assert fragment in err, err


def test_version(capsys):
    code, out, _ = _run(capsys, "--version")
    assert code == 0 and out.strip() == f"flatcollate {flatcollate.__version__}"


@pytest.mark.slow
@pytest.mark.parametrize("argv", [["--version"], ["--help"], ["check", "--help"], ["bench", "--help"]])
def test_help_and_version_do_not_import_torch_or_transformers(argv):
    script = (
        "import json, sys\n"
        "from flatcollate.cli import main\n"
        f"code = main({argv!r})\n"
        "print(json.dumps([code, sorted(m for m in ('torch', 'transformers') if m in sys.modules)]))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    code, heavy = json.loads(done.stdout.strip().splitlines()[-1])
    assert code == 0 and heavy == [], done.stdout


@pytest.mark.slow
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


def test_defaults_resolved_at_run_time_are_shown_in_help(capsys):
    from flatcollate.bench.config import SFTBenchConfig
    from flatcollate.bench.tasks.vision import VisionBenchConfig
    from flatcollate.check.text import DEFAULT_BACKENDS

    texts = {}
    for command in ("check", "bench"):
        with pytest.raises(SystemExit):
            build_parser().parse_args([command, "--help"])
        texts[command] = " ".join(capsys.readouterr().out.split())
    assert f"(default: {' '.join(DEFAULT_BACKENDS)})" in texts["check"]
    default, vision = SFTBenchConfig(), VisionBenchConfig()
    for shown in (default.model, " ".join(default.modes), default.attn, vision.max_images):
        assert f"(default: {shown})" in texts["bench"], shown
    assert vision.max_pixels == 28 * 28 * 1280 and "(default: Qwen2-VL's, 28*28*1280)" in texts["bench"]


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


@pytest.mark.parametrize("model", ["notamodel", "Llama", "qwen25", "EvollaModl"])
def test_check_suggests_model_types_only(model, capsys):
    code, _, err = _run(capsys, "check", model)
    _assert_usage_error(code, err, repr(model))
    suggested = err.partition("Did you mean ")[2].rstrip("?\n").split(", ") if "Did you mean" in err else []
    model_types = {name for name in CONFIG_MAPPING if name == name.lower()}
    assert all(name in model_types for name in suggested), err


def test_check_folder_without_config(capsys, tmp_path):
    code, _, err = _run(capsys, "check", str(tmp_path))
    _assert_usage_error(code, err, "config.json")


@pytest.mark.slow
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


def test_check_takes_flex_attention_where_it_trains(monkeypatch):
    # flex attention trains on CUDA; only a check on the CPU, where it has no backward, must refuse it.
    from flatcollate.check.options import validate_options

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    parse = build_parser().parse_args
    validate_options(parse(["check", "llama", "--device", "cuda", "--backends", "flex_attention"]))
    with pytest.raises(UsageError, match="no backward pass on the CPU"):
        validate_options(parse(["check", "llama", "--device", "cpu", "--backends", "flex_attention"]))


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


@pytest.mark.slow
def test_check_exit_status_is_the_flatcollate_backend(capsys):
    # opt's own sdpa/eager mix sequences; the backend prepare_model_for_flattening selects is exact.
    code, out, _ = _run(capsys, "check", "opt", "--lengths", "3", "5")
    assert code == 0
    assert "| sdpa | contaminated |" in out and "| flatcollate | exact |" in out
    assert "verdict: opt is safe with flatcollate" in out
    code, out, _ = _run(capsys, "check", "opt", "--lengths", "3", "5", "--require-all-backends")
    assert code == 1 and "verdict: opt is NOT safe" in out


# ---- flatcollate bench ----------------------------------------------------------------------------------------------


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
        (["--attn", "foo"], "--attn foo: unknown backend"),
        (["--model", "meta-llama/Llama-3.2-1B"], "the bench runs offline"),
        (["--pack-len", "10"], "--pack-len 10 is shorter than --max-length"),
        (["--set", "num_attention_heads=3"], "num_attention_heads=3"),
        (["--batch-size", "100000"], "needs about"),
    ],
)
def test_bench_usage_errors(argv, fragment, capsys, no_run, tmp_path):
    code, _, err = _run(capsys, "bench", "--out-dir", str(tmp_path / "out"), *argv)
    _assert_usage_error(code, err, fragment)


def test_bench_flash_attention_without_flash_attn(capsys, no_run, tmp_path):
    from flatcollate.attention import capabilities

    if capabilities.flash_attn_varlen_func is not None and torch.cuda.is_available():
        pytest.skip("flash-attn and CUDA are here")
    code, _, err = _run(capsys, "bench", "--attn", "flash_attention_2", "--out-dir", str(tmp_path))
    _assert_usage_error(code, err, "--attn flash_attention_2", "flash-attn")


def test_bench_refuses_a_full_size_model_the_machine_cannot_hold(capsys, no_run, tmp_path, monkeypatch):
    from flatcollate.bench import options

    monkeypatch.setattr(options, "available_bytes", lambda device: 24 * 2**30)  # this project's 24 GiB machines
    argv = ["--full-size", "--model", "llama", "--device", "cpu", "--out-dir", str(tmp_path)]
    code, _, err = _run(capsys, "bench", *argv)
    _assert_usage_error(code, err, "--full-size", "GiB", "--set num_hidden_layers")


def test_the_default_bench_fits(capsys, tmp_path):
    from flatcollate.bench import options
    from flatcollate.bench.config import SFTBenchConfig

    estimate = options.memory_estimate(SFTBenchConfig())
    assert 0 < estimate.total < 2 * 2**30, estimate  # the embedded default must never be refused


def test_bench_cuda_without_cuda(capsys, no_run, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("CUDA is available")
    code, _, err = _run(capsys, "bench", "--device", "cuda", "--out-dir", str(tmp_path))
    _assert_usage_error(code, err, "--device cuda", "CUDA")


def test_bench_without_matplotlib_says_what_to_install(capsys, no_run, tmp_path, without_matplotlib):
    """matplotlib is the `bench` extra, not a dependency: without it the bench refuses to start, in one line."""
    code, _, err = _run(capsys, "bench", "--out-dir", str(tmp_path))
    _assert_usage_error(code, err, "matplotlib", 'pip install "flatcollate[bench]"')


def test_bench_out_dir_is_checked_before_the_run(capsys, no_run, tmp_path):
    a_file = tmp_path / "report.txt"
    a_file.write_text("")
    code, _, err = _run(capsys, "bench", "--out-dir", str(a_file))
    _assert_usage_error(code, err, "--out-dir", "not a folder")
    code, _, err = _run(capsys, "bench", "--out-dir", str(a_file / "sub"))
    _assert_usage_error(code, err, "--out-dir", "cannot")
    assert not (tmp_path / "out").exists()


# ---- every mistake, one line --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "fragments"),
    [
        ([], ["required", "check"]),
        (["chek"], ["invalid choice", "'chek'"]),
        (["check"], ["required", "model"]),
        (["check", "llama", "--dtype", "bf16"], ["--dtype", "'bf16'", "bfloat16"]),
        (["check", "llama", "--lengths", "3", "x"], ["--lengths", "'x'"]),
        (["check", "llama", "--seed"], ["--seed", "expected one argument"]),
        (["check", "llama", "--tolerance", "tiny"], ["--tolerance", "'tiny'"]),
        (["check", "llama", "--bogus"], ["unrecognized arguments: --bogus"]),
        (["bench", "--steps", "0"], ["--steps", "'0'"]),
        (["bench", "--batch-size", "0"], ["--batch-size", "'0'"]),
        (["bench", "--threads", "0"], ["--threads", "'0'"]),
        (["bench", "--modes", "padded", "flatened"], ["--modes", "'flatened'", "flattened"]),
        (["bench", "--seed", "abc"], ["--seed", "'abc'"]),
        (["bench", "--device", "tpu"], ["--device", "'tpu'"]),
        (["bench", "--max-length"], ["--max-length", "expected one argument"]),
        (["bench", "--max-images", "-1"], ["--max-images", "'-1'"]),
        (["bench", "--bogus"], ["unrecognized arguments: --bogus"]),
        (["bench", "--vision", "--model", "llama"], ["--model", "--vision"]),
        (["bench", "--vision", "--model", "qwen2"], ["--model", "--vision"]),
        (["bench", "--vision", "--attn", "auto"], ["--attn", "--vision"]),
        (["bench", "--vision", "--modes", "padded", "flattened"], ["--modes", "--vision"]),
        (["bench", "--vision", "--full-size"], ["--full-size", "--vision"]),
        (["bench", "--max-images", "2"], ["--max-images", "--vision"]),
        (["bench", "--max-pixels", "200704"], ["--max-pixels", "--vision"]),
    ],
)
def test_every_mistake_is_one_line_and_exit_2(argv, fragments, capsys, no_run, tmp_path):
    code, _, err = _run(capsys, *argv, *(["--out-dir", str(tmp_path / "out")] if argv[:1] == ["bench"] else []))
    _assert_usage_error(code, err, *fragments)


def test_bench_profile_that_is_a_dataset_says_what_a_profile_is(capsys, no_run, tmp_path):
    rows = tmp_path / "train.jsonl"
    rows.write_text('{"question": "2 + 2?", "answer": "4"}\n{"question": "3 + 3?", "answer": "6"}\n')
    code, _, err = _run(capsys, "bench", "--profile", str(rows), "--out-dir", str(tmp_path / "out"))
    _assert_usage_error(code, err, "--profile", "train.jsonl", "length profile", "save_to_disk")
    assert "array" not in err and "inhomogeneous" not in err


@pytest.mark.parametrize("option", ["--versoin", "-v"])
def test_an_unknown_top_level_option_is_named(capsys, option):
    assert main([option]) == 2
    err = capsys.readouterr().err
    assert f"unrecognized option {option}; did you mean --version?" in err and "required" not in err
