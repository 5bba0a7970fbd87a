"""Every path the library takes reads `~` and environment variables as a shell does (`flatcollate._paths`): a
`cache_dir="~/.cache/flatcollate"` lands in the home folder, never in a folder named `~` under the working directory.

Each test runs with `HOME` and `$DATA` pointing into `tmp_path` and the working directory elsewhere in it, so a path
read literally shows up as a `~` or `$DATA` folder there.
"""

import json
import os
from pathlib import Path

import datasets
import pytest

from flatcollate._paths import expand_path


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """`HOME` and `$DATA` folders inside `tmp_path`; the working directory is `tmp_path / "cwd"`."""
    home, data, cwd = tmp_path / "home", tmp_path / "data", tmp_path / "cwd"
    for folder in (home, data, cwd):
        folder.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("DATA", str(data))
    monkeypatch.chdir(cwd)
    yield home
    assert sorted(os.listdir(cwd)) == [], "a path was read literally: a '~' or '$DATA' folder in the working directory"


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("~/x/y.json", "{home}/x/y.json"),
        ("$DATA/train.jsonl", "{data}/train.jsonl"),
        ("${DATA}/a", "{data}/a"),
        ("relative/dir", "relative/dir"),
        ("/abs/$UNSET_FLATCOLLATE_VAR/x", "/abs/$UNSET_FLATCOLLATE_VAR/x"),
    ],
)
def test_expand_path_reads_home_and_variables_as_a_shell_does(home, given, expected, monkeypatch):
    monkeypatch.delenv("UNSET_FLATCOLLATE_VAR", raising=False)
    want = Path(expected.format(home=home, data=os.environ["DATA"]))
    assert expand_path(given) == want
    assert expand_path(Path(given)) == want


def test_expand_path_refuses_what_is_not_a_path():
    with pytest.raises(TypeError, match=r"a path \(a str or os\.PathLike\), got int"):
        expand_path(3)


def test_make_supervised_dataset_reads_and_caches_under_home(home):
    from flatcollate.data import make_supervised_dataset
    from flatcollate.synthetic import offline_tokenizer

    rows = [{"query": "t1 t2", "response": "t3"}, {"query": "t4", "response": "t5 t6"}]
    Path(os.environ["DATA"], "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    ds = make_supervised_dataset(offline_tokenizer(), "$DATA/train.jsonl", cache_dir="~/.cache/flatcollate")
    assert len(ds) == 2
    assert len(list((home / ".cache" / "flatcollate").glob("supervised-*.arrow"))) == 1


def test_a_prompt_template_file_under_home(home):
    from flatcollate.data.prompt_templates import load_template

    (home / "t.txt").write_text("Q: {query}\nA: ")
    assert load_template("~/t.txt")["prompt"] == "Q: {query}\nA: "


def test_length_and_pair_profiles_save_and_load_under_home(home):
    from flatcollate.profiles import load_pair_profile, load_profile

    load_profile("gsm8k").save("~/gsm8k.json")
    assert load_profile("~/gsm8k.json").num_rows == load_profile("gsm8k").num_rows
    (home / "lengths.txt").write_text("3 4\n5 6\n")
    assert load_profile("~/lengths.txt").num_rows == 2
    load_pair_profile("hh_rlhf").save("$DATA/pairs.json")
    assert load_pair_profile("$DATA/pairs.json").num_rows == load_pair_profile("hh_rlhf").num_rows


def test_a_model_config_folder_under_home(home):
    from flatcollate.check.options import validate_model_argument
    from flatcollate.check.vision import image_text_model_type
    from flatcollate.testing.tiny_text import load_config, tiny_config

    tiny_config("qwen2").save_pretrained(home / "qwen")
    validate_model_argument("~/qwen")
    assert load_config("~/qwen").model_type == tiny_config("~/qwen").model_type == "qwen2"
    tiny_config("qwen2_vl").save_pretrained(home / "vl")
    assert image_text_model_type("~/vl") == "qwen2_vl"


def test_bench_out_dir_under_home(home):
    from flatcollate.bench.cli import validate
    from flatcollate.bench.config import SFTBenchConfig
    from flatcollate.bench.harness import get_task

    validate(get_task("sft"), SFTBenchConfig(), "~/bench-out")
    assert (home / "bench-out").is_dir()


def test_write_report_under_home(home, monkeypatch):
    from flatcollate.bench import report

    monkeypatch.setattr(report, "report_files", lambda result: ("r.json", "r.md", "r.png", "r_loss.png"))
    monkeypatch.setattr(report, "summary_text", lambda result: "summary")
    drawn = []
    import flatcollate.bench.plots as plots

    monkeypatch.setattr(plots, "plot_throughput", lambda result, path, *, title: drawn.append(path))
    monkeypatch.setattr(plots, "plot_losses", lambda result, path: drawn.append(path))
    monkeypatch.setattr(report, "plot_title", lambda result: "t")
    paths = report.write_report({"x": 1}, "~/report")
    assert paths[:2] == [home / "report" / "r.json", home / "report" / "r.md"] and drawn == paths[2:]
    assert json.loads(paths[0].read_text()) == {"x": 1}


def test_dart_tokenized_cache_home_under_home(home):
    from flatcollate.data.dart import make_supervised_dset
    from flatcollate.synthetic import offline_tokenizer

    data = datasets.Dataset.from_list([{"query": "t1", "response": "t2"}])
    make_supervised_dset(offline_tokenizer(), data, tokenized_cache_home="~/dart-cache")
    assert any((home / "dart-cache").iterdir())
