"""Fresh-process repeats: the run order, the statistics, and workers that are really fresh processes."""

import json
import re
import signal
import sys
import textwrap

import pytest

from flatcollate.bench.repeats import (
    WORKER_FLAG,
    Repeats,
    ratio_spread,
    run_order,
    run_repeats,
    run_worker,
    serve_worker,
    spread,
)


def test_run_order_rotates_the_variants_each_repeat():
    assert run_order(["a", "b", "c"], 4) == [
        (0, "a"), (0, "b"), (0, "c"),
        (1, "b"), (1, "c"), (1, "a"),
        (2, "c"), (2, "a"), (2, "b"),
        (3, "a"), (3, "b"), (3, "c"),
    ]  # fmt: skip


@pytest.mark.parametrize(("variants", "repeats"), [(["a"], 3), (["a", "b"], 5), (list("abcde"), 7)])
def test_every_repeat_runs_every_variant_once_and_each_variant_leads_in_turn(variants, repeats):
    order = run_order(variants, repeats)
    assert len(order) == len(variants) * repeats
    for repeat in range(repeats):
        ran = [variant for r, variant in order if r == repeat]
        assert sorted(ran) == sorted(variants)
        assert ran[0] == variants[repeat % len(variants)]


def test_spread_of_odd_even_and_single_counts():
    assert spread([5.0, 1.0, 3.0]) == {"median": 3.0, "min": 1.0, "max": 5.0, "n": 3}
    assert spread([4.0, 1.0, 2.0, 3.0]) == {"median": 2.5, "min": 1.0, "max": 4.0, "n": 4}
    assert spread([7]) == {"median": 7.0, "min": 7.0, "max": 7.0, "n": 1}


def test_ratio_spread_pairs_repeats_and_reports_the_ratio_of_medians():
    # Per repeat 10/2 = 5, 30/3 = 10, 20/10 = 2: the medians 20 and 3 give 6.67, not the median ratio 5.
    ratio = ratio_spread([10.0, 30.0, 20.0], [2.0, 3.0, 10.0])
    assert ratio["of_medians"] == pytest.approx(20 / 3)
    assert (ratio["median"], ratio["min"], ratio["max"], ratio["n"]) == (5.0, 2.0, 10.0, 3)


def test_the_ratio_of_medians_lies_within_the_per_repeat_ratios():
    import numpy as np

    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 8))
        top, bottom = rng.uniform(0.1, 10, n), rng.uniform(0.1, 10, n)
        ratio = ratio_spread(top, bottom)
        assert ratio["min"] - 1e-12 <= ratio["of_medians"] <= ratio["max"] + 1e-12


def test_ratio_spread_refuses_unpaired_repeats():
    with pytest.raises(ValueError, match="2 numerators and 3 denominators"):
        ratio_spread([1.0, 2.0], [1.0, 2.0, 3.0])


class FakeWorker:
    """Records every run; each variant's figure is its repeat count so far times its factor."""

    def __init__(self, factors: dict[str, float]):
        self.factors, self.calls = factors, []

    def __call__(self, command, payload):
        self.calls.append((payload["case"]["name"], payload["variant"]))
        seen = sum(1 for call in self.calls if call == self.calls[-1])
        return {"ms": seen * self.factors[payload["variant"]], "label": payload["variant"]}


def test_run_repeats_interleaves_variants_within_each_case_and_keeps_repeat_order():
    worker = FakeWorker({"a": 1.0, "b": 2.0})
    cases = [{"name": "x"}, {"name": "y"}]
    saved = []
    runs = run_repeats(
        ["unused"], cases, ["a", "b"], repeats=[3, 1], progress=False, runner=worker, on_case=saved.append
    )
    x_order = [("x", "a"), ("x", "b"), ("x", "b"), ("x", "a"), ("x", "a"), ("x", "b")]
    assert worker.calls == [*x_order, ("y", "a"), ("y", "b")]
    assert [run.case for run in runs] == cases and [len(s) for s in saved] == [1, 2]
    x = runs[0]
    assert x.values("a", "ms") == [1.0, 2.0, 3.0] and x.values("b", "ms") == [2.0, 4.0, 6.0]
    assert x.spread("b", "ms") == {"median": 4.0, "min": 2.0, "max": 6.0, "n": 3}
    assert x.ratio("b", "a", "ms") == {"of_medians": 2.0, "median": 2.0, "min": 2.0, "max": 2.0, "n": 3}
    assert x.first("b", "label") == "b"
    assert runs[1].values("b", "ms") == [2.0]


def test_to_json_summarizes_numeric_figures_only():
    figures = [{"ms": 1.0, "kernel": "sdpa", "ok": True}, {"ms": 3.0, "kernel": "sdpa", "ok": True}]
    run = Repeats({"name": "x"}, {"a": figures})
    data = run.to_json()
    assert set(data) == {"case", "figures", "spreads"}
    assert data["spreads"] == {"a": {"ms": {"median": 2.0, "min": 1.0, "max": 3.0, "n": 2}}}
    json.dumps(data)


