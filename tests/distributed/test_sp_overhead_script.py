"""`benchmarks/sp_overhead.py` runs with short settings, prints its table and writes JSON and markdown where asked."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "sp_overhead.py"


@pytest.mark.skipif(
    not (torch.distributed.is_available() and torch.distributed.is_gloo_available()), reason="needs the gloo backend"
)
def test_sp_overhead_with_short_settings_writes_its_table(tmp_path):
    command = [sys.executable, str(SCRIPT), "--sp", "2", "--tokens", "64", "--repeats", "1", "--warmup", "0"]
    done = subprocess.run([*command, "--out", str(tmp_path)], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "| 2 | 64 |" in done.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json", "results.md"]
    (result,) = json.loads((tmp_path / "results.json").read_text())
    assert result["config"]["sp"] == 2 and result["all_to_all_ms"] > 0 and result["kernel_ms"] > 0
