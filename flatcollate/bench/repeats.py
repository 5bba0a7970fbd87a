"""Benchmark repeats in fresh processes: every run of a (case, variant) is its own Python process, the variants take
turns within each repeat, and every figure is summarized as the median over repeats with its min-max.

A benchmark script re-invokes itself as a worker, `python script.py --worker '{"case": ..., "variant": ...}'`; the
worker measures that one variant of that one case and prints its figures as one JSON line (`serve_worker`). A fresh
process per run means no variant inherits another's caches, allocator state, threads or compiled code. The order
rotates by one each repeat, so a slow phase of a shared machine does not always fall on the same variant::

    repeat 0:  A  B  C
    repeat 1:  B  C  A
    repeat 2:  C  A  B

A ratio between two variants is reported two ways (`ratio_spread`): the ratio of their medians, the figure to quote,
and the ratio within each repeat, whose min-max is the spread quoted with it.
"""

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

WORKER_FLAG = "--worker"
"""First argument of a worker process; the second is the JSON payload `{"case": ..., "variant": ...}`."""

Runner = Callable[[Sequence[str], dict], dict]
"""`runner(command, payload) -> figures`: how one run is carried out (`run_worker`, or a stand-in in tests)."""


def run_order(variants: Sequence[str], repeats: int) -> list[tuple[int, str]]:
    """`(repeat, variant)` in the order they run: every variant once per repeat, the order rotated by one each repeat.

    >>> run_order(["a", "b", "c"], 2)
    [(0, 'a'), (0, 'b'), (0, 'c'), (1, 'b'), (1, 'c'), (1, 'a')]
    """
    n = len(variants)
    return [(repeat, variants[(repeat + i) % n]) for repeat in range(repeats) for i in range(n)]


def spread(values: Sequence[float]) -> dict:
    """Median, min, max and count of `values`.

    >>> spread([3.0, 1.0, 2.0, 10.0])
    {'median': 2.5, 'min': 1.0, 'max': 10.0, 'n': 4}
    """
    values = np.asarray(values, dtype=np.float64)
    return {
        "median": float(np.median(values)),
        "min": float(values.min()),
        "max": float(values.max()),
        "n": values.size,
    }


def ratio_spread(numerators: Sequence[float], denominators: Sequence[float]) -> dict:
    """`numerators / denominators`, paired by repeat: `of_medians` is the ratio of the two medians (the figure to
    quote); `median`, `min`, `max` and `n` are those of the ratio within each repeat. `of_medians` always lies within
    `min`-`max`: a ratio at least r in every repeat is at least r between the medians.

    >>> ratio_spread([4.0, 6.0, 9.0], [2.0, 2.0, 3.0])
    {'of_medians': 3.0, 'median': 3.0, 'min': 2.0, 'max': 3.0, 'n': 3}
    """
    top, bottom = np.asarray(numerators, dtype=np.float64), np.asarray(denominators, dtype=np.float64)
    if top.shape != bottom.shape:
        raise ValueError(f"Ratios pair repeats: got {top.size} numerators and {bottom.size} denominators.")
    return {"of_medians": float(np.median(top) / np.median(bottom)), **spread(top / bottom)}


@dataclass(frozen=True)
class Repeats:
    """What the repeats of one case measured.

    Args:
        case (`dict`): the case, as the workers got it.
        figures (`dict[str, list[dict]]`): per variant, the figures each repeat's worker printed, in repeat order.
    """

    case: dict
    figures: dict[str, list[dict]]

    def values(self, variant: str, key: str) -> list[float]:
        """`key` of `variant` in every repeat, in repeat order."""
        return [figures[key] for figures in self.figures[variant]]

    def spread(self, variant: str, key: str) -> dict:
        """Median and min-max of `key` over the repeats of `variant`."""
        return spread(self.values(variant, key))

    def ratio(self, numerator: str, denominator: str, key: str) -> dict:
        """`key` of `numerator` over `key` of `denominator`, within each repeat and of the medians (`ratio_spread`)."""
        return ratio_spread(self.values(numerator, key), self.values(denominator, key))

    def first(self, variant: str, key: str):
        """`key` of `variant`'s first repeat: for what every repeat computes alike (token counts, packs)."""
        return self.figures[variant][0][key]

    def to_json(self) -> dict:
        """The case, the raw figures and, for every numeric figure, its median and min-max over the repeats."""
        spreads = {}
        for variant, runs in self.figures.items():
            numeric = [key for key, value in runs[0].items() if _is_number(value)]
            spreads[variant] = {key: self.spread(variant, key) for key in numeric}
        return {"case": self.case, "figures": self.figures, "spreads": spreads}


