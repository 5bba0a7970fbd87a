"""`check_model` in bf16 (or on CUDA): the tolerance comes from the per-sequence run's own error in that dtype."""

import pytest
import torch

from flatcollate.attention import dispatch
from flatcollate.check import check_model
from flatcollate.cli import main


def test_bf16_check_passes_the_packed_backend_and_catches_contamination():
    report = check_model("opt", dtype=torch.bfloat16, backends=("eager", "flatcollate"))
    statuses = {r.backend: r.status for r in report.results}
    assert statuses == {"eager": "contaminated", "flatcollate": "exact"}  # opt's own mask builder drops positions
    assert report.dtype == "bfloat16" and set(report.tolerances) == {"logits_diff", "loss_diff", "grad_diff"}
    assert 1e-4 < report.tolerances["logits_diff"] < 0.1, "the tolerance must follow bf16's error, not fp32's"


def test_bf16_check_catches_a_window_off_by_one(monkeypatch):
    assert check_model("mistral", dtype=torch.bfloat16, backends=("flatcollate",)).passed
    kernel = dispatch.KERNELS["sdpa"]
    monkeypatch.setitem(
        dispatch.KERNELS, "sdpa", lambda *a, window=None, **k: kernel(*a, window=window and window + 1, **k)
    )
    (result,) = check_model("mistral", dtype=torch.bfloat16, backends=("flatcollate",)).results
    assert result.status == "contaminated"


def test_an_explicit_tolerance_is_used_as_given():
    report = check_model("llama", dtype=torch.bfloat16, backends=("flatcollate",), tolerance=1e-9)
    assert report.results[0].status == "contaminated"  # bf16 cannot be within 1e-9 of the fp32 reference


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_cuda_without_a_gpu_is_a_usage_error(capsys):
    assert main(["check", "llama", "--device", "cuda", "--dtype", "bfloat16"]) == 2
    err = capsys.readouterr().err
    assert "sees no CUDA device" in err and "Traceback" not in err
