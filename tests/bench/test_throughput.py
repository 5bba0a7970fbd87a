"""Bookkeeping of the text SFT benchmark on a tiny run: tokens, padding, step counts, JSON keys, report files."""

import argparse
import json
from dataclasses import replace

import numpy as np
import pytest
import torch

import flatcollate
from flatcollate.bench import timing
from flatcollate.bench.batches import (
    MODES,
    pad_examples,
    real_tokens,
    slot_tokens,
    step_batches,
)
from flatcollate.bench.cli import add_arguments, config_from_args
from flatcollate.bench.config import SFTBenchConfig
from flatcollate.bench.harness import PROFILE_DRAWS, get_task, in_process, run_bench
from flatcollate.bench.report import headline_lines, markdown_table, report_files, summary_text, write_report
from flatcollate.bench.summary import cpu_name, headline
from flatcollate.bench.timing import MAX_SETTLE_PASSES
from flatcollate.profiles import load_profile, padded_fill
from flatcollate.profiles.length_profile import LengthProfile
from flatcollate.synthetic import synthetic_sequences

pytestmark = pytest.mark.slow

TINY = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 16,
    "vocab_size": 64,
}
CONFIG = SFTBenchConfig(
    model_overrides=TINY, profile="gsm8k", batch_size=3, max_length=96, steps=3, warmup_steps=1, repeats=2, modes=MODES
)


THREADS_BEFORE = torch.get_num_threads()


def run_throughput(config, **kwargs):
    """The SFT benchmark with every run in this process (`test_the_bench_command_...` below starts real workers)."""
    return run_bench("sft", config, runner=in_process, **kwargs)


@pytest.fixture(scope="module")
def result():
    return run_throughput(CONFIG, progress=False)


def _pool(n=11, max_length=40, seed=0):
    profile = LengthProfile.from_lengths([0, 1, 5, 30, 60], [1, 0, 7, 20, 3], name="edges")
    return synthetic_sequences(profile, n, max_length=max_length, vocab_size=50, seed=seed)


def test_pad_examples_against_a_per_sequence_loop():
    seqs = _pool()
    indices = np.array([4, 0, 7])
    batch = pad_examples(seqs.features(indices), pad_to=40)
    for row, i in enumerate(indices):
        n = seqs.lengths[i]
        ids = seqs.tokens[seqs.offsets[i] : seqs.offsets[i + 1]]
        assert batch["input_ids"][row, :n].tolist() == ids.tolist()
        assert (batch["input_ids"][row, n:] == 0).all() and (batch["labels"][row, n:] == -100).all()
        assert batch["attention_mask"][row].tolist() == [1] * n + [0] * (40 - n)
    assert real_tokens(batch) == int(seqs.lengths[indices].sum()) and slot_tokens(batch) == 3 * 40
    with pytest.raises(ValueError, match="shorter than the longest"):
        pad_examples(seqs.features(indices), pad_to=1)


