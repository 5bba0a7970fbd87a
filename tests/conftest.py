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
