"""Checks of `flatcollate bench` options shared by the text and image-text benchmarks: each raises `UsageError` with
one line before any work starts."""

import tempfile
from pathlib import Path

from ..cli import UsageError


def check_profile(profile: str) -> None:
    """Raise `UsageError` unless `profile` loads as a length profile (the message says what one is)."""
    from .profiles import load_profile

    try:
        load_profile(profile)
    except (ValueError, OSError) as error:
        raise UsageError(f"--profile {profile}: {str(error).splitlines()[0]}") from None


def check_writable(out_dir: Path) -> None:
    """Raise `UsageError` unless `out_dir` is (or can be created as) a folder this process can write files into."""
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"--out-dir {out_dir}: exists and is not a folder.")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out_dir):
            pass
    except OSError as error:
        raise UsageError(f"--out-dir {out_dir}: cannot write there ({error.strerror or error}).") from None
