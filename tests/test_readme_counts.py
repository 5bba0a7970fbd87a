"""The test counts README.md quotes are true: rounded to the hundred ("about 2,400 tests of about 3,500 in all"), each
within `TOLERANCE` of what pytest collects now, so tests added since the last refresh do not fail it until the figure
is off by more than "about" can carry.

Refresh both figures with the counts this prints (the last lines of each):

    .venv/bin/python -m pytest --collect-only -q -m "not slow" | tail -1     # the fast tier
    .venv/bin/python -m pytest --collect-only -q | tail -1                    # everything
"""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOLERANCE = 0.05
"""Largest relative gap allowed between a quoted count and the collected one."""
QUOTED = re.compile(r"about ([\d,]+) tests of about ([\d,]+) in all")


def quoted() -> tuple[int, int]:
    """(fast tier, all) as README.md's one sentence of test counts quotes them."""
    text = " ".join((ROOT / "README.md").read_text().split())
    matches = QUOTED.findall(text)
    assert len(matches) == 1, f"README.md: {len(matches)} sentences match {QUOTED.pattern!r}; reworded? fix the test"
    return tuple(int(number.replace(",", "")) for number in matches[0])


def collected(*marker: str) -> int:
    """How many tests `pytest --collect-only` finds in this checkout (with `-m` and `marker` when given)."""
    select = ["-m", *marker] if marker else []
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:randomly", *select],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    last = run.stdout.strip().splitlines()[-1]
    match = re.match(r"(\d+)(?:/\d+)? tests? collected", last)
    assert match, f"pytest --collect-only ended with {last!r}:\n{run.stdout[-2000:]}"
    return int(match.group(1))


def test_the_quoted_counts_are_rounded_figures():
    fast, everything = quoted()
    assert fast % 100 == everything % 100 == 0 and fast < everything


@pytest.mark.slow
def test_the_quoted_counts_are_within_the_tolerance_of_the_collected_ones():
    fast, everything = quoted()
    counts = {"fast tier": (fast, collected("not slow")), "all": (everything, collected())}
    off = {name: pair for name, pair in counts.items() if abs(pair[0] - pair[1]) > TOLERANCE * pair[1]}
    assert not off, (
        "README.md's test counts are stale (quoted, collected): "
        + ", ".join(f"{name} {q:,} vs {c:,}" for name, (q, c) in off.items())
        + f"; quote them rounded to the hundred, e.g. about {round(counts['fast tier'][1], -2):,} tests of about "
        f"{round(counts['all'][1], -2):,} in all"
    )
