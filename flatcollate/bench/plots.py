"""The benchmark report's plots (`report.write_report` draws them): throughput against padded with the memory each
timed pass added, and the loss curves of every mode.

matplotlib is not a dependency of the library: it comes with the `bench` extra, and `flatcollate bench` refuses to
start without it (`options.check_plotting`), naming what to install.
"""

from pathlib import Path

from .config import OWN_BATCHES, PEER_MODE

INSTALL = 'pip install "flatcollate[bench]"'

try:
    from matplotlib.figure import Figure  # no pyplot: the user's backend and global figure state stay untouched
    from matplotlib.ticker import MaxNLocator
except ModuleNotFoundError as error:
    raise ModuleNotFoundError(
        f"flatcollate bench draws its plots with matplotlib ({error}): {INSTALL}", name=error.name
    ) from None


def plot_throughput(result: dict, path: Path, *, title: str) -> None:
    """Bars of the ratio to padded (min-max whiskers, labelled) and of the memory each timed pass added, under
    `title`."""
    modes = list(result["modes"])
    on_cpu = result["environment"]["device_type"] == "cpu"
    key = "tokens_per_cpu_s" if on_cpu else "tokens_per_s"
    spreads = [result["ratios_vs_padded"].get(m, {}).get(key) for m in modes]
    fig = Figure(figsize=(11, 4.5))
    left, right = fig.subplots(1, 2)
    if all(spreads):
        medians = [s["median"] for s in spreads]
        errors = [[s["median"] - s["min"] for s in spreads], [s["max"] - s["median"] for s in spreads]]
        bars = left.bar(modes, medians, yerr=errors, capsize=4, color=[_color(m) for m in modes])
        left.bar_label(bars, labels=[f"{m:.2f}x" for m in medians], label_type="center", color="white")
        left.axhline(1.0, color="grey", linewidth=0.8)
        metric = "real tokens per CPU second" if on_cpu else "real tokens per second"
        left.set_ylabel(f"{metric}, x padded")
        left.set_title("training throughput vs padded (median, min-max)")
    memory = [(result["modes"][m]["peak_memory_over_baseline_bytes"] or 0) / 2**20 for m in modes]
    bars = right.bar(modes, memory, color="tab:orange")
    right.bar_label(bars, labels=[f"{m:,.0f}" for m in memory])
    right.margins(y=0.12)  # room for the labels above the tallest bar
    right.set_ylabel("MiB")
    right.set_title("memory added by the timed pass (" + ("RSS" if on_cpu else "CUDA allocator") + ")")
    for ax in (left, right):
        ax.tick_params(axis="x", labelrotation=20)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_losses(result: dict, path: Path) -> None:
    """Loss per optimizer step of every mode; padded and flattened must lie on top of each other, and a mode that
    trains on batches of its own (`OWN_BATCHES`: packed) says so in its legend entry."""
    fig = Figure(figsize=(6, 5))
    ax = fig.subplots()
    styles = {"padded": ("-", 4), "flattened": ("--", 2)}
    for mode, row in result["modes"].items():
        style, width = styles.get(mode, (":", 1.5))
        label = f"{mode}: {OWN_BATCHES[mode]}, so another curve" if mode in OWN_BATCHES else mode
        ax.plot(range(1, len(row["losses"]) + 1), row["losses"], style, linewidth=width, marker="o", label=label)
    equivalence = result["loss_equivalence"]
    title = "loss per optimizer step"
    if equivalence:
        title += f"\npadded vs flattened: max |diff| = {equivalence['max_abs_loss_diff']:.1e}"
    ax.set_title(title)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.15), fontsize="small", frameon=False)  # under the curves
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _color(mode: str) -> str:
    return {"flattened": "tab:green", "packed": "tab:green", PEER_MODE: "tab:purple"}.get(mode, "tab:blue")
