"""The one benchmark harness: a task is one module the harness finds, the summary and report are the same for every
task, the timers (CUDA events stood in for on a CPU), and the command line that reproduces every task's config."""

import json
import shlex
import textwrap
import typing
from types import SimpleNamespace

import pytest
import torch

from flatcollate.bench import harness, tasks, timing
from flatcollate.bench.cli import command_line, config_from_args
from flatcollate.bench.config import PairBenchConfig, SFTBenchConfig
from flatcollate.bench.harness import get_task, in_process, run_bench, task_names
from flatcollate.bench.report import report_files, summary_text, write_report
from flatcollate.cli import UsageError, build_parser

TOY = '''
"""A task that trains nothing: its steps take the seconds its config says, so every figure is known."""

from dataclasses import dataclass

from flatcollate.bench.harness import Task, Workload, sequence_data


@dataclass(frozen=True)
class ToyConfig:
    profile: str = "toy"
    batch_size: int = 2
    max_length: int = 8
    steps: int = 2
    warmup_steps: int = 0
    repeats: int = 3
    lr: float = 1e-3
    seed: int = 0
    device: str = "cpu"
    dtype: str = "float32"
    threads: int | None = None
    padded_s: float = 0.3
    flattened_s: float = 0.1
    flattened_steps: int = 2


def measure(config, mode, device):
    seconds = {"padded": config.padded_s, "flattened": config.flattened_s}[mode]
    steps = config.steps if mode == "padded" else config.flattened_steps
    return {
        "step_s": [seconds] * steps,
        "cpu_s": [seconds] * steps,
        "losses": [1.0] * steps,
        "peak_memory_bytes": 2**20,
        "added_memory_bytes": 2**10,
        "first_step_s": seconds,
        "settle_passes": 1,
        "attn": "sdpa",
        "model": {"model_type": "toy", "parameters": 10, "hidden_size": 4, "num_hidden_layers": 1},
        "pass_flops": 1e9,
        "environment": {"toy": True},
    }


TASK = Task(
    name="toy",
    flag="--task toy",
    config=ToyConfig,
    files="toy",
    modes={"padded": "padded toy", "flattened": "flattened toy"},
    subject="the flat toy",
    baseline="the padded toy",
    scope="a toy",
    workload=lambda config: Workload(
        ("padded", "flattened"),
        60,
        {"padded": 100, "flattened": 60},
        {"padded": 2, "flattened": 2},
        {**sequence_data([30, 30], truncated=0, profile_padding=0.5, profile_sample="9 toys"), "toy": 1},
    ),
    measure=measure,
    data_lines=lambda result: [f"toy data {result['data']['toy']}"],
    validate=lambda config: None,
)
'''


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """A task added as one new module, and nothing else (the harness finds it by its name)."""
    (tmp_path / "toy.py").write_text(textwrap.dedent(TOY))
    monkeypatch.setattr(tasks, "__path__", [*tasks.__path__, str(tmp_path)])
    yield get_task("toy")
    import sys

    sys.modules.pop("flatcollate.bench.tasks.toy", None)


def test_the_shipped_tasks_are_the_modules_of_the_tasks_package():
    assert task_names() == ["dpo", "grpo", "kto", "reward", "sft", "vision"]
    assert [get_task(name).name for name in task_names()] == task_names()
    assert sorted(task_choices()) == task_names()
    with pytest.raises(
        ValueError, match="Unknown benchmark task 'ppo'; choose from dpo, grpo, kto, reward, sft, vision"
    ):
        get_task("ppo")


def task_choices() -> list[str]:
    """What `flatcollate bench --task` accepts (read without importing a task)."""
    (bench,) = [a for a in build_parser()._subparsers._group_actions[0].choices["bench"]._actions if a.dest == "task"]
    return list(bench.choices)


