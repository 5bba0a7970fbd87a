"""Re-create the named length profiles in `flatcollate/profiles/data/` from the shared data.

Usage: `python -m flatcollate.profiles.make /path/to/shared/data`. The SFT profiles come from length files holding
one `[prompt, completion]` token-length row per example (Qwen2.5 tokenizer, no chat template); only the binned
histograms are written. The pair profiles (`data/pairs/`) are counted here from the preference transcripts with
the tokenizer named in `PAIR_SOURCES` (`flatcollate.profiles.pair_profile`); only the length triples are written.
"""

import argparse
import dataclasses
import gzip
import json
from pathlib import Path

import numpy as np

from .._paths import expand_path
from .length_profile import LengthProfile
from .names import PAIR_PROFILES_DIR, PROFILES_DIR
from .pair_profile import pair_profile_from_transcripts

SOURCES = {
    "flan": "t0_mix_7k",
    "gsm8k": "gsm8k_train",
    "code_alpaca": "code_alpaca_2k",
    "hh_rlhf": "hh_rlhf_messages",
}
"""Profile name -> stem of the length file it is derived from."""

PAIR_SOURCES = {"hh_rlhf": ("datasets/hh_rlhf_harmless_base_test.jsonl.gz", "qwen2.5-instruct")}
"""Pair profile name -> (JSON-lines transcripts with `chosen` and `rejected`, tokenizer folder), in the data folder."""


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


def make_pair_profiles(shared_data: Path, out_dir: Path = PAIR_PROFILES_DIR) -> list[Path]:
    """Write one pair profile JSON per entry of `PAIR_SOURCES` (needs transformers); returns the written paths."""
    from transformers import AutoTokenizer

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, (data_file, tokenizer_name) in PAIR_SOURCES.items():
        tokenizer = AutoTokenizer.from_pretrained(shared_data / "tokenizers" / tokenizer_name)
        with gzip.open(shared_data / data_file, "rt") as lines:
            rows = [json.loads(line) for line in lines]
        profile, skipped = pair_profile_from_transcripts(rows, tokenizer, name=name, source="")
        source = (
            f"{Path(data_file).name}: {profile.num_rows} of {len(rows)} pairs ({skipped} whose chosen and rejected "
            f"heads differ left out), split at the last '\\n\\nAssistant:' (prompt = shared head + marker), tokenizer "
            f"{tokenizer_name}, tokens, no chat template, no special tokens"
        )
        path = out_dir / f"{name}.json"
        dataclasses.replace(profile, source=source).save(path)
        written.append(path)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "shared_data", type=expand_path, help="folder holding lengths/*.json, datasets/ and tokenizers/"
    )
    parser.add_argument("--out-dir", type=expand_path, default=PROFILES_DIR)
    args = parser.parse_args()
    paths = make_profiles(args.shared_data, args.out_dir) + make_pair_profiles(args.shared_data, args.out_dir / "pairs")
    for path in paths:
        print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
