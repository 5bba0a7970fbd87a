"""The reward benchmark (`flatcollate bench --task reward`): pairs drawn whole, their texts, a smoke run of both
trainers in fresh processes at the smallest size, and the command line's one-line errors. No timing is asserted."""

import contextlib
import io
import json
import shlex
import sys

import numpy as np
import pytest
import torch

from flatcollate.bench import harness
from flatcollate.bench.cli import command_line, config_from_args
from flatcollate.bench.config import PairBenchConfig
from flatcollate.bench.harness import get_task
from flatcollate.bench.pairs import draw_pairs, padded_pair_tokens
from flatcollate.bench.report import report_files
from flatcollate.cli import build_parser, main
from flatcollate.profiles.pair_profile import load_pair_profile
from flatcollate.synthetic import PairDraw

TINY = ["hidden_size=32", "intermediate_size=64", "num_attention_heads=2", "num_key_value_heads=1", "head_dim=16"]
SMOKE = ["--steps", "2", "--warmup-steps", "1", "--repeats", "1", "--batch-size", "2", "--max-length", "128"]
SMOKE += [arg for item in TINY for arg in ("--set", item)]

# ---- the pairs ------------------------------------------------------------------------------------------------------


def test_whole_draws_keep_only_pairs_that_fit_and_are_seeded():
    config = PairBenchConfig(max_length=64, steps=50, batch_size=4)
    draw = draw_pairs(config, whole=True)
    assert draw.prompt.size == 51 * 4 and draw.truncated == 0
    assert (draw.prompt + np.maximum(draw.chosen, draw.rejected) + 1 <= 64).all()
    np.testing.assert_array_equal(draw.rejected, draw_pairs(config, whole=True).rejected)


def test_a_max_length_no_pair_fits_in_names_the_shortest():
    profile = load_pair_profile("hh_rlhf")
    shortest = int((profile.prompt + np.maximum(profile.chosen, profile.rejected)).min())
    with pytest.raises(ValueError, match=f"shortest has {shortest}"):
        draw_pairs(PairBenchConfig(max_length=shortest), whole=True)


def test_padding_is_what_trls_reward_collator_pads():
    trl = pytest.importorskip("trl")
    rng = np.random.default_rng(0)
    draw = PairDraw(*(rng.integers(low, 30, size=7) for low in (1, 0, 0)), max_length=100)
    chosen, rejected = draw.sequence_lengths()
    collator = trl.trainer.reward_trainer.DataCollatorForPreference(pad_token_id=0)
    real, slots = padded_pair_tokens(chosen, rejected, batch_size=3)
    for index, start in enumerate(range(0, 7, 3)):
        examples = [
            {"chosen_ids": [2] * int(c), "rejected_ids": [3] * int(r)}
            for c, r in zip(chosen[start : start + 3], rejected[start : start + 3], strict=True)
        ]
        batch = collator(examples)
        assert batch["attention_mask"].sum() == real[index] and batch["input_ids"].numel() == slots[index]


# ---- a smoke run: both trainers, fresh processes, the smallest size -------------------------------------------------


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    pytest.importorskip("trl")
    out = tmp_path_factory.mktemp("reward")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(["bench", "--task", "reward", *SMOKE, "--no-progress", "--out-dir", str(out)])
    assert code == 0
    return json.loads((out / "reward.json").read_text()), printed.getvalue(), out


def test_smoke_run_reports_every_field(smoke):
    result, printed, out = smoke
    assert sorted(p.name for p in out.iterdir()) == sorted(report_files(result))
    assert set(result) == {"task", "config", "environment", "model", "data", "modes", "ratios_vs_padded"} | {
        "headline",
        "loss_equivalence",
        "pass_flops",
        "command",
    }
    assert result["task"] == "reward" and list(result["modes"]) == ["padded", "flattened"]
    for row in result["modes"].values():
        assert row["tokens_per_s"]["n"] == 1 and row["tokens_per_s"]["median"] > 0
        assert row["peak_memory_bytes"] is None or row["peak_memory_bytes"] > 0
    ratio = result["ratios_vs_padded"]["flattened"]["tokens_per_cpu_s"]
    assert ratio["n"] == 1 and ratio["median"] == result["headline"]["flattened_vs_padded"]["median"]
    assert result["environment"]["process_per_run"] is True and result["model"]["hidden_size"] == 32
    assert "trl.RewardTrainer" in printed and "FlatRewardTrainer trains" in printed
    assert f"command: `{result['command']}`" in printed and "DPO" not in printed


