"""The scripts in `benchmarks/` run with short settings, every run a fresh worker process, print their table and the
command that made it, and write files only where asked."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from flatcollate.bench.repeats import WORKER_FLAG

pytestmark = pytest.mark.slow

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SHARED_DATA = BENCHMARKS.parents[1] / "shared" / "data"


def load(name: str):
    """A script as a module, importing its folder's `_common` as `python benchmarks/<name>.py` does."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_run_names_the_command_that_reproduces_it_and_its_ratios():
    common = load("_common")
    command = common.command_line("/repo/benchmarks/pack_speed.py", ["--sizes", "100", "--out", "a b"])
    assert command == "python benchmarks/pack_speed.py --sizes 100 --out 'a b'"
    assert common.format_ratio({"of_medians": 8.23, "median": 8.1, "min": 7.9, "max": 8.6}, 1) == "8.2 (7.9-8.6)"


def test_results_are_written_only_where_asked(tmp_path):
    common = load("_common")
    assert common.write_results(None, "cpu", {"a": 1}, "| a |") == []
    paths = common.write_results(tmp_path / "out", "cpu", {"a": 1}, "| a |")
    assert [p.name for p in paths] == ["cpu.json", "cpu.md"]
    assert json.loads(paths[0].read_text()) == {"a": 1} and paths[1].read_text() == "| a |\n"


