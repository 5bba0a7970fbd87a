"""The DPO benchmark (`flatcollate bench --task dpo`): the HH-RLHF pair profile, the padding count of DPOTrainer's
batches, a smoke run of both trainers in fresh processes at the smallest size, and the command line's one-line
errors. No timing is asserted."""

import gzip
import json
import shlex
import sys

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from flatcollate.bench import harness
from flatcollate.bench.cli import command_line, config_from_args
from flatcollate.bench.config import PairBenchConfig, check_fields
from flatcollate.bench.harness import get_task
from flatcollate.bench.pairs import draw_pairs, padded_pair_tokens
from flatcollate.bench.report import report_files
from flatcollate.cli import build_parser, main
from flatcollate.profiles import available_pair_profiles, available_profiles
from flatcollate.profiles.make import make_pair_profiles
from flatcollate.profiles.pair_profile import load_pair_profile, split_pair
from flatcollate.synthetic import PairDraw

TINY = ["hidden_size=32", "intermediate_size=64", "num_attention_heads=2", "num_key_value_heads=1", "head_dim=16"]
SMOKE = ["--steps", "2", "--warmup-steps", "1", "--repeats", "1", "--batch-size", "2", "--max-length", "128"]
SMOKE += [arg for item in TINY for arg in ("--set", item)]

# ---- the pair profile -----------------------------------------------------------------------------------------------


def test_the_hh_rlhf_pair_profile_ships_apart_from_the_sft_profiles():
    assert available_pair_profiles() == ["hh_rlhf"]
    assert "pairs" not in available_profiles()
    profile = load_pair_profile("hh_rlhf")
    assert profile.num_rows == 2307 and "qwen2.5-instruct" in profile.source and "2312 pairs" in profile.source
    assert profile.prompt.dtype == np.int64 and (profile.prompt > 0).all()
    assert (profile.chosen >= 0).all() and (profile.rejected >= 0).all()


def test_the_committed_pair_profile_is_what_the_script_writes(shared_data, tmp_path):
    (path,) = make_pair_profiles(shared_data, tmp_path)
    assert json.loads(path.read_text()) == load_pair_profile("hh_rlhf").to_dict()


def test_pair_lengths_against_a_per_pair_loop(shared_data, tokenizer_dir):
    """The first 40 usable pairs, split and tokenized one at a time, give the profile's first 40 rows."""
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir("qwen2.5-instruct"))
    expected = []
    with gzip.open(shared_data / "datasets" / "hh_rlhf_harmless_base_test.jsonl.gz", "rt") as lines:
        for line in lines:
            row = json.loads(line)
            head, _, chosen = row["chosen"].rpartition("\n\nAssistant:")
            other, _, rejected = row["rejected"].rpartition("\n\nAssistant:")
            if head != other:
                continue
            texts = (head + "\n\nAssistant:", chosen, rejected)
            expected.append([len(tokenizer(text, add_special_tokens=False)["input_ids"]) for text in texts])
            if len(expected) == 40:
                break
    profile = load_pair_profile("hh_rlhf")
    got = np.stack([profile.prompt, profile.chosen, profile.rejected], axis=1)[:40]
    assert got.tolist() == expected


def test_split_pair_needs_a_shared_head():
    assert split_pair("\n\nHuman: a\n\nAssistant: b", "\n\nHuman: a\n\nAssistant: c") == (
        "\n\nHuman: a\n\nAssistant:",
        " b",
        " c",
    )
    assert split_pair("\n\nHuman: a\n\nAssistant: b", "\n\nHuman: x\n\nAssistant: c") is None
    assert split_pair("\n\nHuman: a", "\n\nHuman: a\n\nAssistant: c") is None


