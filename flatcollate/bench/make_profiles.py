"""Re-create the named length profiles in `flatcollate/bench/profiles/` from the shared length files.

Usage: `python -m flatcollate.bench.make_profiles /path/to/shared/data`. The inputs hold one `[prompt, completion]`
token-length row per example (Qwen2.5 tokenizer, no chat template); only the binned histograms are written.
"""

import argparse
import json
from pathlib import Path

import numpy as np

from .config import PROFILES_DIR
from .length_profile import LengthProfile

SOURCES = {
    "flan": "t0_mix_7k",
    "gsm8k": "gsm8k_train",
    "code_alpaca": "code_alpaca_2k",
    "hh_rlhf": "hh_rlhf_messages",
}
"""Profile name -> stem of the length file it is derived from."""


def make_profiles(shared_data: Path, out_dir: Path = PROFILES_DIR) -> list[Path]:
    """Write one profile JSON per entry of `SOURCES`; returns the written paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, stem in SOURCES.items():
        data = json.loads((shared_data / "lengths" / f"{stem}.json").read_text())
        rows = np.asarray(data["rows"], dtype=np.int64)
        source = f"{stem}: {len(rows)} rows, tokenizer {data['tokenizer']}, {data['unit']}"
        profile = LengthProfile.from_lengths(rows[:, 0], rows[:, 1], name=name, source=source)
        path = out_dir / f"{name}.json"
        profile.save(path)
        written.append(path)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shared_data", type=Path, help="folder holding lengths/*.json")
    parser.add_argument("--out-dir", type=Path, default=PROFILES_DIR)
    for path in make_profiles(parser.parse_args().shared_data, parser.parse_args().out_dir):
        print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
