"""The vision profile of the throughput benchmark on a tiny run: image grids, padded batches, token counts, steps,
loss equivalence, report files and the `flatcollate bench --vision` command line."""

import argparse
import json
import shlex

import numpy as np
import pytest
import torch

from flatcollate.bench.batches import pad_examples, real_tokens, slot_tokens
from flatcollate.bench.cli import command_line, config_from_args, register_cli
from flatcollate.bench.harness import get_task, in_process, run_bench
from flatcollate.bench.report import report_files, summary_text, write_report
from flatcollate.bench.tasks.vision import VisionBenchConfig, build_vision_model
from flatcollate.cli import UsageError
from flatcollate.profiles import load_profile
from flatcollate.synthetic.images import (
    draw_vision_pool,
    vision_examples,
)
from flatcollate.vision import VisionDataCollatorWithFlattening

pytestmark = pytest.mark.slow

SMALL_PIXELS = 28 * 28 * 12  # at most 12 image tokens per image
TINY_TEXT = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2, "num_key_value_heads": 1}
CONFIG = VisionBenchConfig(
    profile="gsm8k",
    batch_size=3,
    max_length=48,
    steps=2,
    warmup_steps=1,
    repeats=2,
    max_pixels=SMALL_PIXELS,
    model_overrides=TINY_TEXT,
)


@pytest.fixture(scope="module")
def result():
    """Every run in this process (the command-line test below starts real workers)."""
    return run_bench("vision", CONFIG, progress=False, runner=in_process)


@pytest.fixture(scope="module")
def model():
    return build_vision_model(CONFIG, device=torch.device("cpu"), dtype="float32")


def _pool(n, seed):
    return draw_vision_pool(load_profile("gsm8k"), n, max_length=48, images=CONFIG.images, seed=seed)


def test_padded_batch_against_the_collator_and_a_per_example_loop(model):
    pool = _pool(5, seed=2)
    examples = vision_examples(model, pool, np.arange(5), seed=0)
    batch = pad_examples(examples, pad_token_id=7)
    flat = VisionDataCollatorWithFlattening.from_model(model)(examples)
    width = max(len(e["input_ids"]) for e in examples)
    per_token = {"input_ids", "labels", "attention_mask", "mm_token_type_ids"}
    assert set(batch) == per_token | {"pixel_values", "image_grid_thw"}
    assert batch["input_ids"].shape == (5, width)
    for row, example in enumerate(examples):
        n = len(example["input_ids"])
        for key, pad in (("input_ids", 7), ("labels", -100), ("mm_token_type_ids", 0)):
            torch.testing.assert_close(batch[key][row, :n], example[key])
            assert (batch[key][row, n:] == pad).all()
        assert batch["attention_mask"][row].tolist() == [1] * n + [0] * (width - n)
    torch.testing.assert_close(batch["pixel_values"], flat["pixel_values"])
    torch.testing.assert_close(batch["image_grid_thw"], flat["image_grid_thw"])
    assert real_tokens(batch) == real_tokens(flat) == int(pool.lengths.sum())
    assert slot_tokens(batch) == 5 * width


def test_run_reports_padding_steps_losses_and_memory(result):
    modes = result["modes"]
    assert list(modes) == ["padded", "flattened", "packed"]
    assert modes["padded"]["optimizer_steps"] == modes["flattened"]["optimizer_steps"] == CONFIG.steps
    assert modes["padded"]["real_tokens"] == modes["flattened"]["real_tokens"] == modes["packed"]["real_tokens"]
    assert 1 <= modes["packed"]["optimizer_steps"] <= CONFIG.steps * CONFIG.batch_size
    assert modes["packed"]["padding_fraction"] == 0.0 and modes["packed"]["attn"] == "flatcollate"
    efficiency = modes["padded"]["real_tokens"] / modes["padded"]["computed_tokens"]
    assert modes["padded"]["padding_fraction"] == pytest.approx(1 - efficiency)
    assert result["data"]["sequences"] == CONFIG.steps * CONFIG.batch_size and 0 < result["data"]["profile_padding"] < 1
    assert modes["flattened"]["attn"] == "flatcollate" and modes["padded"]["attn"] == "sdpa"
    assert all(m["model_tflops_per_s"]["median"] > 0 and m["mfu"] is None for m in modes.values())  # no peak on a CPU
    assert modes["flattened"]["padding_fraction"] == 0.0
    assert result["loss_equivalence"]["max_abs_loss_diff"] <= 1e-5
    assert all(len(m["losses"]) == m["optimizer_steps"] for m in modes.values())
    ratio = result["ratios_vs_padded"]["flattened"]["tokens_per_cpu_s"]
    assert ratio["n"] == CONFIG.repeats and ratio["min"] <= ratio["median"] <= ratio["max"]
    assert result["headline"]["flattened_vs_padded"]["n"] == CONFIG.repeats
    assert result["environment"]["torch_threads"] == 1 and result["environment"]["device_type"] == "cpu"
    assert result["model"]["model_type"] == "qwen2_5_vl" and result["model"]["hidden_size"] == 32
    assert result["config"]["max_pixels"] == SMALL_PIXELS and "max_pixels 9408" in result["data"]["image_distribution"]
    pool = draw_vision_pool(load_profile("gsm8k"), 6, max_length=48, images=CONFIG.images, seed=CONFIG.seed)
    assert result["data"]["image_tokens"] == int(pool.lengths.sum() - pool.text.lengths.sum()) > 0
    json.dumps(result)


