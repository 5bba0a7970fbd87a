"""The scripts in `benchmarks/` run with short settings, print their table and write files only where asked."""

import importlib.util
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_attention_speed_with_one_repeat_writes_nothing_by_default(tmp_path, monkeypatch, capsys):
    script = load("attention_speed")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(script, "length_mixes", lambda scale: {"two": (5 * scale, 3 * scale)})
    assert script.main(["--repeats", "1"]) == 0
    assert "| two | 2 | 8 |" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []
    assert script.main(["--repeats", "2", "--output", str(tmp_path / "out")]) == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["cpu.json", "cpu.md"]


def test_attention_speed_refuses_zero_repeats(capsys):
    with pytest.raises(SystemExit) as exit_info:
        load("attention_speed").main(["--repeats", "0"])
    assert exit_info.value.code == 2 and "--repeats" in capsys.readouterr().err


def test_collate_speed_shows_progress(capsys):
    results = load("collate_speed").main(["--repeats", "1", "--batch-size", "2"])
    assert {r.collator for r in results} == {"flatcollate", "transformers", "trl"}
    assert "18/18" in capsys.readouterr().err  # 2 profiles x 3 input kinds x 3 collators


def test_pack_speed_shows_progress(capsys):
    results = load("pack_speed").main(["--num-sequences", "200", "--repeats", "1", "--pack-len", "2048"])
    assert {r.packer for r in results} == {"flatcollate", "trl"}
    assert all(r.num_sequences == 200 for r in results)
    assert "4/4" in capsys.readouterr().err  # 2 profiles x 2 packers x 1 repeat


def test_compile_speed_with_one_repeat_writes_json_and_markdown_where_asked(tmp_path, monkeypatch, capsys):
    script = load("compile_speed")
    monkeypatch.chdir(tmp_path)
    tiny = ["--layers", "1", "--hidden-size", "32", "--batch-size", "2", "--max-length", "32", "--warmup", "0"]
    # dynamo's tracing without a backend compiler ("eager"): the script's plumbing, not inductor's compile time
    assert script.main([*tiny, "--repeats", "1", "--backends", "eager", "--no-progress", "--output", "out"]) == 0
    assert "| llama 1x32 | eager | True |" in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["cpu.json", "cpu.md"]
    with pytest.raises(SystemExit) as exit_info:
        script.main([*tiny, "--repeats", "0"])
    assert exit_info.value.code == 2 and "--repeats" in capsys.readouterr().err
