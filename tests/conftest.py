"""Shared fixtures: the real data beside the checkout (`../shared/data`), skipped cleanly where it is absent."""

import os
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
