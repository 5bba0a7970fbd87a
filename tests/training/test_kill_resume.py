"""A two-process job killed (SIGKILL) after a mid-epoch checkpoint resumes exactly where an uninterrupted job would be.

Three launches of `examples/accelerate/fsdp2_train.py` over gloo on the CPU: an uninterrupted run; the same run killed
once checkpoint `K` is complete (every process, torchrun and both workers, with SIGKILL: nothing is flushed or closed);
and a relaunch with `--resume`. The resumed run must train on the same batches, with the same losses, and end with the
same parameters as the uninterrupted one. SGD with momentum, so the optimizer state must come back too.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from .launch import free_port, needs_gloo

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "accelerate" / "fsdp2_train.py"
CHECKPOINT_EVERY = 2

pytestmark = [needs_gloo, pytest.mark.slow]


def command(output: Path, checkpoints: Path, *args: str) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
        "--master_port", str(free_port()), str(SCRIPT), "--output", str(output), "--checkpoint-dir", str(checkpoints),
        "--checkpoint-every", str(CHECKPOINT_EVERY), "--num-examples", "40", "--pack-len", "48",
        "--accumulation", "2", "--momentum", "0.9", *args,
    ]  # fmt: skip


ENV = {**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"}


def read_steps(output: Path) -> list[dict]:
    return [json.loads(line) for line in (output / "steps.jsonl").read_text().splitlines()]


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` (torchrun starts its workers in sessions of their own)."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:  # ended meanwhile
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = [], [pid]
    while frontier:
        children = [child for child, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def run_and_kill_after_checkpoint(argv: list[str], marker: Path, timeout: float = 150) -> subprocess.Popen:
    job = subprocess.Popen(argv, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + timeout
    while not marker.exists():
        assert job.poll() is None, f"the job ended before checkpoint {marker.parent.name}: {job.stdout.read()[-4000:]}"
        assert time.monotonic() < deadline, f"no {marker} after {timeout} s"
        time.sleep(0.05)
    workers = descendants(job.pid)
    assert len(workers) >= 2, "torchrun's two workers"
    for pid in [*workers, job.pid]:  # every process at once, the way a lost node or the OOM killer ends a job
        os.kill(pid, signal.SIGKILL)
    job.wait(timeout=30)
    job.stdout.close()
    return job


@pytest.mark.parametrize(("parallel", "data"), [("ddp", "stream"), ("fsdp2", "map")])
def test_job_killed_after_a_checkpoint_resumes_exactly(tmp_path, parallel, data):
    options = ["--parallel", parallel, "--data", data]
    full = subprocess.run(
        command(tmp_path / "full", tmp_path / "full_ckpt", *options), env=ENV, capture_output=True, text=True,
        timeout=180,
    )  # fmt: skip
    assert full.returncode == 0, full.stderr[-4000:]
    reference = torch.load(tmp_path / "full" / "result.pt", weights_only=True)
    assert reference["sharded"] == (parallel == "fsdp2")
    total_steps = len(reference["steps"])
    assert total_steps >= 2 * CHECKPOINT_EVERY + 1, "the kill lands mid-epoch, with steps left after it"

    checkpoints = tmp_path / "ckpt"
    marker = checkpoints / f"step-{CHECKPOINT_EVERY}" / "complete"
    # A pause after each step keeps the job mid-epoch while the test sees the marker and kills it.
    killed = run_and_kill_after_checkpoint(
        command(tmp_path / "killed", checkpoints, *options, "--step-seconds", "1"), marker
    )
    assert killed.returncode == -signal.SIGKILL
    assert not (tmp_path / "killed" / "result.pt").exists()
    before_kill = read_steps(tmp_path / "killed")
    assert CHECKPOINT_EVERY <= len(before_kill) < total_steps, "killed after the checkpoint, before the end"
    assert before_kill == reference["steps"][: len(before_kill)]
    newest = max(int(path.parent.name.split("-")[1]) for path in checkpoints.glob("step-*/complete"))
    assert CHECKPOINT_EVERY <= newest <= len(before_kill)

    resumed = subprocess.run(
        command(tmp_path / "resumed", checkpoints, *options, "--resume"), env=ENV, capture_output=True, text=True,
        timeout=180,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert f"after step {newest}\n" in resumed.stdout
    result = torch.load(tmp_path / "resumed" / "result.pt", weights_only=True)
    assert [step["step"] for step in result["steps"]] == list(range(newest + 1, total_steps + 1))
    for got, want in zip(result["steps"], reference["steps"][newest:], strict=True):
        assert got["example_ids"] == want["example_ids"], f"batches of step {want['step']}"
        assert got["loss"] == want["loss"], f"loss of step {want['step']}"
    assert result["params"].keys() == reference["params"].keys()
    for name, param in reference["params"].items():
        torch.testing.assert_close(result["params"][name], param, atol=0, rtol=0, msg=name)
    ids = [i for step in [*before_kill[:newest], *result["steps"]] for rank in step["example_ids"] for i in rank]
    assert sorted(ids) == list(range(40)), "across the kill, every example trained on exactly once"