@pytest.mark.parametrize(("variants", "repeats"), [([], 3), (["a"], 0), (["a"], [1, 1])])
def test_run_repeats_refuses_no_variant_no_repeat_or_unmatched_counts(variants, repeats):
    with pytest.raises(ValueError, match="at least one variant and one repeat per case"):
        run_repeats(["unused"], [{"name": "x"}], variants, repeats=repeats, progress=False, runner=FakeWorker({}))


WORKER = """
import json, os, sys
from pathlib import Path
from flatcollate.bench.repeats import serve_worker

def crash_inside(depth):
    import ctypes

    if depth:
        crash_inside(depth - 1)
    ctypes.string_at(0)  # reads address 0: SIGSEGV, no Python exception, no output of its own

def measure(case, variant):
    print("noise from the code under test")
    with open(case["log"], "a") as log:
        log.write(json.dumps([variant, os.getpid()]) + "\\n")
    if variant == "broken":
        sys.exit("the worker failed on purpose")
    if variant == "unnamed signal":
        import signal

        os.kill(os.getpid(), signal.SIGRTMIN + 6)  # terminates; the signal module has no name for it
    if variant == "crashing":
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file where the test runs
        print("warnings before the crash " * 200, file=sys.stderr)
        crash_inside(depth=80)
    return {"value": case["base"] * len(variant), "pid": os.getpid()}

assert serve_worker(sys.argv[1:], measure)
"""


@pytest.fixture
def worker_script(tmp_path):
    path = tmp_path / "worker.py"
    path.write_text(textwrap.dedent(WORKER))
    return [sys.executable, str(path)]


@pytest.mark.slow
def test_every_run_is_a_fresh_process_in_the_interleaved_order(worker_script, tmp_path):
    log = tmp_path / "log.jsonl"
    (run,) = run_repeats(worker_script, [{"base": 2, "log": str(log)}], ["a", "bb"], repeats=2, progress=False)
    ran = [json.loads(line) for line in log.read_text().splitlines()]
    assert [variant for variant, _ in ran] == ["a", "bb", "bb", "a"]
    assert len({pid for _, pid in ran}) == 4  # four processes, none reused
    assert run.values("a", "value") == [2, 2] and run.values("bb", "value") == [4, 4]
    assert run.values("a", "pid") == [ran[0][1], ran[3][1]]


@pytest.mark.slow
def test_a_failing_worker_names_the_run_and_shows_its_stderr(worker_script, tmp_path):
    payload = {"case": {"base": 1, "log": str(tmp_path / "log.jsonl")}, "variant": "broken"}
    with pytest.raises(RuntimeError, match=r"(?s)exited with status 1.*the worker failed on purpose"):
        run_worker(worker_script, payload)


@pytest.mark.slow
def test_a_worker_killed_by_a_signal_names_it_and_shows_where_it_was(worker_script, tmp_path):
    """A segmentation fault prints nothing by itself: the worker's Python stack (faulthandler) says where, innermost
    frame first, even when the stack and the output before it are longer than the end of stderr shown otherwise."""
    payload = {"case": {"base": 1, "log": str(tmp_path / "log.jsonl")}, "variant": "crashing"}
    with pytest.raises(RuntimeError) as raised:
        run_worker(worker_script, payload)
    message = str(raised.value)
    assert "killed by SIGSEGV (status -11)" in message
    assert "Fatal Python error: Segmentation fault" in message
    assert re.search(r"line \d+ in string_at\n.*worker\.py\", line \d+ in crash_inside", message), message
    assert re.search(r"worker\.py\", line \d+ in measure", message), message


@pytest.mark.slow
def test_a_worker_killed_by_a_signal_without_a_name_is_reported_by_its_number(worker_script, tmp_path):
    payload = {"case": {"base": 1, "log": str(tmp_path / "log.jsonl")}, "variant": "unnamed signal"}
    number = signal.SIGRTMIN + 6
    with pytest.raises(RuntimeError, match=rf"was killed by signal {number} \(status -{number}\)"):
        run_worker(worker_script, payload)


def test_serve_worker_answers_only_the_worker_flag(capsys):
    assert serve_worker([WORKER_FLAG, json.dumps({"case": {"n": 3}, "variant": "v"})], lambda c, v: {"n": c["n"]})
    assert capsys.readouterr().out.splitlines()[-1] == '{"n": 3}'
    assert not serve_worker(["--repeats", "3"], lambda c, v: {})
    assert not serve_worker([], lambda c, v: {})


def test_progress_bar_counts_every_run_on_stderr(capsys):
    run_repeats(["unused"], [{"name": "x"}], ["a", "b"], repeats=3, runner=FakeWorker({"a": 1, "b": 1}))
    err = capsys.readouterr().err
    assert "6/6" in err and "x" in err
