"""What the scripts in `benchmarks/` share with each other (their parser: one-line errors, exit status 2; the
`--repeats` and `--no-progress` options of fresh-process repeats, `flatcollate.bench.repeats`; the clocks, a timing
loop, the JSON and markdown files they write) and with `flatcollate bench` (the argparse types of counts and rates).
"""

import argparse
import json
import math
import time
from collections.abc import Callable
from pathlib import Path

from ..cli import ArgumentParser, HelpFormatter

DEFAULT_REPEATS = 5
"""Fresh-process runs of every variant unless `--repeats` says otherwise."""

CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}
"""`cpu`: this process's CPU seconds (all threads), which other work on a shared machine disturbs far less than
wall-clock seconds (`wall`)."""


def script_parser(script: str | Path, doc: str) -> argparse.ArgumentParser:
    """A parser named after the script, its docstring as description; a mistake is one line and exit status 2."""
    path = Path(script)
    return ArgumentParser(prog=f"{path.parent.name}/{path.name}", description=doc, formatter_class=HelpFormatter)


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1, else a one-line error naming the value."""
    return _at_least(text, 1, "a positive integer")


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0, else a one-line error naming the value."""
    return _at_least(text, 0, "an integer >= 0")


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0, else a one-line error naming the value."""
    error = argparse.ArgumentTypeError(f"expected a positive, finite number, got {text!r}")
    try:
        value = float(text)
    except ValueError:
        raise error from None
    if not (math.isfinite(value) and value > 0):
        raise error
    return value


def _at_least(text: str, minimum: int, what: str) -> int:
    error = argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    try:
        value = int(text)
    except ValueError:
        raise error from None
    if value < minimum:
        raise error
    return value


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
