"""`benchmarks/sp_overhead.py` runs with short settings (one fresh-process run per group size), prints its table and
writes JSON and markdown where asked."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "sp_overhead.py"


@pytest.mark.skipif(
    not (torch.distributed.is_available() and torch.distributed.is_gloo_available()), reason="needs the gloo backend"
)
def test_sp_overhead_with_short_settings_writes_its_table(tmp_path):
    command = [sys.executable, str(SCRIPT), "--sp", "2", "--tokens", "64", "--repeats", "1", "--iterations", "1"]
    command += ["--warmup", "0", "--no-progress"]
    done = subprocess.run([*command, "--out", str(tmp_path)], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "| 2 | 64 |" in done.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json", "results.md"]
    (row,) = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert row["sp"] == 2 and row["all_to_all_ms"]["median"] > 0 and row["kernel_ms"]["median"] > 0
    assert row["all_to_all_over_kernel"]["n"] == 1