def test_summary_and_report_files(result, tmp_path):
    text = summary_text(result)
    assert "padding of the padded batches" in text and "device CPU" in text and "image tokens each" in text
    assert "| padded |" in text and "| flattened |" in text and "| packed |" in text
    assert "flatcollate (flattened) trains" in text
    paths = write_report(result, tmp_path)
    assert [p.name for p in paths] == list(report_files(result)) and paths[3].name == "vision_loss_curves.png"
    assert json.loads((tmp_path / "vision.json").read_text())["config"]["max_pixels"] == SMALL_PIXELS


def _parse(argv):
    parser = argparse.ArgumentParser()
    register_cli(parser.add_subparsers())
    return parser.parse_args(["bench", *argv])


def test_command_line_runs_the_vision_profile(tmp_path, capsys):
    sizes = ["--set", "hidden_size=32", "--set", "intermediate_size=64", "--max-pixels", str(SMALL_PIXELS)]
    run = ["--profile", "gsm8k", "--batch-size", "3", "--max-length", "48", "--steps", "1", "--repeats", "1"]
    args = _parse(["--vision", *run, *sizes, "--out-dir", str(tmp_path), "--no-progress"])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "qwen2_5_vl" in out and "wrote" in out
    assert (tmp_path / "vision.md").is_file()
    result = json.loads((tmp_path / "vision.json").read_text())
    assert result["environment"]["process_per_run"] is True  # each (mode, repeat) trained in a worker process
    assert result["loss_equivalence"]["max_abs_loss_diff"] <= 1e-5
    assert result["modes"]["flattened"]["padding_fraction"] == 0.0


def test_command_line_refuses_batches_without_a_labelled_token(tmp_path):
    """Prompts longer than --max-length leave no completion: the loss would be NaN in both modes, and the loss
    comparison NaN, so the run is refused before any training."""
    sizes = ["--set", "hidden_size=32", "--set", "intermediate_size=64", "--max-pixels", str(SMALL_PIXELS)]
    run = ["--profile", "gsm8k", "--batch-size", "2", "--max-length", "8", "--steps", "1", "--repeats", "1"]
    args = _parse(["--vision", *run, *sizes, "--out-dir", str(tmp_path), "--no-progress"])
    with pytest.raises(UsageError, match=r"padded step 0: no example .* Raise --max-length"):
        args.func(args)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--modes", "padded", "packed"], "--modes does not apply to --vision"),
        (["--model", "qwen2"], "--model does not apply to --vision"),
        (["--set", "hiden_size=3"], "did you mean hidden_size"),
        (["--set", "hidden_size=0"], "hidden_size is a positive integer"),
        (["--max-pixels", "100"], "min_pixels"),
        (["--task", "dpo"], "--vision does not apply to --task dpo"),
    ],
)
def test_command_line_refuses_what_the_vision_profile_cannot_take(argv, message, tmp_path):
    args = _parse(["--vision", "--out-dir", str(tmp_path), *argv])
    with pytest.raises(UsageError, match=message):
        args.func(args)
    assert list(tmp_path.iterdir()) == []  # refused before anything ran


def test_min_pixels_is_an_option_of_the_vision_profile_and_reproduces(tmp_path):
    args = _parse(["--vision", "--min-pixels", "12544", "--max-pixels", "50176", "--out-dir", str(tmp_path)])
    config = config_from_args(get_task("vision"), args)
    assert (config.min_pixels, config.max_pixels) == (12544, 50176)
    command = command_line(get_task("vision"), config, tmp_path)
    assert "--min-pixels 12544 --max-pixels 50176" in command
    assert config_from_args(get_task("vision"), _parse(shlex.split(command)[2:])) == config
    with pytest.raises(UsageError, match="--min-pixels does not apply to --task sft"):  # control: the text task
        config_from_args(get_task("sft"), _parse(["--min-pixels", "12544"]))


def test_command_line_refuses_a_negative_image_count(capsys):
    with pytest.raises(SystemExit):
        _parse(["--vision", "--max-images", "-1"])
    assert "--max-images" in capsys.readouterr().err


def test_pass_flops_count_the_language_model_on_every_token_and_the_tower_on_every_patch(model):
    from flatcollate.bench.flops import attention_width, linear_parameters, training_flops
    from flatcollate.bench.tasks.vision import pass_flops

    pool = draw_vision_pool(load_profile("gsm8k"), 6, max_length=48, images=CONFIG.images, seed=0)
    layers, width = attention_width(model.config)
    language = linear_parameters(model.model.language_model) + linear_parameters(model.lm_head)
    text_only = training_flops(language, layers, width, pool.lengths)
    total = pass_flops(model, pool)
    visual = linear_parameters(model.model.visual)
    patches = int(pool.grids.prod(axis=1).sum())
    vision = model.config.vision_config
    attention = 6 * vision.depth * vision.hidden_size * (pool.grids.prod(axis=1) ** 2).sum()
    assert text_only < total <= text_only + 6 * visual * patches + attention
    no_images = pool.__class__(pool.text, pool.images * 0, pool.grids[:0], pool.text.lengths)
    assert pass_flops(model, no_images) == training_flops(language, layers, width, pool.text.lengths)  # control