def test_pair_profile_files_load_and_bad_ones_say_what_a_pair_profile_is(tmp_path):
    profile = load_pair_profile("hh_rlhf")
    profile.save(tmp_path / "mine.json")
    assert load_pair_profile(tmp_path / "mine.json").to_dict() == profile.to_dict()
    (tmp_path / "rows.json").write_text('{"rows": [[1, 2]]}')
    for bad in ("flan", tmp_path / "rows.json", tmp_path / "missing.json"):
        with pytest.raises(ValueError, match="pair profile"):
            load_pair_profile(bad)


def test_draws_are_seeded_and_leave_out_prompts_that_fill_max_length():
    config = PairBenchConfig(max_length=64, steps=50, batch_size=4)
    draw = draw_pairs(config)
    again = draw_pairs(config)
    assert draw.prompt.size == 51 * 4 and (draw.prompt < 64).all()
    np.testing.assert_array_equal(draw.chosen, again.chosen)
    chosen, _ = draw.sequence_lengths()
    assert chosen.max() <= 64 and (chosen == np.minimum(draw.prompt + draw.chosen + 1, 64)).all()
    assert draw.truncated == int(
        (draw.prompt + draw.chosen + 1 > 64).sum() + (draw.prompt + draw.rejected + 1 > 64).sum()
    )


# ---- the padding of DPOTrainer's batches ----------------------------------------------------------------------------


def test_padding_of_a_small_batch_by_hand():
    """Pairs (prompt, chosen, rejected) = (3, 1, 2), (1, 1, 1), (2, 4, 1), batch 2, max_length 6; + 1 eos per reply:
    batch 0 sequences 5 3 | 6 3 -> 4 x 6 = 24 slots, 17 real; batch 1 sequences 6 (7 cut to 6) | 4 -> 2 x 6, 10 real."""
    draw = PairDraw(np.array([3, 1, 2]), np.array([1, 1, 4]), np.array([2, 1, 1]), max_length=6)
    real, slots = padded_pair_tokens(*draw.sequence_lengths(), batch_size=2)
    assert real.tolist() == [17, 10] and slots.tolist() == [24, 12]
    assert draw.truncated == 1
    assert 1 - real.sum() / slots.sum() == pytest.approx(9 / 36)


def test_padding_is_what_trls_collator_pads():
    trl = pytest.importorskip("trl")
    rng = np.random.default_rng(0)
    draw = PairDraw(*(rng.integers(low, 30, size=7) for low in (1, 0, 0)), max_length=24)
    chosen, rejected = draw.sequence_lengths()
    collator = trl.trainer.dpo_trainer.DataCollatorForPreference(pad_token_id=0, max_length=24)
    real, slots = padded_pair_tokens(chosen, rejected, batch_size=3)
    for index, start in enumerate(range(0, 7, 3)):
        examples = [
            {"prompt_ids": [1] * int(p), "chosen_ids": [2] * (int(c) + 1), "rejected_ids": [3] * (int(r) + 1)}
            for p, c, r in zip(*(a[start : start + 3] for a in (draw.prompt, draw.chosen, draw.rejected)), strict=True)
        ]
        batch = collator(examples)
        assert batch["attention_mask"].sum() == real[index] and batch["input_ids"].numel() == slots[index]


# ---- a smoke run: both trainers, fresh processes, the smallest size -------------------------------------------------


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    pytest.importorskip("trl")
    out = tmp_path_factory.mktemp("dpo")
    import contextlib
    import io

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(["bench", "--task", "dpo", *SMOKE, "--no-progress", "--out-dir", str(out)])
    assert code == 0
    return json.loads((out / "dpo.json").read_text()), printed.getvalue(), out


RESULT_KEYS = {"task", "config", "environment", "model", "data", "modes", "ratios_vs_padded", "headline"}
RESULT_KEYS |= {"loss_equivalence", "pass_flops", "command"}