def test_attention_speed_with_one_repeat_writes_nothing_by_default(tmp_path, monkeypatch, capsys):
    script = load("attention_speed")
    monkeypatch.chdir(tmp_path)
    # The mixes are chosen in this process and handed to the workers, so the stand-in reaches them.
    monkeypatch.setattr(script, "length_mixes", lambda scale: {"two": (5 * scale, 3 * scale)})
    assert script.main(["--repeats", "1", "--iterations", "1", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "| two | 2 | 8 |" in out
    assert "command: `python benchmarks/attention_speed.py --repeats 1 --iterations 1 --no-progress`" in out
    assert list(tmp_path.iterdir()) == []
    assert script.main(["--repeats", "1", "--iterations", "1", "--no-progress", "--output", "out"]) == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["cpu.json", "cpu.md"]
    (row,) = json.loads((tmp_path / "out" / "cpu.json").read_text())["rows"]
    assert row["packed_ms"]["n"] == row["padded_ms"]["n"] == row["padded_over_packed"]["n"] == 1


@pytest.mark.parametrize("argv", [["--repeats", "0"], ["--iterations", "0"], ["--scale", "x"]])
def test_attention_speed_mistakes_are_one_line_and_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        load("attention_speed").main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and argv[0] in err and err.count("\n") == 1, err


def test_collate_speed_shows_progress_over_the_runs(capsys):
    argv = ["--repeats", "1", "--passes", "1", "--batch-size", "2", "--profiles", "gsm8k", "--inputs", "numpy"]
    rows = load("collate_speed").main(argv)
    assert [r["collator"] for r in rows] == ["flatcollate", "transformers", "trl"]
    assert rows[0]["vs_flatcollate"]["of_medians"] == 1.0
    assert "3/3" in capsys.readouterr().err  # 1 profile x 1 input kind x 3 collators x 1 repeat


def test_pack_speed_shows_progress_over_the_runs(capsys):
    argv = ["--num-sequences", "200", "--repeats", "1", "--pack-len", "2048", "--profiles", "gsm8k"]
    results = load("pack_speed").main(argv)
    assert [r.packer for r in results] == ["flatcollate", "trl"]
    assert all(r.num_sequences == 200 and len(r.seconds) == 1 for r in results)
    assert "2/2" in capsys.readouterr().err  # 1 profile x 2 packers x 1 repeat


def test_compile_speed_with_one_repeat_writes_json_and_markdown_where_asked(tmp_path, monkeypatch, capsys):
    script = load("compile_speed")
    monkeypatch.chdir(tmp_path)
    tiny = ["--layers", "1", "--hidden-size", "32", "--batch-size", "2", "--max-length", "32", "--warmup", "0"]
    # dynamo's tracing without a backend compiler ("eager"): the script's plumbing, not inductor's compile time
    argv = [*tiny, "--steps", "1", "--repeats", "1", "--backends", "eager", "--no-progress", "--output", "out"]
    assert script.main(argv) == 0
    assert "| llama 1x32 | eager | True |" in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["cpu.json", "cpu.md"]
    (row,) = json.loads((tmp_path / "out" / "cpu.json").read_text())["rows"]
    assert row["compiles"] >= 1 and row["eager_over_compiled"]["n"] == 1
    with pytest.raises(SystemExit) as exit_info:
        script.main([*tiny, "--repeats", "0"])
    assert exit_info.value.code == 2 and "--repeats" in capsys.readouterr().err


@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="needs the shared tokenizers and chat data")
def test_encode_speed_compares_both_methods_per_run(capsys):
    argv = ["--tokenizers", "qwen2.5-instruct", "--workloads", "hh_rlhf", "--num-rows", "3"]
    rows = load("encode_speed").main([*argv, "--passes", "1", "--repeats", "1", "--no-progress"])
    assert [r["method"] for r in rows] == ["apply_chat_template", "flatcollate"]
    assert rows[0]["time_vs_apply_chat_template"]["of_medians"] == 1.0 and rows[1]["per_s"]["median"] > 0


def test_stream_readers_counts_reads_per_run(capsys):
    argv = ["--num-rows", "40", "--num-shards", "4", "--readers", "2", "--repeats", "1", "--no-progress"]
    results = load("stream_readers").main(argv)
    by_split = {(r.source, r.mode): r for r in results}
    assert by_split["iterable", "shards"].reads_total == 40 and by_split["iterable", "rows"].reads_total == 80
    assert by_split["iterable", "shards"].vs_shards == 1.0


def test_scripts_answer_as_workers_with_one_json_line(capsys):
    payload = {"case": {"name": "one", "lengths": [3, 2], "iterations": 1, "warmup": 0}, "variant": "padded"}
    assert load("attention_speed").main([WORKER_FLAG, json.dumps(payload)]) == 0
    figures = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert set(figures) == {"ms", "kernel"} and figures["kernel"] == "sdpa"


# ---- benchmarks/throughput.py: mistakes are one line, exit 2, before anything runs ---------------------------------


@pytest.fixture
def throughput_script(monkeypatch):
    script = load("throughput")

    def refuse(*args, **kwargs):
        raise AssertionError("the benchmark ran despite a usage error")

    monkeypatch.setattr(script, "run_and_report", refuse)
    return script


@pytest.mark.parametrize(
    ("argv", "fragments"),
    [
        (["--steps", "0"], ["--steps", "'0'"]),
        (["--repeats", "0"], ["--repeats", "'0'"]),
        (["--lr", "nan"], ["--lr"]),
        (["--modes", "padded", "flatened"], ["--modes", "'flatened'", "flattened"]),
        (["--seed", "abc"], ["--seed", "'abc'"]),
        (["--max-length"], ["--max-length", "expected one argument"]),
        (["--bogus"], ["unrecognized arguments: --bogus"]),
        (["--set", "hidden_size"], ["KEY=VALUE"]),
        (["--set", "hidden_sise=256"], ["did you mean hidden_size"]),
        (["--set", "hidden_size=-5"], ["hidden_size"]),
        (["--profiles", "flan", "no-such-profile"], ["--profile no-such-profile"]),
    ],
)
def test_throughput_mistakes_are_one_line_and_exit_2(argv, fragments, throughput_script, tmp_path, capsys):
    code = throughput_script.main(["--out-dir", str(tmp_path / "out"), *argv])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("benchmarks/throughput.py: error: ") and err.count("\n") == 1, err
    assert "usage:" not in err and "Traceback" not in err
    for fragment in fragments:
        assert fragment in err, err


def test_throughput_out_dir_that_is_a_file_is_refused_before_the_run(throughput_script, tmp_path, capsys):
    a_file = tmp_path / "report.txt"
    a_file.write_text("")
    assert throughput_script.main(["--out-dir", str(a_file)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--out-dir" in err and "cannot write there" in err, err


def test_throughput_trains_every_pass_in_a_fresh_process(tmp_path, capsys):
    tiny = ["--set", "hidden_size=32", "--set", "intermediate_size=64", "--set", "num_hidden_layers=1"]
    tiny += ["--set", "head_dim=16", "--batch-size", "3", "--max-length", "96", "--steps", "2", "--warmup-steps", "0"]
    argv = ["--profiles", "gsm8k", "--modes", "padded", "flattened", "--repeats", "1", "--no-progress", *tiny]
    assert load("throughput").main([*argv, "--out-dir", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "gsm8k" / "throughput.json").read_text())
    assert result["environment"]["process_per_run"] is True
    assert list(result["modes"]) == ["padded", "flattened"]
    assert result["loss_equivalence"]["max_abs_loss_diff"] < 1e-5  # the same weights and batches in both processes
    assert "command: `python benchmarks/throughput.py --profiles gsm8k" in capsys.readouterr().out
