"""`flatcollate bench --task dpo|reward`: the printed summary, the markdown table, the plot and the report files of a
DPO or reward benchmark result (`flatcollate.bench.dpo.run_dpo_bench`, `flatcollate.bench.reward.run_reward_bench`);
the result's `task` picks the names."""

from pathlib import Path

from matplotlib.figure import Figure  # no pyplot: the user's backend and global figure state stay untouched
from matplotlib.ticker import MaxNLocator

from .config import TASKS
from .repeats import format_spread
from .report import format_mib, format_parameters, format_repeat_ratio, headline_lines, write_files

DPO_REPORT_FILES = ("dpo.json", "dpo.md", "dpo.png")
"""What `write_dpo_report` puts in its output folder for a DPO result."""

REWARD_REPORT_FILES = ("reward.json", "reward.md", "reward.png")
"""What `write_dpo_report` puts in its output folder for a reward result."""



def task_names(result: dict) -> dict[str, str]:
    """`TASKS` entry of a result (`"dpo"` for results that predate the `task` field)."""
    return TASKS[result.get("task", "dpo")]


def trainers(result: dict) -> dict[str, str]:
    """What each mode is, for the legend under the table."""
    names = task_names(result)
    return {
        "padded": f"trl.{names['padded']}: each batch's 2N sequences padded to the longest, attention_mask, sdpa",
        "flattened": f"flatcollate {names['flattened']}: the 2N sequences in one flattened row, the flatcollate "
        "backend",
    }