def test_a_task_is_one_module_and_its_figures_are_summarized_exactly(toy, tmp_path):
    assert "toy" in task_names() and "toy" in task_choices()  # the command line takes it too
    result = run_bench("toy", progress=False, runner=in_process)
    padded, flattened = result["modes"]["padded"], result["modes"]["flattened"]
    assert padded["tokens_per_s"]["median"] == pytest.approx(60 / 0.6)
    assert flattened["tokens_per_s"]["median"] == pytest.approx(60 / 0.2)
    assert padded["padding_fraction"] == pytest.approx(0.4) and flattened["padding_fraction"] == 0
    assert result["ratios_vs_padded"]["flattened"]["tokens_per_cpu_s"]["median"] == pytest.approx(3.0)
    assert result["headline"]["flattened_vs_padded"]["median"] == pytest.approx(3.0)
    assert not result["headline"]["noisy"] and result["headline"]["flattened_vs_padded"]["n"] == 3
    assert flattened["model_tflops_per_s"]["median"] == pytest.approx(1e9 / 0.2 / 1e12)
    assert flattened["mfu"] is None  # no peak FLOP/s on a CPU
    assert result["environment"]["toy"] is True and result["loss_equivalence"]["max_abs_loss_diff"] == 0
    paths = write_report(result, tmp_path / "out")
    assert [p.name for p in paths] == ["toy.json", "toy.md", "toy.png", "toy_loss_curves.png"]
    assert json.loads(paths[0].read_text())["headline"] == result["headline"]
    text = summary_text(result)
    assert "toy data 1" in text and "- flattened: flattened toy" in text
    assert "the flat toy trains 3.00x the real tokens per CPU second of the padded toy" in text


def test_a_worker_timing_other_steps_than_planned_is_refused(toy):
    """Negative control of the step count: a mode that trains other steps than the parent planned is not compared."""
    config = toy.config(flattened_steps=3)
    with pytest.raises(RuntimeError, match=r"flattened: the workers timed \[3\] steps per pass, planned 2"):
        run_bench("toy", config, progress=False, runner=in_process)


def test_a_config_of_another_task_or_a_bad_field_is_refused_before_any_run():
    with pytest.raises(TypeError, match="The dpo benchmark takes a PairBenchConfig, got SFTBenchConfig"):
        run_bench("dpo", SFTBenchConfig(), runner=_no_run)
    with pytest.raises(ValueError, match="`repeats` must be a positive int, got 0"):
        run_bench("reward", PairBenchConfig(repeats=0), runner=_no_run)
    with pytest.raises(ValueError, match="Unknown dpo benchmark mode 'packed'"):
        harness.measure({"task": "dpo", "config": {}}, "packed")


def _no_run(command, payload):
    raise AssertionError("a run started")


class FakeEvent:
    """`torch.cuda.Event` stood in for: records in order, 250 ms between consecutive records."""

    recorded: typing.ClassVar[list] = []

    def __init__(self, enable_timing=False):
        assert enable_timing
        self.synchronized = False

    def record(self):
        self.at = len(FakeEvent.recorded) * 250.0
        FakeEvent.recorded.append(self)

    def synchronize(self):
        self.synchronized = True

    def elapsed_time(self, end):
        assert end.synchronized, "read before the end event was reached"
        return end.at - self.at


def test_on_a_gpu_step_seconds_come_from_cuda_events(monkeypatch):
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    FakeEvent.recorded = []
    clock = timing.StepClock(torch.device("cuda"))
    clock.start()
    clock.lap()
    clock.lap()
    assert clock.step_s == [0.25, 0.25]  # the events' 250 ms, not the microseconds that passed here
    assert len(clock.cpu_s) == 2 and len(FakeEvent.recorded) == 5  # start, (end, next start) x 2


def test_on_a_cpu_step_seconds_are_wall_clock_and_cpu_time():
    clock = timing.StepClock(torch.device("cpu"))
    clock.start()
    sum(i * i for i in range(200_000))  # busy: CPU time and wall time both grow
    clock.lap()
    assert clock.step_s[0] > 0 and clock.cpu_s[0] > 0


def test_the_trainer_clock_times_the_steps_after_the_warm_up():
    clock = timing.TrainerClock(2, torch.device("cpu"))
    clock.on_train_begin(None, None, None)
    for step in range(1, 6):
        clock.on_step_end(None, SimpleNamespace(global_step=step), None)
    figures = clock.figures()
    assert len(figures["step_s"]) == len(figures["cpu_s"]) == 3  # 5 steps, 2 of warm-up
    assert figures["first_step_s"] == clock.clock.step_s[0]
    assert clock.memory.baseline is None or clock.memory.baseline > 0  # reset at the end of the warm-up