def test_smoke_run_trains_both_trainers_alike(smoke):
    result, _, _ = smoke
    padded, flattened = result["modes"]["padded"], result["modes"]["flattened"]
    assert padded["optimizer_steps"] == flattened["optimizer_steps"] == 2
    assert len(padded["losses"]) == len(flattened["losses"]) == 3
    assert result["loss_equivalence"]["max_abs_loss_diff"] <= 1e-5
    assert result["data"]["truncated_sequences"] == 0


def test_smoke_run_padding_is_the_count_of_its_batches(smoke):
    result, _, _ = smoke
    config = PairBenchConfig(**result["config"])
    draw = draw_pairs(config, whole=True)
    real, slots = padded_pair_tokens(*draw.sequence_lengths(), batch_size=config.batch_size)
    real, slots = real[config.warmup_steps :].sum(), slots[config.warmup_steps :].sum()
    padded, flattened = result["modes"]["padded"], result["modes"]["flattened"]
    assert padded["real_tokens"] == flattened["real_tokens"] == real and padded["computed_tokens"] == slots
    assert padded["padding_fraction"] == pytest.approx(1 - real / slots) and flattened["padding_fraction"] == 0


def test_the_printed_command_reproduces_the_config(smoke):
    result, _, out = smoke
    argv = shlex.split(result["command"])
    assert argv[:4] == ["flatcollate", "bench", "--task", "reward"] and argv[-2:] == ["--out-dir", str(out)]
    again = config_from_args(get_task("reward"), build_parser().parse_args(argv[1:]))
    assert again == PairBenchConfig(**result["config"])


def test_command_line_of_the_defaults():
    command = command_line(get_task("reward"), PairBenchConfig(), "out")
    assert command == "flatcollate bench --task reward --out-dir out"


# ---- the command line: one line, exit 2, before any work ------------------------------------------------------------


@pytest.fixture
def no_run(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the benchmark ran despite a usage error")

    monkeypatch.setattr(harness, "run_bench", refuse)


@pytest.mark.parametrize(
    ("argv", "fragments"),
    [
        (["--steps", "0"], ["--steps", "'0'"]),
        (["--modes", "padded", "flattened"], ["--modes", "does not apply to --task reward", "trl.RewardTrainer"]),
        (["--vision"], ["--vision", "--task reward"]),
        (["--attn", "sdpa"], ["--attn", "--task reward"]),
        (["--pack-len", "512"], ["--pack-len", "--task reward"]),
        (["--profile", "flan"], ["--profile flan", "pair profile", "hh_rlhf"]),
        (["--max-length", "4"], ["--max-length 4", "prompt"]),
        (["--max-length", "12"], ["--max-length 12", "RewardTrainer drops longer pairs"]),
        (["--set", "hidden_sise=64"], ["hidden_sise", "did you mean hidden_size"]),
        (["--model", "lama"], ["'lama'", "llama"]),
    ],
)
def test_reward_mistakes_are_one_line_and_exit_2(argv, fragments, capsys, no_run, tmp_path):
    code = main(["bench", "--task", "reward", *argv, "--out-dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("flatcollate bench: error: "), err
    for fragment in fragments:
        assert fragment in err, err


def test_reward_checks_cuda_and_the_output_folder_first(capsys, no_run, tmp_path):
    a_file = tmp_path / "report.txt"
    a_file.write_text("")
    assert main(["bench", "--task", "reward", "--out-dir", str(a_file)]) == 2
    assert "not a folder" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert main(["bench", "--task", "reward", "--device", "cuda", "--out-dir", str(tmp_path)]) == 2
        assert "--device cuda" in capsys.readouterr().err


def test_reward_without_trl_says_to_install_it(capsys, no_run, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "trl", None)  # `import trl` raises ImportError, as where it is not installed
    assert main(["bench", "--task", "reward", "--out-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "trl.RewardTrainer" in err and "pip install trl" in err
