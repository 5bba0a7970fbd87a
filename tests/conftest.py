"""Shared fixtures: the real data beside the checkout (`../shared/data`), skipped cleanly where it is absent,
`no_run` for the `flatcollate bench` command line and `without_matplotlib`."""

import os
import sys
from pathlib import Path

import pytest

_DEFAULT_SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
SHARED_DATA = Path(os.environ.get("FLATCOLLATE_SHARED_DATA", _DEFAULT_SHARED))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """Folder of real datasets, tokenizers, configs and length profiles; tests that need it skip without it."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA} (set FLATCOLLATE_SHARED_DATA)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def tokenizer_dir(shared_data):
    """`tokenizer_dir("qwen2.5-instruct")` -> path of a real tokenizer folder."""

    def get(name: str) -> Path:
        path = shared_data / "tokenizers" / name
        if not path.is_dir():
            pytest.skip(f"tokenizer {name} not in {shared_data}")
        return path

    return get


@pytest.fixture(scope="session")
def hh_rlhf_prompt_pairs(shared_data):
    """`hh_rlhf_prompt_pairs(n)` -> the first `n` HH-RLHF pairs whose chosen and rejected conversations share all but
    their last assistant turn, as `(head, chosen_reply, rejected_reply)`: `head` is the conversation before that
    turn (without `"\\n\\nAssistant:"`), the replies are what follows it."""
    import gzip
    import json

    path = shared_data / "datasets" / "hh_rlhf_harmless_base_test.jsonl.gz"
    if not path.is_file():
        pytest.skip(f"{path.name} not in {shared_data}")

    def get(n: int) -> list[tuple[str, str, str]]:
        found = []
        with gzip.open(path, "rt") as lines:
            for line in lines:
                row = json.loads(line)
                head, _, chosen = row["chosen"].rpartition("\n\nAssistant:")
                rejected_head, _, rejected = row["rejected"].rpartition("\n\nAssistant:")
                if head == rejected_head and chosen.strip() and rejected.strip():
                    found.append((head, chosen, rejected))
                if len(found) == n:
                    return found
        raise AssertionError(f"fewer than {n} usable pairs in {path.name}")

    return get


@pytest.fixture
def no_run(monkeypatch):
    """`flatcollate bench` with a usage error: it must be refused before any benchmark runs."""
    from flatcollate.bench import harness

    def refuse(*args, **kwargs):
        raise AssertionError("the benchmark ran despite a usage error")

    monkeypatch.setattr(harness, "run_bench", refuse)


@pytest.fixture
def without_matplotlib(monkeypatch):
    """An environment without the `bench` extra: matplotlib and its modules do not import, the bench's plots are not
    loaded."""
    for name in ["matplotlib", *(name for name in sys.modules if name.startswith("matplotlib."))]:
        monkeypatch.setitem(sys.modules, name, None)
    import flatcollate.bench

    monkeypatch.delitem(sys.modules, "flatcollate.bench.plots", raising=False)
    monkeypatch.delattr(flatcollate.bench, "plots", raising=False)


@pytest.fixture(scope="session")
def per_sequence():
    """The one per-sequence reference of model-level proofs: `per_sequence(model, sequences)` runs every `(L,)` id
    tensor through `model` on its own (a batch of one, the model numbering its own positions, no cache) and returns
    `(logits, loss, grads)`: logits `(1, sum L, V)` in sequence order, the mean next-token loss over every sequence's
    own tokens (each predicts only inside its sequence), and the gradients of that loss by parameter name."""
    import torch

    from flatcollate.check.runs import gradients

    def run(model, sequences, *, backward: bool = True):
        model.zero_grad(set_to_none=True)
        logits, total, count = [], 0.0, 0
        for ids in sequences:
            out = model(input_ids=ids[None], use_cache=False)
            total = total + torch.nn.functional.cross_entropy(out.logits[0, :-1], ids[1:], reduction="sum")
            count += len(ids) - 1
            logits.append(out.logits)
        loss = total / count
        if backward:
            loss.backward()
        return torch.cat(logits, dim=1).detach(), loss.detach(), gradients(model) if backward else {}

    return run


@pytest.fixture(scope="session")
def assert_exact():
    """`assert_exact(got, expected)` for two `(logits, loss, grads)`: every entry within 1e-5 (fp32 on the CPU)."""
    import torch

    def check(got, expected, atol: float = 1e-5):
        torch.testing.assert_close(got[0], expected[0], atol=atol, rtol=0, msg="logits")
        torch.testing.assert_close(got[1], expected[1], atol=atol, rtol=0, msg="loss")
        assert got[2].keys() == expected[2].keys()
        for name, grad in expected[2].items():
            torch.testing.assert_close(got[2][name], grad, atol=atol, rtol=0, msg=name)

    return check


@pytest.fixture
def host_syncs(monkeypatch):
    """`with host_syncs() as seen: ...` counts what flatcollate's own code does inside the block that would make a CUDA
    device wait for the host: each copy of a tensor's values to Python (`tolist`; `item`, `int()`, `bool()` as
    `scalar`) and each op whose output size depends on data (`nonzero`). `seen` is a `collections.Counter` by kind;
    CPU tensors stand in for device tensors. What transformers does in the same forward is not counted."""
    import collections
    import contextlib
    import traceback

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = collections.Counter()
    library = str(Path(__file__).resolve().parents[1] / "flatcollate")

    def ours() -> bool:  # the nearest caller outside torch is flatcollate (not transformers' own mask builders)
        for frame in reversed(traceback.extract_stack()[:-2]):
            if "/torch/" not in frame.filename and frame.filename != __file__:
                return frame.filename.startswith(library)
        return False

    sync_ops = {torch.ops.aten._local_scalar_dense.default: "scalar", torch.ops.aten.nonzero.default: "nonzero"}

    class Counting(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func in sync_ops and ours():
                seen[sync_ops[func]] += 1
            return func(*args, **(kwargs or {}))

    original = torch.Tensor.tolist

    def tolist(tensor):
        seen["tolist"] += ours()
        return original(tensor)

    @contextlib.contextmanager
    def counting():
        monkeypatch.setattr(torch.Tensor, "tolist", tolist)
        try:
            with Counting():
                yield seen
        finally:
            monkeypatch.setattr(torch.Tensor, "tolist", original)

    return counting


@pytest.fixture(scope="session")
def assert_relatively_close():
    """`assert_relatively_close(got, expected)` for two `(loss, grads)`: the loss and every gradient within `rtol`
    (1e-6, fp32) of the reference in relative norm, `|got - expected| / |expected|` (elementwise relative error means
    nothing for entries near zero). A gradient that is zero but for rounding (a key projection's bias, to which the
    softmax is blind) has no scale of its own: one whose norm is under 1e-3 of the whole gradient's is measured against
    the whole gradient's norm. Both hold the same parameter names."""

    def check(got, expected, rtol: float = 1e-6):
        def relative(a, b, scale=None):
            scale = b.double().norm() if scale is None else scale
            return float((a.double() - b.double()).norm() / scale.clamp(min=1e-30))

        assert relative(got[0], expected[0]) <= rtol, f"loss {float(got[0])} vs {float(expected[0])}"
        assert got[1].keys() == expected[1].keys()
        whole = sum(grad.double().norm() ** 2 for grad in expected[1].values()) ** 0.5
        for name, grad in expected[1].items():
            own = grad.double().norm()
            error = relative(got[1][name], grad, own if own >= 1e-3 * whole else whole)
            assert error <= rtol, f"{name}: relative error {error:.2e} > {rtol:.0e}"

    return check
