"""Write a throughput result as JSON, a markdown table, PNG plots and a short printed summary."""

import json
from pathlib import Path

from matplotlib.figure import Figure  # no pyplot: the user's backend and global figure state stay untouched

REPORT_FILES = ("throughput.json", "throughput.md", "throughput.png", "loss_curves.png")
"""What `write_report` puts in its output folder."""


def markdown_table(result: dict) -> str:
    """One row per mode: real tokens/s (median, min-max), ratio to padded, step time, peak memory, padding, steps."""
    ratios = result["ratios_vs_padded"]
    on_cpu = result["environment"]["device_type"] == "cpu"
    cpu_header = " x padded, CPU time |" if on_cpu else ""
    lines = [
        f"| mode | real tokens/s (median, min-max) | x padded (min-max) |{cpu_header} step s "
        "| peak memory MiB (added) | padding | steps/epoch |",
        "|---|---|---|---|---|---|---|" + ("---|" if on_cpu else ""),
    ]
    for mode, row in result["modes"].items():
        tps = row["tokens_per_s"]
        ratio_text = _ratio(ratios.get(mode, {}).get("tokens_per_s"))
        cpu_text = f" {_ratio(ratios.get(mode, {}).get('tokens_per_cpu_s'))} |" if on_cpu else ""
        lines.append(
            f"| {mode} | {tps['median']:,.0f} ({tps['min']:,.0f}-{tps['max']:,.0f}) | {ratio_text} |{cpu_text} "
            f"{row['step_s']['median']:.3f} | {_mib(row['peak_memory_bytes'])} "
            f"({_mib(row['peak_memory_over_baseline_bytes'])}) | {row['padding_fraction']:.1%} "
            f"| {row['steps_per_epoch']} |"
        )
    return "\n".join(lines) + "\n"


def summary_text(result: dict) -> str:
    """What `flatcollate bench` prints: the setup, padding efficiency, the table, loss equivalence, skipped modes."""
    config, pool, env = result["config"], result["pool"], result["environment"]
    modes = result["modes"]
    lines = [
        f"model {config['model']} ({'tiny' if config['tiny'] else 'full'} config), profile {config['profile']}, "
        f"batch {config['batch_size']}, max_length {config['max_length']}, {config['repeats']} repeats, "
        f"device {env['device_type']} ({env['device']}), flattened attention {env['flattened_attn']}",
        f"{pool['sequences']} sequences, {pool['real_tokens']} real tokens, mean length {pool['mean_length']:.0f}, "
        f"{pool['truncated']} truncated to max_length",
    ]
    if "padded" in modes:
        fill = 1 - modes["padded"]["padding_fraction"]
        lines.append(
            f"padding efficiency of padded batches: {fill:.1%} real tokens "
            f"(they compute {1 / fill:.2f}x the tokens a flattened batch does)"
        )
    lines += ["", markdown_table(result)]
    if env["device_type"] == "cpu":
        lines.append(
            "x padded, CPU time: the same ratio on this process's CPU seconds, which other processes on a shared "
            "machine disturb far less than wall-clock time"
        )
    steps = {mode: row["steps_per_epoch"] for mode, row in modes.items()}
    lines.append("optimizer steps per epoch: " + ", ".join(f"{m} {n}" for m, n in steps.items()))
    if result["loss_equivalence"]:
        diff = result["loss_equivalence"]["max_abs_loss_diff"]
        lines.append(f"loss curves padded vs flattened: max abs difference {diff:.2e}")
    for mode, reason in result["skipped"].items():
        lines.append(f"skipped {mode}: {reason}")
    return "\n".join(lines)


def write_report(result: dict, out_dir: str | Path) -> list[Path]:
    """Write `REPORT_FILES` into `out_dir` (created if needed); returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / name for name in REPORT_FILES]
    paths[0].write_text(json.dumps(result, indent=1) + "\n")
    paths[1].write_text(f"```\n{summary_text(result)}\n```\n\n{markdown_table(result)}")
    plot_throughput(result, paths[2])
    plot_losses(result, paths[3])
    return paths


def plot_throughput(result: dict, path: Path) -> None:
    """Bars of real tokens/s (min-max whiskers) and peak memory per mode."""
    modes = list(result["modes"])
    rows = [result["modes"][m] for m in modes]
    fig = Figure(figsize=(10, 4))
    left, right = fig.subplots(1, 2)
    medians = [r["tokens_per_s"]["median"] for r in rows]
    errors = [
        [r["tokens_per_s"]["median"] - r["tokens_per_s"]["min"] for r in rows],
        [r["tokens_per_s"]["max"] - r["tokens_per_s"]["median"] for r in rows],
    ]
    left.bar(modes, medians, yerr=errors, capsize=4, color="tab:blue")
    left.set_ylabel("real (non-pad) tokens / s")
    left.set_title("training throughput (median, min-max)")
    memory = [(r["peak_memory_bytes"] or 0) / 2**20 for r in rows]
    right.bar(modes, memory, color="tab:orange")
    right.set_ylabel("peak memory (MiB)")
    kind = "CUDA allocator peak" if result["environment"]["device_type"] == "cuda" else "process RSS high-water"
    right.set_title(f"peak memory ({kind})")
    config = result["config"]
    fig.suptitle(f"{config['model']} · profile {config['profile']} · batch {config['batch_size']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_losses(result: dict, path: Path) -> None:
    """Loss per optimizer step of every mode; padded and flattened must lie on top of each other."""
    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    styles = {"padded": ("-", 4), "flattened": ("--", 2)}
    for mode, row in result["modes"].items():
        style, width = styles.get(mode, (":", 1.5))
        ax.plot(range(1, len(row["losses"]) + 1), row["losses"], style, linewidth=width, marker="o", label=mode)
    equivalence = result["loss_equivalence"]
    title = "loss per optimizer step"
    if equivalence:
        title += f"\npadded vs flattened: max |diff| = {equivalence['max_abs_loss_diff']:.1e}"
    ax.set_title(title)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _ratio(spread: dict | None) -> str:
    return f"{spread['median']:.2f} ({spread['min']:.2f}-{spread['max']:.2f})" if spread else "-"


def _mib(value: int | None) -> str:
    return "n/a" if value is None else f"{value / 2**20:,.0f}"