def test_without_warm_up_the_trainer_clock_times_every_step_from_the_start(monkeypatch):
    resets = []
    clock = timing.TrainerClock(0, torch.device("cpu"))
    monkeypatch.setattr(clock.memory, "reset", lambda: resets.append(len(clock.clock.step_s)))
    clock.on_train_begin(None, None, None)
    for step in range(1, 4):
        clock.on_step_end(None, SimpleNamespace(global_step=step), None)
    assert len(clock.figures()["step_s"]) == 3 and resets == [0]  # the peak covers every step, reset once before


@pytest.mark.parametrize(
    ("task", "argv"),
    [
        ("sft", []),
        ("sft", ["--modes", "padded", "packed", "--pack-len", "2048", "--attn", "sdpa", "--set", "hidden_size=64"]),
        ("sft", ["--model", "qwen2", "--full-size", "--set", "num_hidden_layers=2", "--dtype", "bfloat16"]),
        ("vision", ["--max-images", "1", "--max-pixels", "9408", "--set", "hidden_size=64", "--steps", "2"]),
        ("dpo", ["--profile", "hh_rlhf", "--batch-size", "2", "--threads", "2", "--lr", "1e-05"]),
        ("reward", ["--max-length", "512", "--seed", "3", "--warmup-steps", "0"]),
    ],
)
def test_the_printed_command_reproduces_every_tasks_config(task, argv):
    flag = {"sft": [], "vision": ["--vision"]}.get(task, ["--task", task])
    args = build_parser().parse_args(["bench", *flag, *argv])
    config = config_from_args(get_task(task), args)
    command = command_line(get_task(task), config, "out dir")
    again = build_parser().parse_args(shlex.split(command)[1:])
    assert config_from_args(get_task(task), again) == config
    assert command.endswith("--out-dir 'out dir'") and (flag == [] or " ".join(flag) in command)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--vision", "--modes", "padded"], "--modes does not apply to --vision (its model is qwen2_5_vl"),
        (["--max-images", "2"], "--max-images does not apply to --task sft"),
        (["--task", "dpo", "--attn", "sdpa"], "--attn does not apply to --task dpo (it compares trl.DPOTrainer"),
        (["--task", "reward", "--pack-len", "9"], "--pack-len does not apply to --task reward"),
    ],
)
def test_an_option_the_task_does_not_take_is_refused(argv, message):
    args = build_parser().parse_args(["bench", *argv])
    with pytest.raises(UsageError, match=message.replace("(", r"\(")):
        config_from_args(get_task("vision" if args.vision else args.task), args)


def test_report_files_are_named_by_the_task():
    assert report_files({"task": "dpo"}) == ("dpo.json", "dpo.md", "dpo.png", "dpo_loss_curves.png")
    assert report_files({"task": "vision"})[0] == "vision.json"


def test_the_gpu_validation_script_quotes_the_headline_not_the_file_list(toy, tmp_path):
    """`tools/gpu_validate.sh` ends its one screen with the bench's headline, read from the bench's output."""
    import subprocess
    from pathlib import Path

    result = run_bench("toy", progress=False, runner=in_process)
    log = tmp_path / "bench.log"
    log.write_text(summary_text(result) + "\n" + "\n".join(f"wrote {p}" for p in report_files(result)) + "\n")
    script = Path(__file__).parents[2] / "tools" / "gpu_validate.sh"
    function = subprocess.run(["sed", "-n", "/^headline_of()/,/^}/p", str(script)], capture_output=True, text=True)

    def headline_of(path):
        command = f'{function.stdout}\nheadline_of "$1"'
        return subprocess.run(["bash", "-c", command, "bash", str(path)], capture_output=True, text=True).stdout

    head = "the flat toy trains 3.00x the real tokens per CPU second of the padded toy (range 3.00-3.00 over 3 repeats)"
    assert headline_of(log).splitlines() == [head]
    files_only = tmp_path / "files.log"  # negative control: a log without a headline shows none
    files_only.write_text("".join(line + "\n" for line in log.read_text().splitlines() if line.startswith("wrote")))
    assert headline_of(files_only) == ""


def test_the_report_without_matplotlib_names_the_bench_extra(without_matplotlib, tmp_path):
    """The plots need matplotlib, the `bench` extra; the rest of the report does not."""
    with pytest.raises(ModuleNotFoundError) as error:
        write_report({}, tmp_path)
    message = str(error.value)
    assert "\n" not in message and message.endswith('pip install "flatcollate[bench]"'), message
    assert message.startswith("flatcollate bench draws its plots with matplotlib"), message