@pytest.mark.parametrize("batch_size", [1, 4, 11, 20])
def test_every_mode_trains_on_the_same_tokens(batch_size):
    seqs = _pool()
    collator = flatcollate.DataCollatorWithFlattening()
    total = int(seqs.lengths.sum())
    counts = {}
    for mode in MODES:
        built = step_batches(
            seqs, mode, batch_size=batch_size, max_length=40, pack_len=64, flattening_collator=collator
        )
        assert sum(real_tokens(b) for b in built) == total
        counts[mode] = len(built)
        if mode == "hf_flattened":  # transformers' own collator: boundaries only in the restarting positions
            assert all(set(b) == {"input_ids", "labels", "position_ids"} for b in built)
        if mode in ("flattened", "packed"):
            assert all("attention_mask" not in b for b in built)
            assert sum(len(b["cu_seq_lens_q"]) - 1 for b in built) == len(seqs.lengths)
        if mode == "packed":
            assert all(b["input_ids"].shape[1] <= 64 for b in built)
    assert counts["padded"] == counts["padded_max"] == counts["flattened"] == -(-len(seqs.lengths) // batch_size)
    assert counts["hf_flattened"] == counts["flattened"]


def test_unknown_mode():
    with pytest.raises(ValueError, match="Unknown mode 'unpadded'"):
        step_batches(_pool(), "unpadded", batch_size=2, max_length=40, pack_len=64, flattening_collator=None)
    with pytest.raises(ValueError, match=r"Unknown mode\(s\) \['x'\]"):
        run_throughput(SFTBenchConfig(modes=("padded", "x")), progress=False)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("steps", 0, "`steps` must be a positive int, got 0"),
        ("batch_size", 0, "`batch_size` must be a positive int"),
        ("repeats", 0, "`repeats` must be a positive int"),
        ("threads", 0, "`threads` must be a positive int or None"),
        ("pack_len", -1, "`pack_len` must be a positive int or None"),
        ("warmup_steps", -1, "`warmup_steps` must be an int >= 0"),
        ("lr", float("nan"), "`lr` must be a positive, finite float"),
        ("device", "tpu", "`device` must be auto, cpu or cuda"),
    ],
)
def test_bad_config_values_raise_before_any_work(field, value, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        run_throughput(SFTBenchConfig(**{field: value}), progress=False)


def test_result_keys_and_counts(result):
    assert set(result) == {
        "task",
        "config",
        "environment",
        "headline",
        "data",
        "modes",
        "ratios_vs_padded",
        "loss_equivalence",
        "model",
        "pass_flops",
    }
    assert list(result["modes"]) == list(MODES)
    pool = result["data"]
    assert pool["sequences"] == CONFIG.steps * CONFIG.batch_size
    seqs = synthetic_sequences(
        load_profile("gsm8k"), pool["sequences"], max_length=96, vocab_size=TINY["vocab_size"], seed=CONFIG.seed
    )
    assert pool["truncated"] == seqs.truncated and pool["longest"] == seqs.lengths.max()
    for mode, row in result["modes"].items():
        assert row["real_tokens"] == int(seqs.lengths.sum()), mode
        assert row["tokens_per_s"]["n"] == CONFIG.repeats
        assert row["tokens_per_cpu_s"]["n"] == CONFIG.repeats  # the tiny run is on the CPU
        assert row["seconds_per_step"]["n"] == CONFIG.repeats * row["optimizer_steps"]
        assert row["tokens_per_s"]["min"] <= row["tokens_per_s"]["median"] <= row["tokens_per_s"]["max"]
        assert len(row["losses"]) == row["optimizer_steps"] and row["collate_s"] > 0
        assert row["first_step_s"]["n"] == CONFIG.repeats and row["mfu"] is None  # no known peak on a CPU
        tflops, tps = row["model_tflops_per_s"]["median"], row["tokens_per_s"]["median"]
        assert tflops * 1e12 == pytest.approx(result["pass_flops"] * tps / row["real_tokens"], rel=1e-6)
    modes = result["modes"]
    assert modes["padded"]["optimizer_steps"] == modes["flattened"]["optimizer_steps"] == CONFIG.steps
    assert modes["padded"]["padding_fraction"] == pytest.approx(1 - padded_fill(seqs.lengths, batch_size=3))
    assert modes["padded_max"]["computed_tokens"] == CONFIG.steps * CONFIG.batch_size * 96
    assert modes["padded"]["attn"] == "sdpa" and modes["flattened"]["attn"] == "flatcollate"
    assert modes["flattened"]["padding_fraction"] == 0
    for key in ("tokens_per_s", "tokens_per_cpu_s"):
        assert result["ratios_vs_padded"]["padded"][key]["median"] == pytest.approx(1.0)
    ratio = result["ratios_vs_padded"]["flattened"]["tokens_per_s"]
    assert ratio["min"] <= ratio["median"] <= ratio["max"] and ratio["n"] == CONFIG.repeats


def test_a_run_without_padded_reports_no_ratio_and_no_headline(tmp_path):
    config = replace(CONFIG, modes=("flattened", "packed"), repeats=1)
    result = run_throughput(config, progress=False)
    assert result["ratios_vs_padded"] == {} and result["headline"] is None and result["loss_equivalence"] is None
    assert list(result["modes"]) == ["flattened", "packed"]
    text = summary_text(result)
    assert "padding of the padded batches" not in text and "x padded" in text  # the column is there, empty
    assert "| flattened |" in markdown_table(result) and "| - |" in markdown_table(result)
    assert [path.name for path in write_report(result, tmp_path)] == list(report_files(result))
    control = run_throughput(replace(config, modes=("padded", "flattened")), progress=False)
    assert control["headline"] is not None and "padding of the padded batches" in summary_text(control)


def test_padded_and_flattened_losses_coincide(result):
    equivalence = result["loss_equivalence"]
    assert equivalence["compared"] == ["padded", "flattened"]
    assert equivalence["max_abs_loss_diff"] <= 1e-5
    np.testing.assert_allclose(result["modes"]["padded"]["losses"], result["modes"]["padded_max"]["losses"], atol=1e-5)


def test_report_files(result, tmp_path):
    paths = write_report(result, tmp_path / "out")
    assert [p.name for p in paths] == list(report_files(result))
    assert report_files(result) == ("throughput.json", "throughput.md", "throughput.png", "throughput_loss_curves.png")
    assert all(p.stat().st_size > 0 for p in paths)
    assert json.loads(paths[0].read_text())["data"] == result["data"]
    table = markdown_table(result)
    assert [line.split("|")[1].strip() for line in table.splitlines()[2:]] == list(MODES)
    text = paths[1].read_text()
    assert text.count("| mode |") == 1  # the table once
    assert "model TFLOP/s" in text and "first step (s)" in text and "memory added by the pass" in text
    assert "step s " not in text


def test_peer_mode_is_transformers_own_padding_free_path(result):
    # It trains an unprepared model on transformers' collator; exact (use_cache=False, no mask): padded's losses.
    np.testing.assert_allclose(
        result["modes"]["hf_flattened"]["losses"], result["modes"]["padded"]["losses"], atol=1e-5
    )
    head = result["headline"]
    assert head["metric"] == "real tokens per CPU second"
    for key in ("flattened_vs_padded", "peer_vs_padded", "flattened_vs_peer"):
        assert head[key]["min"] <= head[key]["median"] <= head[key]["max"] and head[key]["n"] == CONFIG.repeats
    assert head["flattened_vs_padded"] == result["ratios_vs_padded"]["flattened"]["tokens_per_cpu_s"]
    lines = summary_text(result).splitlines()
    (headline_at,) = [i for i, line in enumerate(lines) if line.startswith("flatcollate (flattened) trains")]
    assert headline_at > max(i for i, line in enumerate(lines) if line.startswith("| "))  # after the table
    text = "\n".join(lines)
    assert "transformers' own padding-free path (hf_flattened)" in text


def test_cpu_runs_default_to_one_thread_and_restore_the_setting(result):
    assert result["environment"]["torch_threads"] == 1
    assert result["environment"]["device"] == cpu_name() != ""
    assert torch.get_num_threads() == THREADS_BEFORE
    for row in result["modes"].values():
        assert len(row["warm_up_passes"]) == CONFIG.repeats
        assert all(1 <= n <= MAX_SETTLE_PASSES for n in row["warm_up_passes"])
    assert result["environment"]["process_per_run"] is False  # in_process


def _runs(padded_s, flattened_s):
    """Per-repeat records as `run_pass` returns them, one step per pass."""
    return {
        "padded": [{"cpu_s": [s], "step_s": [s]} for s in padded_s],
        "flattened": [{"cpu_s": [s], "step_s": [s]} for s in flattened_s],
    }


def test_headline_is_flagged_when_repeats_disagree():
    steady = headline(_runs([3.0, 3.0, 3.0], [1.0, 1.02, 0.98]), torch.device("cpu"))
    assert steady["flattened_vs_padded"]["median"] == pytest.approx(3.0) and not steady["noisy"]
    assert steady["peer_vs_padded"] is None
    noisy = headline(_runs([3.0, 3.0, 3.0], [1.0, 2.7, 1.6]), torch.device("cpu"))
    assert noisy["noisy"] and noisy["relative_spread"] == pytest.approx((3.0 - 3.0 / 2.7) / (3.0 / 1.6))
    assert headline({"padded": []}, torch.device("cpu")) is None


def test_noisy_headline_prints_a_warning_with_what_to_do(result):
    quiet = headline_lines(result | {"headline": {**result["headline"], "noisy": False}})
    assert not any("WARNING" in line for line in quiet)
    loud = headline_lines(result | {"headline": {**result["headline"], "noisy": True, "relative_spread": 0.6}})
    assert any("WARNING: the repeats disagree by 60%" in line for line in loud)
    assert any("--repeats" in line and "--threads 1" in line for line in loud)


def test_summary_explains_the_padding_of_the_run_and_of_the_profile(result):
    data, padded = result["data"], result["modes"]["padded"]
    prompt, completion = load_profile("gsm8k").sample(PROFILE_DRAWS, seed=CONFIG.seed)
    cut = np.minimum(prompt + completion, CONFIG.max_length)
    assert data["profile_padding"] == pytest.approx(1 - padded_fill(cut, batch_size=CONFIG.batch_size))
    whole = 1 - padded_fill(prompt + completion, batch_size=CONFIG.batch_size)
    assert data["profile_padding_untruncated"] == pytest.approx(whole) != data["profile_padding"]  # some are cut
    text = summary_text(result)
    padding = f"{padded['padding_fraction']:.1%} for these sequences, {data['profile_padding']:.1%} over 20,000"
    assert f"padding of the padded batches: {padding}" in text
    assert f"without the cut to max_length: {whole:.1%}" in text


@pytest.mark.parametrize(
    ("pass_seconds", "passes"),
    [([1.0, 1.05], 2), ([1.0, 2.0, 4.0, 8.0], MAX_SETTLE_PASSES), ([1.0, 0.5, 0.52], 3), ([70.0, 1.0], 1)],
    ids=["settles", "never-settles", "settles-late", "over-the-time-limit"],
)
def test_settle_stops_when_two_passes_agree_or_at_its_limits(monkeypatch, pass_seconds, passes):
    seconds = iter(pass_seconds)

    def run_pass(steps, batches, *, device):
        return {"step_s": [next(seconds) / len(batches)] * len(batches)}

    monkeypatch.setattr(timing, "run_pass", run_pass)
    settled = timing.settle(None, ["batch"] * 3, device=torch.device("cpu"))
    assert settled["settle_passes"] == passes
    assert settled["first_step_s"] == pytest.approx(pass_seconds[0] / 3)
    assert settled["warm_up_s"] == pytest.approx(sum(pass_seconds[:passes]))


def test_cli_options_build_the_config():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(
        ["--set", "hidden_size=96", "--set", "rope_scaling=null", "--modes", "padded", "flattened"]
    )
    args.profile = "hh_rlhf"
    config = config_from_args(get_task("sft"), args)
    assert config.model_overrides["hidden_size"] == 96 and config.model_overrides["rope_scaling"] is None
    assert config.model_overrides["num_hidden_layers"] == SFTBenchConfig().model_overrides["num_hidden_layers"]
    assert config.modes == ("padded", "flattened") and config.profile == "hh_rlhf"
    with pytest.raises(ValueError, match="--set expects KEY=VALUE"):
        config_from_args(get_task("sft"), parser.parse_args(["--set", "hidden_size"]))


def test_cuda_memory_is_measured_when_available():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from flatcollate.bench.memory import PeakMemory

    meter = PeakMemory(torch.device("cuda"))
    meter.reset()
    block = torch.empty(2**20, device="cuda")
    assert meter.peak() - meter.baseline >= block.numel() * 4


def test_bench_is_a_flatcollate_subcommand():
    from flatcollate.cli import build_parser

    args = build_parser().parse_args(["bench", "--profile", "gsm8k", "--steps", "1"])
    config = config_from_args(get_task("sft"), args)
    assert callable(args.func) and config.steps == 1 and config.profile == "gsm8k"
    assert config == SFTBenchConfig(profile="gsm8k", steps=1)


def test_set_keys_are_checked_against_the_config(tmp_path):
    from flatcollate.bench.cli import validate
    from flatcollate.cli import UsageError

    config = SFTBenchConfig(model_overrides={**TINY, "hidden_sise": 256})
    with pytest.raises(UsageError, match="no attribute 'hidden_sise'; did you mean hidden_size"):
        validate(get_task("sft"), config, tmp_path)
    config = SFTBenchConfig(model_overrides={**TINY, "rms_norm_eps": 1e-5})
    validate(get_task("sft"), config, tmp_path)


def test_the_bench_command_trains_every_mode_in_its_own_process(tmp_path, capsys):
    """`flatcollate bench` measures as the published figures are measured: each (mode, repeat) a fresh process."""
    from flatcollate.cli import main

    argv = ["bench", "--steps", "1", "--repeats", "2", "--modes", "padded", "flattened", "--no-progress"]
    assert main([*argv, "--out-dir", str(tmp_path)]) in (0, None)
    result = json.loads((tmp_path / "throughput.json").read_text())
    assert result["environment"]["process_per_run"] is True
    out = capsys.readouterr().out
    assert "x padded" in out and "each run a fresh process" in out


def test_the_bench_command_refuses_batches_without_a_labelled_token(tmp_path, capsys):
    """Prompts longer than --max-length leave no completion: every mode's loss would be NaN and the loss comparison
    NaN; the command says so in one line before any training."""
    from flatcollate.cli import main

    argv = ["bench", "--profile", "gsm8k", "--max-length", "8", "--steps", "1", "--repeats", "1", "--no-progress"]
    assert main([*argv, "--out-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "step 0: no example of the batch keeps a labelled token" in err and "Raise --max-length" in err
    assert list(tmp_path.iterdir()) == []
