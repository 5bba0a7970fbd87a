"""Bookkeeping of the throughput benchmark on a tiny run: tokens, padding, step counts, JSON keys, report files."""

import argparse
import json

import numpy as np
import pytest
import torch

import flatcollate
from flatcollate.bench import batches as batches_module
from flatcollate.bench import throughput as throughput_module
from flatcollate.bench.batches import (
    MODES,
    pad_batch,
    padded_fill,
    real_tokens,
    slot_tokens,
    step_batches,
    synthetic_sequences,
)
from flatcollate.bench.cli import add_arguments, config_from_args
from flatcollate.bench.profiles import LengthProfile, load_profile
from flatcollate.bench.report import REPORT_FILES, markdown_table, write_report
from flatcollate.bench.throughput import ThroughputConfig, run_throughput

TINY = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 16,
    "vocab_size": 64,
}
CONFIG = ThroughputConfig(
    model_overrides=TINY, profile="gsm8k", batch_size=3, max_length=96, steps=3, warmup_steps=1, repeats=2
)


@pytest.fixture(scope="module")
def result():
    return run_throughput(CONFIG, progress=False)


def _pool(n=11, max_length=40, seed=0):
    profile = LengthProfile.from_lengths([0, 1, 5, 30, 60], [1, 0, 7, 20, 3], name="edges")
    return synthetic_sequences(profile, n, max_length=max_length, vocab_size=50, seed=seed)


def test_synthetic_sequences_against_a_per_sequence_loop():
    prompt, completion = LengthProfile.from_lengths([0, 1, 5, 30, 60], [1, 0, 7, 20, 3], name="edges").sample(
        11, seed=0
    )
    seqs = _pool()
    np.testing.assert_array_equal(seqs.lengths, np.minimum(prompt + completion, 40))
    assert seqs.truncated == int((prompt + completion > 40).sum())
    for i, (start, end) in enumerate(zip(seqs.offsets[:-1], seqs.offsets[1:], strict=True)):
        expected = seqs.tokens[start:end].copy()
        expected[: prompt[i]] = -100
        np.testing.assert_array_equal(seqs.labels[start:end], expected)
    assert seqs.tokens.min() >= 1 and seqs.tokens.max() < 50


