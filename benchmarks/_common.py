"""What the scripts in this folder share: their parser (one-line errors, exit status 2), the `--repeats` and
`--no-progress` options of fresh-process repeats (`flatcollate.bench.repeats`), the clocks and a timing loop, the
command that reproduces a run, the ratio format, and the JSON and markdown files they write.

Not a benchmark itself: each script imports it from its own folder (`python benchmarks/<script>.py` puts that folder
first on `sys.path`).
"""

import argparse
import json
import shlex
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from flatcollate.cli import ArgumentParser, HelpFormatter, positive_int

DEFAULT_REPEATS = 5
"""Fresh-process runs of every variant unless `--repeats` says otherwise."""

CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}
"""`cpu`: this process's CPU seconds (all threads), which other work on a shared machine disturbs far less than
wall-clock seconds (`wall`)."""


def script_parser(script: str | Path, doc: str) -> argparse.ArgumentParser:
    """A parser named after the script (`benchmarks/<name>.py`), its docstring as description; a mistake is one line
    and exit status 2."""
    path = Path(script)
    return ArgumentParser(prog=f"{path.parent.name}/{path.name}", description=doc, formatter_class=HelpFormatter)


def add_repeat_arguments(parser: argparse.ArgumentParser, *, repeats: int = DEFAULT_REPEATS) -> None:
    """`--repeats` (fresh-process runs of every variant, interleaved) and `--no-progress`."""
    parser.add_argument(
        "--repeats",
        type=positive_int,
        default=repeats,
        help="runs of every variant, each in a fresh process, the variants taking turns; figures are the median "
        "over them, with their min-max",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def time_calls(
    call: Callable[[], object],
    *,
    iterations: int,
    warmup: int = 0,
    clock: str = "wall",
    synchronize: Callable[[], None] | None = None,
) -> list[float]:
    """Milliseconds of each of `iterations` calls of `call`, after `warmup` untimed ones; `synchronize` (a device
    synchronization) runs before the clock starts and before it stops."""
    wait = synchronize or (lambda: None)
    for _ in range(warmup):
        call()
    now, times = CLOCKS[clock], []
    for _ in range(iterations):
        wait()
        start = now()
        call()
        wait()
        times.append((now() - start) * 1e3)
    return times


def command_line(script: str | Path, argv: Sequence[str]) -> str:
    """The command that reproduces a run, `python benchmarks/<script> <argv>`, quoted for a POSIX shell."""
    path = Path(script)
    return shlex.join(["python", f"{path.parent.name}/{path.name}", *argv])


def format_ratio(ratio: dict, digits: int = 2) -> str:
    """A `flatcollate.bench.repeats.ratio_spread` as `of_medians (min-max of the per-repeat ratios)`."""
    return f"{ratio['of_medians']:.{digits}f} ({ratio['min']:.{digits}f}-{ratio['max']:.{digits}f})"


def write_results(folder: str | Path | None, stem: str, payload: dict, table: str) -> list[Path]:
    """Write `<stem>.json` (`payload`) and `<stem>.md` (`table`) into `folder` (created if needed); nothing when
    `folder` is None. Returns the paths written."""
    if folder is None:
        return []
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{stem}.json", out / f"{stem}.md"]
    paths[0].write_text(json.dumps(payload, indent=1) + "\n")
    paths[1].write_text(table + "\n")
    return paths