def _is_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def run_repeats(
    command: Sequence[str],
    cases: Sequence[dict],
    variants: Sequence[str],
    *,
    repeats: int | Sequence[int],
    label: Callable[[dict], str] = str,
    progress: bool = True,
    on_case: Callable[[list[Repeats]], None] | None = None,
    runner: Runner | None = None,
) -> list[Repeats]:
    """Run every variant of every case `repeats` times, each run a fresh process, variants in `run_order`.

    Args:
        command (`Sequence[str]`): how to start a worker, e.g. `[sys.executable, __file__]`; `run_worker` appends
            `--worker <payload>`.
        cases (`Sequence[dict]`): JSON-ready descriptions of what to measure, one after the other.
        variants (`Sequence[str]`): what is compared within a case; they take turns within each repeat.
        repeats (`int` or `Sequence[int]`): repeats of every case, or of each case.
        label (`Callable`): a case's name on the progress bar.
        progress (`bool`): a progress bar over the runs on stderr.
        on_case (`Callable`, *optional*): called with the results so far after every case (to save a long run).
        runner (`Runner`, *optional*): carries out one run; default `run_worker`.

    Returns:
        `list[Repeats]`, one per case.
    """
    from tqdm.auto import tqdm

    counts = [repeats] * len(cases) if isinstance(repeats, int) else list(repeats)
    if len(counts) != len(cases) or min(counts, default=1) < 1 or not variants:
        raise ValueError(f"Need at least one variant and one repeat per case; got {variants} and {counts}.")
    run = runner or run_worker
    results = []
    with tqdm(total=len(variants) * sum(counts), unit="run", disable=not progress) as bar:
        for case, count in zip(cases, counts, strict=True):
            figures = {variant: [] for variant in variants}
            for repeat, variant in run_order(variants, count):
                bar.set_description(f"{label(case)} {variant} (repeat {repeat + 1}/{count})")
                figures[variant].append(run(command, {"case": case, "variant": variant}))
                bar.update(1)
            results.append(Repeats(case, figures))
            if on_case is not None:
                on_case(list(results))
    return results


def run_worker(command: Sequence[str], payload: dict) -> dict:
    """Run `command --worker <payload as JSON>` in a fresh process; return the figures its last output line holds.
    The worker runs with Python's `faulthandler` on, so a crash in native code (a segmentation fault, which prints
    nothing by itself) leaves the worker's Python stack on its stderr.

    Raises:
        `RuntimeError` naming the payload, the exit status (the signal, where one killed the worker) and the end of
        the worker's stderr, if it fails.
    """
    text = json.dumps(payload)
    environment = {**os.environ, "PYTHONFAULTHANDLER": "1"}
    done = subprocess.run([*command, WORKER_FLAG, text], capture_output=True, text=True, env=environment)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        status = f"exited with status {done.returncode}"
        if done.returncode < 0:
            names = {number.value: number.name for number in signal.Signals}  # real-time signals have none
            killer = names.get(-done.returncode, f"signal {-done.returncode}")
            status = f"was killed by {killer} (status {done.returncode})"
        raise RuntimeError(f"The worker for {text} {status}; its stderr ends:\n{stderr_tail(done.stderr)}")
    return json.loads(lines[-1])


def stderr_tail(stderr: str) -> str:
    """What a failed worker's message shows of its stderr: from the crash report of `faulthandler` on (its innermost
    frame first, the list of extension modules last), or else the last 3,000 characters (a traceback ends there).

    >>> stderr_tail("warning\\nFatal Python error: Segmentation fault\\n  File ...")
    'Fatal Python error: Segmentation fault\\n  File ...'
    """
    start = stderr.rfind("Fatal Python error")
    return stderr[start : start + 12_000] if start >= 0 else stderr[-3000:]


def serve_worker(argv: Sequence[str], measure: Callable[[dict, str], dict]) -> bool:
    """In a worker process (`argv` is `--worker <payload>`), print `measure(case, variant)` as one JSON line and
    return True; anywhere else return False.

    >>> serve_worker(["--worker", '{"case": {"n": 2}, "variant": "a"}'], lambda case, v: {"x": case["n"], "v": v})
    {"x": 2, "v": "a"}
    True
    >>> serve_worker(["--repeats", "5"], lambda case, v: {})
    False
    """
    if len(argv) != 2 or argv[0] != WORKER_FLAG:
        return False
    payload = json.loads(argv[1])
    figures = measure(payload["case"], payload["variant"])
    sys.stdout.flush()  # what the benchmarked code printed comes first: the figures must be the last line
    print(json.dumps(figures), flush=True)
    return True


def format_spread(figure: dict, digits: int = 1, *, scale: float = 1.0) -> str:
    """`median (min-max)`, each times `scale`, with `digits` decimals and thousands separators.

    >>> format_spread({"median": 1021.4, "min": 990.0, "max": 1208.2}, 0)
    '1,021 (990-1,208)'
    """
    median, low, high = (figure[key] * scale for key in ("median", "min", "max"))
    return f"{median:,.{digits}f} ({low:,.{digits}f}-{high:,.{digits}f})"
