"""Write a benchmark result, of any task, as JSON, a markdown table, PNG plots and a short printed summary: the one
report of every benchmark (the task adds its legend and the lines about its data). The plots are drawn by `plots`,
which needs matplotlib (the `bench` extra); everything else here needs no plotting library."""

import json
from pathlib import Path

from .._paths import expand_path
from .config import PEER_MODE
from .harness import get_task
from .repeats import format_spread


def report_files(result: dict) -> tuple[str, ...]:
    """What `write_report` puts in its output folder: `<stem>.json`, `.md`, `.png` and `<stem>_loss_curves.png`, the
    stem the task's (`throughput` for SFT, otherwise its name)."""
    stem = get_task(result["task"]).files
    return (f"{stem}.json", f"{stem}.md", f"{stem}.png", f"{stem}_loss_curves.png")


def markdown_table(result: dict) -> str:
    """One row per mode: real tokens/s (median, min-max), ratio to padded, model TFLOP/s (and MFU on a GPU whose peak
    is known, `flatcollate.bench.flops`), peak memory and the memory the timed pass added, padding, optimizer steps
    of the timed pass, and the first step's seconds (allocation, kernel selection, compilation: not timed)."""
    ratios = result["ratios_vs_padded"]
    on_cpu = result["environment"]["device_type"] == "cpu"
    with_mfu = any(row.get("mfu") is not None for row in result["modes"].values())
    cpu_header = " x padded, CPU time |" if on_cpu else ""
    mfu_header = " MFU |" if with_mfu else ""
    memory = "peak RSS" if on_cpu else "peak CUDA memory"
    lines = [
        f"| mode | real tokens/s (median, min-max) | x padded (min-max) |{cpu_header} model TFLOP/s |{mfu_header} "
        f"{memory} MiB | memory added by the pass MiB | padding | optimizer steps | first step (s) |",
        "|---|---|---|---|---|---|---|---|---|" + ("---|" if on_cpu else "") + ("---|" if with_mfu else ""),
    ]
    for mode, row in result["modes"].items():
        ratio, cpu_ratio = (ratios.get(mode, {}).get(key) for key in ("tokens_per_s", "tokens_per_cpu_s"))
        ratio_text = format_spread(ratio, 2) if ratio else "-"
        cpu_text = f" {format_spread(cpu_ratio, 2) if cpu_ratio else '-'} |" if on_cpu else ""
        mfu_text = f" {row['mfu']:.1%} |" if with_mfu and row.get("mfu") is not None else " |" * with_mfu
        lines.append(
            f"| {mode} | {format_spread(row['tokens_per_s'], 0)} | {ratio_text} |{cpu_text} "
            f"{_tflops(row['model_tflops_per_s'])} |{mfu_text} {format_mib(row['peak_memory_bytes'])} "
            f"| {format_mib(row['peak_memory_over_baseline_bytes'])} | {row['padding_fraction']:.1%} "
            f"| {row['optimizer_steps']} | {row['first_step_s']['median']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def _tflops(figure: dict) -> str:
    """Model TFLOP/s with enough digits for a tiny CPU model and a full-size GPU one alike."""
    median = figure["median"]
    return f"{median:.3g}" if median < 100 else f"{median:,.0f}"


def setup_lines(result: dict) -> list[str]:
    """What was measured where: the model and its size, the device and threads, the run's sizes, then the data
    (`data_lines`)."""
    config, env, model = result["config"], result["environment"], result["model"]
    device = "CPU" if env["device_type"] == "cpu" else "GPU"
    threads = f", {env['torch_threads']} torch thread(s) of {env['cpu_count']} cores" if device == "CPU" else ""
    size = "tiny" if config.get("tiny", True) else "full"
    vision = ""
    if "vision_parameters" in model:
        vision = (
            f"; vision tower {model['vision_parameters']:,} parameters, width {model['vision_hidden_size']}, "
            f"{model['vision_layers']} layer(s)"
        )
    processes = "each run a fresh process" if env["process_per_run"] else "every run in one process"
    return [
        f"model {model['model_type']} ({size} config: {format_parameters(model['parameters'])} parameters, hidden "
        f"{model['hidden_size']}, {model['num_hidden_layers']} layers{vision}), random weights, {config['dtype']}",
        f"device {device} ({env['device']}){threads}; profile {config['profile']}, batch {config['batch_size']}, "
        f"max_length {config['max_length']}, {config['steps']} steps per timed pass after {config['warmup_steps']} "
        f"warm-up, {config['repeats']} repeats ({processes}, the modes taking turns)",
        *data_lines(result),
    ]


def data_lines(result: dict) -> list[str]:
    """The sequences of a timed pass and the padding of the padded batches, for them and over the profile
    (`harness.sequence_data`), then the task's own lines."""
    data, modes = result["data"], result["modes"]
    real = next(iter(modes.values()))["real_tokens"]
    lines = [
        f"{data['sequences']:,} sequences per timed pass ({real:,} real tokens), mean length "
        f"{data['mean_length']:.0f}, longest {data['longest']:,}, {data['truncated']} cut to max_length"
    ]
    if "padded" in modes:
        lines.append(
            f"padding of the padded batches: {modes['padded']['padding_fraction']:.1%} for these sequences, "
            f"{data['profile_padding']:.1%} over {data['profile_sample']} drawn the same way from the profile (a short "
            "run draws few of its long tail)"
        )
    return lines + get_task(result["task"]).data_lines(result)


def headline_lines(result: dict) -> list[str]:
    """The figure to quote, its spread, the comparison with transformers' own padding-free path, and a warning
    when the repeats disagree too much to trust it."""
    head = result.get("headline")
    if head is None:
        return []
    ratio, repeats = head["flattened_vs_padded"], head["flattened_vs_padded"]["n"]
    subject, baseline = head["subject"], head["baseline"]
    lines = [
        f"{subject} {head['verb']} {ratio['median']:.2f}x the {head['metric']} of {baseline} "
        f"(range {ratio['min']:.2f}-{ratio['max']:.2f} over {repeats} repeats)"
    ]
    if head["peer_vs_padded"] is not None:
        peer, versus = head["peer_vs_padded"], head["flattened_vs_peer"]
        lines.append(
            f"transformers' own padding-free path ({PEER_MODE}): {peer['median']:.2f}x padded "
            f"(range {peer['min']:.2f}-{peer['max']:.2f}); flatcollate is {versus['median']:.2f}x it "
            f"(range {versus['min']:.2f}-{versus['max']:.2f})"
        )
    if head["noisy"]:
        lines += [
            "",
            f"WARNING: the repeats disagree by {head['relative_spread']:.0%} of the median: do not quote these "
            "figures.",
            "  Other work is competing for this machine. Rerun when it is quieter, with more repeats "
            "(--repeats 9); on a shared CPU keep --threads 1.",
        ]
    return lines


def summary_text(result: dict) -> str:
    """What `flatcollate bench` prints: the command, the setup, the table with its legend, the loss agreement and,
    last, the headline."""
    lines = [f"command: `{result['command']}`", ""] if result.get("command") else []
    lines += [*setup_lines(result), "", markdown_table(result), *legend_lines(result)]
    if result["loss_equivalence"]:
        gap = result["loss_equivalence"]
        lines.append(
            f"loss per step, padded vs flattened over {gap['steps']} steps: max abs difference "
            f"{gap['max_abs_loss_diff']:.2e}"
        )
    return "\n".join([*lines, "", *headline_lines(result)])


def legend_lines(result: dict) -> list[str]:
    """What the modes and columns mean."""
    task = get_task(result["task"])
    lines = [f"- {mode}: {task.modes[mode]}" for mode in result["modes"]]
    lines += list(task.legend)
    lines.append("- real tokens/s counts non-pad tokens only; x padded is the ratio to padded taken within each repeat")
    if result["environment"]["device_type"] == "cpu":
        lines.append(
            "- x padded, CPU time: the same ratio on this process's CPU seconds, which other processes on a shared "
            "machine disturb far less than wall-clock time (the headline's figure on a CPU)"
        )
        lines.append(
            "- memory added by the pass: the process RSS high-water mark of the timed pass minus the RSS before it "
            "(the process itself holds several hundred MiB)"
        )
    else:
        lines.append("- memory added by the pass: CUDA allocator peak of the timed pass minus the memory before it")
    return lines


def write_report(result: dict, out_dir: str | Path) -> list[Path]:
    """Write `report_files(result)` into `out_dir` (created if needed): the result as JSON, `summary_text`, the
    throughput and memory plot and the loss curves; returns their paths."""
    from .plots import plot_losses, plot_throughput  # matplotlib, the `bench` extra, is loaded for the plots alone

    out = expand_path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / name for name in report_files(result)]
    paths[0].write_text(json.dumps(result, indent=1) + "\n")
    paths[1].write_text(summary_text(result) + "\n")
    plot_throughput(result, paths[2], title=plot_title(result))
    plot_losses(result, paths[3])
    return paths


def plot_title(result: dict) -> str:
    """What the throughput plot shows: task, model and its size, device, dtype, profile and batch size."""
    config, model, env = result["config"], result["model"], result["environment"]
    device = f"CPU, {env['torch_threads']} thread(s)" if env["device_type"] == "cpu" else f"GPU {env['device']}"
    return (
        f"{result['task']}: {model['model_type']} {format_parameters(model['parameters'])} parameters · {device} · "
        f"{config['dtype']} · profile {config['profile']} · batch {config['batch_size']}"
    )


def format_parameters(count: int) -> str:
    """A parameter count, `"1.2M"` or `"7.62B"`."""
    return f"{count / 1e9:.2f}B" if count >= 1e9 else f"{count / 1e6:.1f}M"


def format_mib(value: int | None) -> str:
    """Bytes as whole MiB with thousands separators, `"n/a"` where memory was not measured."""
    return "n/a" if value is None else f"{value / 2**20:,.0f}"