def test_pad_batch_against_a_per_sequence_loop():
    seqs = _pool()
    indices = np.array([4, 0, 7])
    batch = pad_batch(seqs, indices, pad_to=40)
    for row, i in enumerate(indices):
        n = seqs.lengths[i]
        ids = seqs.tokens[seqs.offsets[i] : seqs.offsets[i + 1]]
        assert batch["input_ids"][row, :n].tolist() == ids.tolist()
        assert (batch["input_ids"][row, n:] == 0).all() and (batch["labels"][row, n:] == -100).all()
        assert batch["attention_mask"][row].tolist() == [1] * n + [0] * (40 - n)
    assert real_tokens(batch) == int(seqs.lengths[indices].sum()) and slot_tokens(batch) == 3 * 40
    with pytest.raises(ValueError, match="shorter than the longest"):
        pad_batch(seqs, indices, pad_to=1)


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
        if mode in ("flattened", "packed"):
            assert all("attention_mask" not in b for b in built)
            assert sum(len(b["cu_seq_lens_q"]) - 1 for b in built) == len(seqs.lengths)
        if mode == "packed":
            assert all(b["input_ids"].shape[1] <= 64 for b in built)
    assert counts["padded"] == counts["padded_max"] == counts["flattened"] == -(-len(seqs.lengths) // batch_size)


def test_unknown_mode():
    with pytest.raises(ValueError, match="Unknown mode 'unpadded'"):
        step_batches(_pool(), "unpadded", batch_size=2, max_length=40, pack_len=64, flattening_collator=None)
    with pytest.raises(ValueError, match=r"Unknown mode\(s\) \['x'\]"):
        run_throughput(ThroughputConfig(modes=("padded", "x")), progress=False)


def test_result_keys_and_counts(result):
    assert set(result) == {"config", "environment", "pool", "modes", "ratios_vs_padded", "loss_equivalence", "skipped"}
    assert list(result["modes"]) == list(MODES)
    pool = result["pool"]
    assert pool["sequences"] == CONFIG.steps * CONFIG.batch_size
    seqs = synthetic_sequences(
        load_profile("gsm8k"), pool["sequences"], max_length=96, vocab_size=TINY["vocab_size"], seed=CONFIG.seed
    )
    assert pool["real_tokens"] == int(seqs.lengths.sum()) and pool["truncated"] == seqs.truncated
    for mode, row in result["modes"].items():
        assert row["real_tokens_per_epoch"] == pool["real_tokens"], mode
        assert row["tokens_per_s"]["n"] == CONFIG.repeats
        assert row["tokens_per_cpu_s"]["n"] == CONFIG.repeats  # the tiny run is on the CPU
        assert row["step_s"]["n"] == CONFIG.repeats * row["steps_per_epoch"]
        assert row["tokens_per_s"]["min"] <= row["tokens_per_s"]["median"] <= row["tokens_per_s"]["max"]
        assert len(row["losses"]) == row["steps_per_epoch"]
    modes = result["modes"]
    assert modes["padded"]["steps_per_epoch"] == modes["flattened"]["steps_per_epoch"] == CONFIG.steps
    assert modes["padded"]["padding_fraction"] == pytest.approx(1 - padded_fill(seqs.lengths, batch_size=3))
    assert modes["padded_max"]["computed_tokens_per_epoch"] == CONFIG.steps * CONFIG.batch_size * 96
    assert modes["flattened"]["padding_fraction"] == 0
    for key in ("tokens_per_s", "tokens_per_cpu_s"):
        assert result["ratios_vs_padded"]["padded"][key]["median"] == pytest.approx(1.0)
    ratio = result["ratios_vs_padded"]["flattened"]["tokens_per_s"]
    assert ratio["min"] <= ratio["median"] <= ratio["max"] and ratio["n"] == CONFIG.repeats


def test_padded_and_flattened_losses_coincide(result):
    equivalence = result["loss_equivalence"]
    assert equivalence["compared"] == ["padded", "flattened"]
    assert equivalence["max_abs_loss_diff"] <= 1e-5
    np.testing.assert_allclose(result["modes"]["padded"]["losses"], result["modes"]["padded_max"]["losses"], atol=1e-5)


def test_report_files(result, tmp_path):
    paths = write_report(result, tmp_path / "out")
    assert [p.name for p in paths] == list(REPORT_FILES)
    assert all(p.stat().st_size > 0 for p in paths)
    assert json.loads(paths[0].read_text())["pool"] == result["pool"]
    table = markdown_table(result)
    assert [line.split("|")[1].strip() for line in table.splitlines()[2:]] == list(MODES)
    assert "optimizer steps per epoch: padded 3" in paths[1].read_text()


def test_packed_mode_is_skipped_without_packing(monkeypatch):
    monkeypatch.setattr(throughput_module, "has_packing", lambda: False)
    config = ThroughputConfig(
        model_overrides=TINY, profile="gsm8k", batch_size=2, max_length=32, steps=1, warmup_steps=0, repeats=1
    )
    result = run_throughput(config, progress=False)
    assert "packed" not in result["modes"] and "packed" in result["skipped"]


def test_has_packing_detects_the_module():
    assert batches_module.has_packing() is True


def test_cli_options_build_the_config():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(
        ["--set", "hidden_size=96", "--set", "rope_scaling=null", "--modes", "padded", "flattened"]
    )
    config = config_from_args(args, profile="hh_rlhf")
    assert config.model_overrides["hidden_size"] == 96 and config.model_overrides["rope_scaling"] is None
    assert config.model_overrides["num_hidden_layers"] == ThroughputConfig().model_overrides["num_hidden_layers"]
    assert config.modes == ("padded", "flattened") and config.profile == "hh_rlhf"
    with pytest.raises(ValueError, match="--set expects KEY=VALUE"):
        config_from_args(parser.parse_args(["--set", "hidden_size"]), profile="flan")


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
    config = config_from_args(args, profile=args.profile)
    assert callable(args.func) and config.steps == 1 and config.profile == "gsm8k"
    assert config == ThroughputConfig(profile="gsm8k", steps=1)