def dpo_markdown_table(result: dict) -> str:
    """One row per trainer: real tokens/s (median, min-max), ratio to padded, seconds per optimizer step, peak
    memory and what the timed steps added, padding of its batches, optimizer steps."""
    on_cpu = result["environment"]["device_type"] == "cpu"
    memory = "peak RSS" if on_cpu else "peak CUDA memory"
    lines = [
        "| trainer | real tokens/s (median, min-max) | x padded (min-max) | x padded, CPU time | seconds per "
        f"optimizer step | {memory} MiB | memory added by the timed steps MiB | padding | optimizer steps |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for mode, row in result["modes"].items():
        ratios = [result["ratio"][key] for key in ("tokens_per_s", "tokens_per_cpu_s")]
        ratio, cpu_ratio = ("1.00", "1.00") if mode == "padded" else map(format_repeat_ratio, ratios)
        lines.append(
            f"| {mode} | {format_spread(row['tokens_per_s'], 0)} | {ratio} | {cpu_ratio} "
            f"| {row['seconds_per_step']['median']:.3f} | {format_mib(row['peak_memory_bytes'])} "
            f"| {format_mib(row['peak_memory_over_baseline_bytes'])} | {row['padding_fraction']:.1%} "
            f"| {', '.join(map(str, row['optimizer_steps']))} |"
        )
    return "\n".join(lines) + "\n"


def setup_lines(result: dict) -> list[str]:
    """What was measured where: model, device, profile and sizes, the pairs drawn and their padding."""
    config, pairs, env, model = result["config"], result["pairs"], result["environment"], result["model"]
    names = task_names(result)
    device = "CPU" if env["device_type"] == "cpu" else "GPU"
    threads = f", {env['torch_threads']} torch thread(s)" if device == "CPU" else ""
    checkpointing = "on" if env["gradient_checkpointing"] else "off"
    return [
        f"model {model['model_type']} ({'tiny' if config['tiny'] else 'full'} config: {format_parameters(model)} "
        f"parameters, hidden {model['hidden_size']}, {model['num_hidden_layers']} layers), random weights, "
        f"{config['dtype']}, {names['model']}; AdamW lr {config['lr']:g} constant; gradient checkpointing "
        f"{checkpointing} ({names['args']}'s default)",
        f"device {device} ({env['device']}){threads}; pair profile {config['profile']}, {config['batch_size']} pairs "
        f"({2 * config['batch_size']} sequences) per step, max_length {config['max_length']}, {config['warmup_steps']} "
        f"warm-up + {config['steps']} timed steps, {config['repeats']} repeats (each run a fresh process, the "
        "trainers taking turns)",
        f"{pairs['pairs']} pairs drawn ({pairs['timed_pairs']} in the timed steps), mean sequence length "
        f"{pairs['mean_sequence_length']:.0f} tokens (reply + eos), longest {pairs['longest_sequence']}, "
        f"{pairs['truncated_sequences']} sequences truncated to max_length",
        f"padding of {names['padded']}'s batches: {result['modes']['padded']['padding_fraction']:.1%} for the timed "
        "pairs, "
        f"{pairs['profile_padding_fraction']:.1%} over 20,000 pairs of the profile",
    ]


def legend_lines(result: dict) -> list[str]:
    """What the trainers and columns mean."""
    names = task_names(result)
    lines = [f"- {mode}: {trainers(result)[mode]}" for mode in result["modes"]]
    lines += [
        "- real tokens/s counts the tokens of the 2N sequences (prompt + reply + eos), not padding, over the timed "
        "steps; a step runs from the end of the step before to its own end ("
        f"{names['step']})",
        "- x padded: the median of the ratios taken within each repeat, with their min-max; CPU time: the same on "
        "each process's CPU seconds, which other work on a shared machine disturbs less (the headline's figure on a "
        "CPU)",
        f"- padding: pad tokens / all tokens of the (2N, L) batches {names['padded']} trains on",
    ]
    return lines


def dpo_summary_text(result: dict) -> str:
    """What `flatcollate bench --task dpo|reward` prints: the command, the setup, the table with its legend, the loss
    agreement and, last, the headline."""
    gap = result["loss_equivalence"]
    lines = [f"command: `{result['command']}`", ""] if result.get("command") else []
    lines += [*setup_lines(result), "", dpo_markdown_table(result), *legend_lines(result)]
    lines.append(
        f"loss per step, padded vs flattened over {gap['steps']} steps: max abs difference "
        f"{gap['max_abs_loss_diff']:.2e}"
    )
    return "\n".join([*lines, "", *headline_lines(result)])  # the headline rule of every benchmark


def write_dpo_report(result: dict, out_dir: str | Path) -> list[Path]:
    """Write `DPO_REPORT_FILES` (`REWARD_REPORT_FILES` for a reward result) into `out_dir` (created if needed);
    returns their paths."""
    files = REWARD_REPORT_FILES if result.get("task") == "reward" else DPO_REPORT_FILES
    return write_files(result, out_dir, files, dpo_summary_text, (plot_dpo,))


def plot_dpo(result: dict, path: Path) -> None:
    """Real tokens/s per trainer (median, min-max whiskers, labelled) and both trainers' loss per optimizer step."""
    modes, name = list(result["modes"]), task_names(result)["name"]
    spreads = [result["modes"][mode]["tokens_per_s"] for mode in modes]
    fig = Figure(figsize=(11, 4.5))
    left, right = fig.subplots(1, 2)
    medians = [s["median"] for s in spreads]
    errors = [[s["median"] - s["min"] for s in spreads], [s["max"] - s["median"] for s in spreads]]
    bars = left.bar(modes, medians, yerr=errors, capsize=4, color=["tab:blue", "tab:green"][: len(modes)])
    ratio = result["ratio"]["tokens_per_s"]["median"]  # the bars are wall-clock tokens/s
    labels = [
        f"{m:,.0f}" + (f"\n{ratio:.2f}x" if mode == "flattened" else "") for mode, m in zip(modes, medians, strict=True)
    ]
    left.bar_label(bars, labels=labels, label_type="center", color="white")
    left.set_ylabel("real tokens per second")
    left.set_title(f"{name} training throughput (median, min-max)")
    for mode, style, width in (("padded", "-", 4), ("flattened", "--", 2)):
        losses = result["modes"][mode]["losses"]
        right.plot(range(1, len(losses) + 1), losses, style, linewidth=width, marker="o", label=mode)
    warmup = result["config"]["warmup_steps"]
    if warmup:
        right.axvspan(0.5, warmup + 0.5, color="grey", alpha=0.15, label="warm-up (untimed)")
    right.xaxis.set_major_locator(MaxNLocator(integer=True))
    gap = result["loss_equivalence"]["max_abs_loss_diff"]
    right.set_title(f"{name} loss per optimizer step\npadded vs flattened: max |diff| = {gap:.1e}")
    right.set_xlabel("optimizer step")
    right.set_ylabel("loss")
    right.legend()
    config, model, env = result["config"], result["model"], result["environment"]
    device = f"CPU, {env['torch_threads']} thread(s)" if env["device_type"] == "cpu" else f"GPU {env['device']}"
    fig.suptitle(
        f"{model['model_type']} {format_parameters(model)} parameters · {device} · {config['dtype']} · pairs "
        f"{config['profile']} · {config['batch_size']} pairs per step"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
