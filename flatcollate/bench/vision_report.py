"""`flatcollate bench --vision`: the printed summary, the report files and the command-line options of the vision
profile (`flatcollate.bench.vision`)."""

import argparse
from pathlib import Path

import torch

from ..cli import UsageError
from .batches import UnlabelledBatch
from .options import check_profile, check_writable
from .overrides import parse_overrides
from .report import (
    format_mib,
    format_parameters,
    headline_lines,
    markdown_table,
    plot_losses,
    plot_throughput,
    write_files,
)
from .vision import run_vision_bench
from .vision_config import VISION_TEXT_MODEL, VisionBenchConfig, check_vision_config, vision_model_config

VISION_REPORT_FILES = ("vision.json", "vision.md", "vision.png", "vision_loss_curves.png")
"""What `write_vision_report` puts in its output folder."""


def setup_lines(result: dict) -> list[str]:
    """Model, device, profile, images drawn, token counts and the padding efficiency of padded batches."""
    config, pool, env, model = result["config"], result["pool"], result["environment"], result["model"]
    images = result["images"]
    device = "CPU" if env["device_type"] == "cpu" else "GPU"
    threads = f", {env['torch_threads']} torch thread(s) of {env['cpu_count']} cores" if device == "CPU" else ""
    per_image = images["image_tokens_per_image"]
    return [
        f"model {model['model_type']} ({format_parameters(model)} parameters: text hidden {model['hidden_size']}, "
        f"{model['num_hidden_layers']} layers; vision tower {model['vision_parameters']:,} parameters, width "
        f"{model['vision_hidden_size']}, {model['vision_layers']} layer(s)), random weights, {config['dtype']}",
        f"device {device} ({env['device']}){threads}; text profile {config['profile']} truncated to "
        f"{config['max_length']}, batch {config['batch_size']}, {config['steps']} steps per pass, "
        f"{config['repeats']} repeats (each run a fresh process warmed up until its step times settle, the modes "
        "taking turns)",
        f"images: {images['distribution']}",
        f"{pool['sequences']} examples, {images['images']} images ({per_image['mean']:.0f} image tokens each on "
        f"average, {per_image['min']}-{per_image['max']}), {pool['real_tokens']:,} real tokens of which "
        f"{pool['image_tokens']:,} image-block tokens, mean length {pool['mean_length']:.0f}, longest "
        f"{pool['max_length_seen']}",
        f"padding efficiency of padded batches (real / padded tokens): {pool['padding_efficiency']:.1%} for these "
        f"examples, {pool['profile_padding_efficiency']:.1%} over 20,000 examples drawn the same way",
    ]


def legend_lines(result: dict) -> list[str]:
    """What the modes and columns mean."""
    lines = [
        "- padded: the processor's padded batch (right padding, attention_mask, mm_token_type_ids; the unprepared "
        "model computes each example's 3-D positions), sdpa",
        "- flattened: VisionDataCollatorWithFlattening + prepare_model_for_flattening (one row, per-sequence "
        "3-D positions, the flatcollate backend on the language model)",
        "- both modes give the vision tower the same pixel_values and image_grid_thw; real tokens count image "
        "tokens and text, not padding; x padded is the ratio to padded taken within each repeat",
    ]
    if result["environment"]["device_type"] == "cpu":
        lines.append(
            "- x padded, CPU time: the same ratio on this process's CPU seconds; memory added by the pass: RSS "
            "high-water mark of the timed pass minus the RSS before it"
        )
    return lines


def vision_summary_text(result: dict) -> str:
    """What `flatcollate bench --vision` prints: setup, table, legend, loss equivalence and, last, the headline."""
    lines = [*setup_lines(result), "", markdown_table(result), *legend_lines(result)]
    modes = result["modes"]
    lines.append(
        f"optimizer steps per epoch: padded {modes['padded']['steps_per_epoch']}, flattened "
        f"{modes['flattened']['steps_per_epoch']}; peak memory (median) padded "
        f"{format_mib(modes['padded']['peak_memory_bytes'])} MiB, flattened "
        f"{format_mib(modes['flattened']['peak_memory_bytes'])} MiB"
    )
    diff = result["loss_equivalence"]["max_abs_loss_diff"]
    lines.append(f"loss curves padded vs flattened: max abs difference {diff:.2e}")
    return "\n".join([*lines, "", *headline_lines(result)])


def write_vision_report(result: dict, out_dir: str | Path) -> list[Path]:
    """Write `VISION_REPORT_FILES` into `out_dir` (created if needed); returns their paths."""
    return write_files(result, out_dir, VISION_REPORT_FILES, vision_summary_text, (plot_throughput, plot_losses))


def vision_config_from_args(args: argparse.Namespace) -> VisionBenchConfig:
    """`VisionBenchConfig` from parsed options; `UsageError` for an unknown `--set` key, a profile that does not load
    or a value the config refuses (`flatcollate.bench.cli` refuses the text-only options before)."""

    text_model = parse_overrides(args.overrides, VISION_TEXT_MODEL)
    check_profile(args.profile)
    default = VisionBenchConfig()
    config = VisionBenchConfig(
        profile=args.profile,
        batch_size=args.batch_size,
        max_length=args.max_length,
        max_images=default.max_images if args.max_images is None else args.max_images,
        max_pixels=default.max_pixels if args.max_pixels is None else args.max_pixels,
        steps=args.steps,
        warmup_steps=args.warmup_steps,
        repeats=args.repeats,
        text_model=text_model,
        lr=args.lr,
        seed=args.seed,
        device=args.device,
        dtype=args.dtype,
        threads=args.threads,
    )
    try:
        check_vision_config(config)
        vision_model_config(config)
    except ValueError as error:
        raise UsageError(f"--vision: {error}") from None
    return config


def run_vision_command(args: argparse.Namespace) -> int:
    """`flatcollate bench --vision`: check every option, run, print the summary, write the report."""

    config = vision_config_from_args(args)
    if config.device == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device cuda: CUDA is not available (torch {torch.__version__}); use --device cpu or auto.")
    check_writable(Path(args.out_dir))
    try:
        result = run_vision_bench(config, progress=not args.no_progress)
    except UnlabelledBatch as error:
        raise UsageError(f"--vision: {error}") from None
    print(vision_summary_text(result))
    for path in write_vision_report(result, args.out_dir):
        print(f"wrote {path}")
    return 0
