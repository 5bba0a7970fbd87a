"""Every example runs as its docstring says, from a fresh clone: no arguments, no downloads, no shared data.

The commands are read from each example's docstring (`python examples/...` lines), so a docstring that names a
missing file or option fails here.
"""

import ast
import importlib.util
import json
import math
import re
import shlex
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").rglob("*.py"))


def docstring_commands(path: Path) -> list[list[str]]:
    """The argument lists of the `python examples/...` lines in a script's docstring (comments dropped)."""
    module_doc = path.read_text().split('"""')[1]
    commands = []
    for line in module_doc.splitlines():
        if not line.strip().startswith("python "):
            continue
        words = shlex.split(line, comments=True)
        if words[:1] == ["python"]:
            assert (ROOT / words[1]).is_file(), f"{path.name} names {words[1]}, which does not exist"
            commands.append(words[1:])
    return commands


def load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_example_documents_a_command_without_arguments():
    assert EXAMPLES
    for path in EXAMPLES:
        assert [path.relative_to(ROOT).as_posix()] in docstring_commands(path), path.name


TRL_EXAMPLES = {"sft_trainer_padding_free.py", "dpo_padding_free.py"}
"""Examples that show TRL's trainer; every other one runs on the base install, without the `[trl]` extra."""


def _imported_packages(path: Path) -> set[str]:
    """Top-level names of every package the script imports (`import a.b`, `from a.b import c` -> `a`)."""
    tree = ast.parse(path.read_text())
    names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    names |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level == 0}
    return {name.partition(".")[0] for name in names}


@pytest.mark.parametrize("path", [p for p in EXAMPLES if p.name not in TRL_EXAMPLES], ids=lambda p: p.name)
def test_examples_other_than_trl_ones_do_not_import_trl(path):
    assert "trl" not in _imported_packages(path)


@pytest.mark.parametrize(
    "path", [p for p in EXAMPLES if "StatefulDataLoader(" in p.read_text()], ids=lambda p: p.name
)
def test_examples_with_a_stateful_loader_do_not_print_torchdata_set_vital_warning(path):
    from torchdata.stateful_dataloader import StatefulDataLoader

    with warnings.catch_warnings(record=True) as caught:  # pytest restores the filters the example adds
        load(path)
        StatefulDataLoader([0, 1], batch_size=1)
    assert not [w for w in caught if "set_vital" in str(w.message)]


def test_docstring_files_exist():
    for path in [*EXAMPLES, *(ROOT / "examples").rglob("*.yaml")]:
        text = path.read_text()
        for word in text.replace("`", " ").split():
            if word.startswith("examples/") and word.endswith((".py", ".yaml")):
                assert (ROOT / word).is_file(), f"{path.name} names {word}, which does not exist"


SHORT = ["--num-examples", "8", "--batch-size", "4"]
"""Appended to each documented command so the test stays short."""


def _runnable(path: Path) -> list[tuple[Path, list[str]]]:
    return [(path, argv[1:]) for argv in docstring_commands(path) if not any("path/to" in a for a in argv)]


def _cases() -> list:
    return [case for path in EXAMPLES if path.parent.name == "examples" for case in _runnable(path)]


@pytest.mark.parametrize(
    ("path", "argv"),
    _cases(),
    ids=lambda value: value.stem if isinstance(value, Path) else " ".join(value) or "no arguments",
)
def test_trainer_examples_run_as_documented(path, argv, capsys):
    result = load(path).main([*argv, *SHORT])  # argparse keeps the last value: the documented options still parse
    assert result["optimizer_steps"], capsys.readouterr().out
    losses = result["losses"]["flattened"] if isinstance(result["losses"], dict) else result["losses"]
    assert losses and all(math.isfinite(loss) for loss in losses)
    if "max_abs_loss_diff" in result:  # the bound the docs quote for a padded and a flattened run side by side
        assert result["max_abs_loss_diff"] <= 1e-5, result["max_abs_loss_diff"]
    if "max_abs_loss_diff" in result:  # the padded twin of the flattened run
        assert result["max_abs_loss_diff"] <= 1e-5


def test_accelerate_example_runs_in_one_process_without_output(tmp_path):
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "accelerate" / "train.py"), "--num-examples", "8"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "step 1: loss" in done.stdout
    assert list(tmp_path.iterdir()) == []  # without --output nothing is written


def _processor_named_in(out: str) -> str:
    """The processor class the example's `data:` line names."""
    (line,) = [line for line in out.splitlines() if line.startswith("data: ")]
    return re.search(r"encoded by (\w+)", line).group(1)


def test_vlm_example_encodes_conversations_with_a_processor(tokenizer_dir, monkeypatch, capsys):
    monkeypatch.setenv("FLATCOLLATE_SHARED_DATA", str(tokenizer_dir("qwen2.5-instruct").parents[1]))
    module = load(ROOT / "examples" / "vlm_padding_free.py")
    result = module.main(SHORT)
    out = capsys.readouterr().out
    assert result["data"] == "processor", out
    assert _processor_named_in(out) == "Qwen2_5_VLProcessor", out  # transformers' class, by its public name
    assert not [v for v in vars(module).values() if isinstance(v, type) and v.__module__ == module.__name__]  # no class
    assert result["optimizer_steps"] == 2  # 8 examples, batches of 4
    assert result["padding_efficiency"]["flattened"] == 1.0 > result["padding_efficiency"]["padded"]


def test_vlm_example_reads_a_processor_from_a_local_directory(tokenizer_dir, tmp_path, monkeypatch, capsys):
    """`--processor DIR`: a model directory's processor files, laid out as a Qwen2.5-VL snapshot holds them."""
    module = load(ROOT / "examples" / "vlm_padding_free.py")
    monkeypatch.setenv("FLATCOLLATE_SHARED_DATA", str(tmp_path / "none"))  # the directory is all it reads
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(tokenizer_dir("qwen2.5-instruct") / name, tmp_path / name)
    (tmp_path / "chat_template.json").write_text(json.dumps({"chat_template": module.CHAT_TEMPLATE}))
    preprocessor = {
        "min_pixels": 3136,
        "max_pixels": 12845056,
        "patch_size": 14,
        "temporal_patch_size": 2,
        "merge_size": 2,
        "image_processor_type": "Qwen2VLImageProcessor",
        "processor_class": "Qwen2_5_VLProcessor",
    }
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(preprocessor))
    result = module.main([*SHORT, "--processor", str(tmp_path)])
    out = capsys.readouterr().out
    assert result["data"] == "processor" and f"load_processor({str(tmp_path)!r})" in out, out
    assert _processor_named_in(out) == "Qwen2_5_VLProcessor", out
    assert result["optimizer_steps"] == 2 and all(math.isfinite(loss) for loss in result["losses"])


def test_vlm_example_runs_on_synthetic_rows_without_shared_data(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FLATCOLLATE_SHARED_DATA", str(tmp_path))  # no tokenizer there
    result = load(ROOT / "examples" / "vlm_padding_free.py").main(SHORT)
    out = capsys.readouterr().out
    assert result["data"] == "synthetic" and "synthetic encoded rows" in out, out
    assert result["optimizer_steps"] == 2 and all(math.isfinite(loss) for loss in result["losses"])
    assert result["padding_efficiency"]["flattened"] == 1.0 > result["padding_efficiency"]["padded"]
