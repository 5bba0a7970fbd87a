"""The preference tasks (`flatcollate bench --task dpo|kto|reward|grpo`), what they share: a smoke run of both sides in
fresh processes at the smallest size reports every field, trains (or scores) the same steps with the same losses,
counts the padding of TRL's own batches and prints the command that reproduces it; the command line refuses in one
line, exit 2, before any work. The pairs and TRL's padding of them are tested in `test_pairs.py`, KTO's examples in
`test_kto.py`, the GRPO batches in `test_grpo.py`. No timing is asserted."""

import contextlib
import io
import json
import shlex
import sys

import numpy as np
import pytest
import torch

from flatcollate.bench.cli import command_line, config_from_args
from flatcollate.bench.config import PairBenchConfig, check_fields
from flatcollate.bench.harness import get_task
from flatcollate.bench.pairs import draw_pairs, padded_pair_tokens
from flatcollate.bench.report import report_files
from flatcollate.cli import build_parser, main

pytestmark = pytest.mark.slow

TASKS = ("dpo", "kto", "reward", "grpo")
TINY = ["hidden_size=32", "intermediate_size=64", "num_attention_heads=2", "num_key_value_heads=1", "head_dim=16"]
SMOKE = ["--steps", "2", "--warmup-steps", "1", "--repeats", "1", "--batch-size", "2", "--max-length", "128"]
SMOKE += [arg for item in TINY for arg in ("--set", item)]
RESULT_KEYS = {"task", "config", "environment", "model", "data", "modes", "ratios_vs_padded", "headline"}
RESULT_KEYS |= {"loss_equivalence", "pass_flops", "command"}


@pytest.fixture(scope="module", params=TASKS)
def smoke(request, tmp_path_factory):
    pytest.importorskip("trl")
    out = tmp_path_factory.mktemp(request.param)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(["bench", "--task", request.param, *SMOKE, "--no-progress", "--out-dir", str(out)])
    assert code == 0
    return request.param, json.loads((out / f"{request.param}.json").read_text()), printed.getvalue(), out


def test_smoke_run_reports_every_field(smoke):
    name, result, printed, out = smoke
    task = get_task(name)
    assert sorted(p.name for p in out.iterdir()) == sorted(report_files(result))
    assert set(result) == RESULT_KEYS and result["task"] == name
    assert list(result["modes"]) == ["padded", "flattened"]
    for row in result["modes"].values():
        assert row["tokens_per_s"]["n"] == 1 and row["tokens_per_s"]["median"] > 0
        assert row["peak_memory_bytes"] is None or row["peak_memory_bytes"] > 0
        assert row["first_step_s"]["n"] == 1 and row["model_tflops_per_s"]["median"] > 0
    assert result["modes"]["flattened"]["attn"] == "flatcollate" and result["modes"]["padded"]["attn"] == "sdpa"
    assert result["environment"]["process_per_run"] is True and result["model"]["hidden_size"] == 32
    assert f"trl.{task.baseline}" in printed and "| mode | real tokens/s" in printed
    assert f"command: `{result['command']}`" in printed
    # the headline rule of every benchmark: CPU seconds on a CPU, the median of the within-repeat ratios
    head = result["headline"]
    assert head["metric"] == "real tokens per CPU second" and head["flattened_vs_padded"]["n"] == 1
    expected = result["ratios_vs_padded"]["flattened"]["tokens_per_cpu_s"]["median"]
    assert head["flattened_vs_padded"]["median"] == pytest.approx(expected)
    headline = f"{task.subject} {task.verb} {expected:.2f}x the real tokens per CPU second of {task.baseline}"
    assert headline in printed


def test_smoke_run_steps_both_sides_alike(smoke):
    name, result, _, _ = smoke
    padded, flattened = result["modes"]["padded"], result["modes"]["flattened"]
    assert padded["optimizer_steps"] == flattened["optimizer_steps"] == 2
    # a TRL trainer records its warm-up step's loss too; the GRPO passes record the timed ones
    assert len(padded["losses"]) == len(flattened["losses"]) == (2 if name == "grpo" else 3)
    assert result["loss_equivalence"]["max_abs_loss_diff"] <= 1e-5