def test_smoke_run_reports_every_field(smoke):
    result, printed, out = smoke
    assert sorted(p.name for p in out.iterdir()) == sorted(report_files(result))
    assert set(result) == RESULT_KEYS and result["task"] == "dpo"
    assert list(result["modes"]) == ["padded", "flattened"]
    for row in result["modes"].values():
        assert row["tokens_per_s"]["n"] == 1 and row["tokens_per_s"]["median"] > 0
        assert row["peak_memory_bytes"] is None or row["peak_memory_bytes"] > 0
        assert row["first_step_s"]["n"] == 1 and row["model_tflops_per_s"]["median"] > 0
    assert result["modes"]["flattened"]["attn"] == "flatcollate" and result["modes"]["padded"]["attn"] == "sdpa"
    assert result["environment"]["process_per_run"] is True and result["model"]["hidden_size"] == 32
    assert result["environment"]["gradient_checkpointing"] in (True, False)
    assert "| mode | real tokens/s" in printed and f"command: `{result['command']}`" in printed
    # the headline rule of every benchmark: CPU seconds on a CPU, the median of the within-repeat ratios
    head = result["headline"]
    assert head["metric"] == "real tokens per CPU second" and head["flattened_vs_padded"]["n"] == 1
    expected = result["ratios_vs_padded"]["flattened"]["tokens_per_cpu_s"]["median"]
    assert head["flattened_vs_padded"]["median"] == pytest.approx(expected)
    assert f"FlatDPOTrainer trains {expected:.2f}x the real tokens per CPU second of DPOTrainer" in printed


def test_pass_flops_count_the_timed_sequences_and_the_reference_forward(smoke):
    from flatcollate.bench.flops import training_flops
    from flatcollate.bench.pairs import timed_lengths

    result, _, _ = smoke
    config, model = PairBenchConfig(**result["config"]), result["model"]
    lengths = timed_lengths(config, draw_pairs(config))
    assert len(lengths) == 2 * config.steps * config.batch_size
    layers, width = model["num_hidden_layers"], model["num_attention_heads"] * 16  # head_dim=16
    linear = (result["pass_flops"] * 3 / 4 - training_flops(0, layers, width, lengths)) / (6 * lengths.sum())
    assert linear == pytest.approx(round(linear)) and 0 < linear < model["parameters"]


def test_smoke_run_trains_both_trainers_alike(smoke):
    result, _, _ = smoke
    padded, flattened = result["modes"]["padded"], result["modes"]["flattened"]
    assert padded["optimizer_steps"] == flattened["optimizer_steps"] == 2
    assert len(padded["losses"]) == len(flattened["losses"]) == 3  # the warm-up step's loss too
    assert result["loss_equivalence"]["max_abs_loss_diff"] <= 1e-5
    assert abs(padded["losses"][0] - np.log(2)) < 1e-5  # the policy starts as its reference


def test_smoke_run_padding_is_the_count_of_its_batches(smoke):
    result, _, _ = smoke
    config = PairBenchConfig(**result["config"])
    real, slots = padded_pair_tokens(*draw_pairs(config).sequence_lengths(), batch_size=config.batch_size)
    real, slots = real[config.warmup_steps :].sum(), slots[config.warmup_steps :].sum()
    padded, flattened = result["modes"]["padded"], result["modes"]["flattened"]
    assert padded["real_tokens"] == flattened["real_tokens"] == real and padded["computed_tokens"] == slots
    assert padded["padding_fraction"] == pytest.approx(1 - real / slots) and flattened["padding_fraction"] == 0


def test_the_printed_command_reproduces_the_config(smoke):
    result, _, out = smoke
    argv = shlex.split(result["command"])
    assert argv[:4] == ["flatcollate", "bench", "--task", "dpo"] and argv[-2:] == ["--out-dir", str(out)]
    assert config_from_args(get_task("dpo"), build_parser().parse_args(argv[1:])) == PairBenchConfig(**result["config"])


def test_command_line_of_a_full_size_model():
    config = PairBenchConfig(model="qwen2", tiny=False, model_overrides={"num_hidden_layers": 2}, lr=1e-5)
    command = command_line(get_task("dpo"), config, "out dir")
    options = "--lr 1e-05 --model qwen2 --full-size --set num_hidden_layers=2 --out-dir 'out dir'"
    assert command == f"flatcollate bench --task dpo {options}"
    assert config_from_args(get_task("dpo"), build_parser().parse_args(shlex.split(command)[1:])) == config