def test_smoke_run_padding_is_the_count_of_its_batches(smoke):
    name, result, _, _ = smoke
    task, config = get_task(name), PairBenchConfig(**result["config"])
    if name == "grpo":
        from flatcollate.bench.tasks.grpo import padded_grpo_tokens as layout
    elif name == "kto":
        from flatcollate.bench.tasks.kto import padded_kto_tokens as layout
    else:  # both pad each batch's 2N sequences to the longest (checked against TRL's collators in test_pairs.py)
        layout = padded_pair_tokens
    real, slots = layout(draw_pairs(config, whole=name in ("reward", "grpo")), batch_size=config.batch_size)
    real, slots = real[config.warmup_steps :].sum(), slots[config.warmup_steps :].sum()
    padded, flattened = result["modes"]["padded"], result["modes"]["flattened"]
    assert padded["real_tokens"] == flattened["real_tokens"] == real and padded["computed_tokens"] == slots
    assert padded["padding_fraction"] == pytest.approx(1 - real / slots) and flattened["padding_fraction"] == 0
    assert task.files == name


def test_the_printed_command_reproduces_the_config(smoke):
    name, result, _, out = smoke
    argv = shlex.split(result["command"])
    assert argv[:4] == ["flatcollate", "bench", "--task", name] and argv[-2:] == ["--out-dir", str(out)]
    again = config_from_args(get_task(name), build_parser().parse_args(argv[1:]))
    assert again == PairBenchConfig(**result["config"])


@pytest.mark.parametrize("name", TASKS)
def test_command_line_of_the_defaults_and_of_a_full_size_model(name):
    assert command_line(get_task(name), PairBenchConfig(), "out") == f"flatcollate bench --task {name} --out-dir out"
    config = PairBenchConfig(model="qwen2", tiny=False, model_overrides={"num_hidden_layers": 2}, lr=1e-5)
    command = command_line(get_task(name), config, "out dir")
    options = "--lr 1e-05 --model qwen2 --full-size --set num_hidden_layers=2 --out-dir 'out dir'"
    assert command == f"flatcollate bench --task {name} {options}"
    assert config_from_args(get_task(name), build_parser().parse_args(shlex.split(command)[1:])) == config


@pytest.mark.parametrize(
    ("field", "value"),
    [("steps", 0), ("batch_size", 0), ("repeats", 0), ("warmup_steps", -1), ("threads", 0), ("lr", float("nan"))],
)
def test_config_checks_name_the_field(field, value):
    with pytest.raises(ValueError, match=f"`{field}`"):
        check_fields(PairBenchConfig(**{field: value}))


# ---- the command line: one line, exit 2, before any work ------------------------------------------------------------

MISTAKES = [
    (["--steps", "0"], ["--steps", "'0'"]),
    (["--modes", "padded", "flattened"], ["--modes", "does not apply to --task {task}", "trl.{baseline}"]),
    (["--vision"], ["--vision", "--task {task}"]),
    (["--attn", "sdpa"], ["--attn", "--task {task}"]),
    (["--pack-len", "512"], ["--pack-len", "--task {task}"]),
    (["--max-images", "2"], ["--max-images", "--task {task}"]),
    (["--min-pixels", "3136"], ["--min-pixels", "--task {task}"]),
    (["--profile", "flan"], ["--profile flan", "pair profile", "hh_rlhf"]),
    (["--max-length", "4"], ["--max-length 4", "prompt"]),
    (["--set", "hidden_sise=64"], ["hidden_sise", "did you mean hidden_size"]),
    (["--set", "hidden_size=-1"], ["hidden_size", "positive integer"]),
    (["--set", "hidden_size"], ["KEY=VALUE"]),
    (["--model", "lama"], ["'lama'", "llama"]),
]