@pytest.mark.parametrize(
    ("field", "value"),
    [("steps", 0), ("batch_size", 0), ("repeats", 0), ("warmup_steps", -1), ("threads", 0), ("lr", float("nan"))],
)
def test_config_checks_name_the_field(field, value):
    with pytest.raises(ValueError, match=f"`{field}`"):
        check_fields(PairBenchConfig(**{field: value}))


# ---- the command line: one line, exit 2, before any work ------------------------------------------------------------


@pytest.fixture
def no_run(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the benchmark ran despite a usage error")

    monkeypatch.setattr(harness, "run_bench", refuse)


@pytest.mark.parametrize(
    ("argv", "fragments"),
    [
        (["--task", "ppo"], ["--task", "invalid choice", "'ppo'"]),
        (["--steps", "0"], ["--steps", "'0'"]),
        (["--modes", "padded", "flattened"], ["--modes", "does not apply to --task dpo"]),
        (["--vision"], ["--vision", "--task dpo"]),
        (["--attn", "sdpa"], ["--attn", "--task dpo"]),
        (["--pack-len", "512"], ["--pack-len", "--task dpo"]),
        (["--max-images", "2"], ["--max-images", "--task dpo"]),
        (["--profile", "flan"], ["--profile flan", "pair profile", "hh_rlhf"]),
        (["--max-length", "4"], ["--max-length 4", "prompt"]),
        (["--set", "hidden_sise=64"], ["hidden_sise", "did you mean hidden_size"]),
        (["--set", "hidden_size=-1"], ["hidden_size", "positive integer"]),
        (["--set", "hidden_size"], ["KEY=VALUE"]),
        (["--model", "lama"], ["'lama'", "llama"]),
    ],
)
def test_dpo_mistakes_are_one_line_and_exit_2(argv, fragments, capsys, no_run, tmp_path):
    code = main(["bench", "--task", "dpo", *argv, "--out-dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("flatcollate bench: error: "), err
    for fragment in fragments:
        assert fragment in err, err


def test_dpo_refuses_a_file_that_is_not_a_pair_profile(capsys, no_run, tmp_path):
    lengths = tmp_path / "lengths.json"
    lengths.write_text('{"rows": [[3, 4], [5, 6]]}')
    code = main(["bench", "--task", "dpo", "--profile", str(lengths), "--out-dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "is not a pair profile" in err and err.count("\n") == 1


def test_dpo_checks_cuda_and_the_output_folder_first(capsys, no_run, tmp_path):
    a_file = tmp_path / "report.txt"
    a_file.write_text("")
    assert main(["bench", "--task", "dpo", "--out-dir", str(a_file)]) == 2
    assert "not a folder" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert main(["bench", "--task", "dpo", "--device", "cuda", "--out-dir", str(tmp_path)]) == 2
        assert "--device cuda" in capsys.readouterr().err


def test_dpo_without_trl_says_to_install_it(capsys, no_run, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "trl", None)  # `import trl` raises ImportError, as where it is not installed
    assert main(["bench", "--task", "dpo", "--out-dir", str(tmp_path)]) == 2
    assert "pip install trl" in capsys.readouterr().err


def test_dpo_with_a_trl_that_does_not_import_says_why(capsys, no_run, tmp_path, monkeypatch):
    # Found on the path but broken (built for another transformers): the run would fail in its first worker.
    (tmp_path / "site" / "trl").mkdir(parents=True)
    (tmp_path / "site" / "trl" / "__init__.py").write_text("raise ImportError('trl needs transformers>=99')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    for name in [name for name in sys.modules if name == "trl" or name.startswith("trl.")]:
        monkeypatch.delitem(sys.modules, name)
    assert main(["bench", "--task", "dpo", "--out-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "trl needs transformers>=99" in err and err.count("\n") == 1, err