@pytest.mark.parametrize("name", TASKS)
@pytest.mark.parametrize(("argv", "fragments"), MISTAKES)
def test_mistakes_are_one_line_and_exit_2(name, argv, fragments, capsys, no_run, tmp_path):
    code = main(["bench", "--task", name, *argv, "--out-dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("flatcollate bench: error: "), err
    for fragment in fragments:
        assert fragment.format(task=name, baseline=get_task(name).baseline) in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["reward", "grpo"])
def test_a_max_length_no_whole_pair_fits_in_is_refused(name, capsys, no_run, tmp_path):
    # Control: DPO truncates what does not fit, so the same length is taken there (only its trl import is refused).
    assert main(["bench", "--task", name, "--max-length", "12", "--out-dir", str(tmp_path)]) == 2
    assert "--max-length 12" in capsys.readouterr().err
    with pytest.raises(AssertionError, match="ran despite a usage error"):
        main(["bench", "--task", "dpo", "--max-length", "12", "--out-dir", str(tmp_path)])


@pytest.mark.parametrize("name", TASKS)
def test_a_file_that_is_not_a_pair_profile_is_refused(name, capsys, no_run, tmp_path):
    lengths = tmp_path / "lengths.json"
    lengths.write_text('{"rows": [[3, 4], [5, 6]]}')
    code = main(["bench", "--task", name, "--profile", str(lengths), "--out-dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "is not a pair profile" in err and err.count("\n") == 1


@pytest.mark.parametrize("name", TASKS)
def test_cuda_and_the_output_folder_are_checked_first(name, capsys, no_run, tmp_path):
    a_file = tmp_path / "report.txt"
    a_file.write_text("")
    assert main(["bench", "--task", name, "--out-dir", str(a_file)]) == 2
    assert "not a folder" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert main(["bench", "--task", name, "--device", "cuda", "--out-dir", str(tmp_path)]) == 2
        assert "--device cuda" in capsys.readouterr().err


@pytest.mark.parametrize("name", TASKS)
def test_without_trl_it_says_to_install_it(name, capsys, no_run, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "trl", None)  # `import trl` raises ImportError, as where it is not installed
    assert main(["bench", "--task", name, "--out-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"trl.{get_task(name).baseline}" in err and "pip install trl" in err


@pytest.mark.parametrize("name", TASKS)
def test_a_trl_that_does_not_import_says_why(name, capsys, no_run, tmp_path, monkeypatch):
    # Found on the path but broken (built for another transformers): the run would fail in its first worker.
    (tmp_path / "site" / "trl").mkdir(parents=True)
    (tmp_path / "site" / "trl" / "__init__.py").write_text("raise ImportError('trl needs transformers>=99')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    for module in [module for module in sys.modules if module == "trl" or module.startswith("trl.")]:
        monkeypatch.delitem(sys.modules, module)
    assert main(["bench", "--task", name, "--out-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "trl needs transformers>=99" in err and err.count("\n") == 1, err


def test_smoke_run_what_each_task_adds(smoke):
    from flatcollate.bench.flops import training_flops

    name, result, _, _ = smoke
    padded = result["modes"]["padded"]
    if name == "dpo":  # the policy starts as its reference; the FLOPs count the reference's forward too
        from flatcollate.bench.pairs import timed_lengths

        assert abs(padded["losses"][0] - np.log(2)) < 1e-5
        assert result["environment"]["gradient_checkpointing"] in (True, False)
        config, model = PairBenchConfig(**result["config"]), result["model"]
        lengths = timed_lengths(config, draw_pairs(config))
        assert len(lengths) == 2 * config.steps * config.batch_size
        layers, width = model["num_hidden_layers"], model["num_attention_heads"] * 16  # head_dim=16
        linear = (result["pass_flops"] * 3 / 4 - training_flops(0, layers, width, lengths)) / (6 * lengths.sum())
        assert linear == pytest.approx(round(linear)) and 0 < linear < model["parameters"]
    elif name == "kto":  # the policy starts as its reference: rewards and KL are 0, the loss 1 - sigmoid(0)
        from flatcollate.bench.tasks.kto import unpaired_lengths

        assert padded["losses"][0] == pytest.approx(0.5, abs=1e-6)
        config, model = PairBenchConfig(**result["config"]), result["model"]
        prompt, completion, kl = unpaired_lengths(draw_pairs(config), batch_size=config.batch_size)
        timed = slice(2 * config.warmup_steps * config.batch_size, None)
        trained, kl = (np.minimum(prompt + c, config.max_length)[timed] for c in (completion, kl))
        layers, width = model["num_hidden_layers"], model["num_attention_heads"] * 16  # head_dim=16
        # policy: forward and backward on the completions, a forward on the KL ones; reference: a forward on both
        attention = training_flops(0, layers, width, trained) * 4 / 3 + training_flops(0, layers, width, kl) * 2 / 3
        linear = (result["pass_flops"] - attention) / (6 * (trained.sum() * 4 / 3 + kl.sum() * 2 / 3))
        assert linear == pytest.approx(round(linear)) and 0 < linear < model["parameters"]
    elif name == "reward":  # RewardTrainer drops pairs that do not fit: only whole pairs are drawn
        assert result["data"]["truncated"] == 0
    else:  # the GRPO passes warm up as the SFT steps do (timing.timed_pass)
        assert all(n >= 1 for row in result["modes"].values() for n in row["warm_up_passes"])
