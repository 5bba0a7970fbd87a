"""Dataset packing: flatcollate's whole-dataset best-fit decreasing vs TRL's `pack_dataset`, on the same dataset.

    python benchmarks/pack_speed.py --num-sequences 1000000 --out benchmarks/results/pack_speed

Lengths are drawn from real length profiles; both packers get the same `datasets.Dataset` of `input_ids` and return
a packed dataset. Time (median over repeats), packs and fill are printed side by side, with ratios.
"""

import argparse
import json
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import trl
from tqdm.auto import tqdm
from trl.data_utils import pack_dataset as trl_pack_dataset

from flatcollate.bench import load_profile
from flatcollate.data import pack_dataset

CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}
"""`cpu`: this process's CPU seconds (all threads), which other work on a shared machine disturbs far less than
wall-clock seconds (`wall`)."""


@dataclass(frozen=True)
class Config:
    profiles: tuple[str, ...] = ("flan", "gsm8k")
    num_sequences: int = 1_000_000
    pack_len: int = 4096
    repeats: int = 3
    seed: int = 0
    clock: str = "cpu"


@dataclass
class Result:
    profile: str
    packer: str
    num_sequences: int
    seconds_median: float
    seconds_min: float
    seconds_max: float
    packs: int
    fill: float


def make_dataset(profile: str, cfg: Config) -> datasets.Dataset:
    """`input_ids` rows with the profile's lengths, built from offsets (token values do not matter to packing)."""
    prompt, completion = load_profile(profile).sample(cfg.num_sequences, seed=cfg.seed)
    lengths = np.minimum(prompt + completion, cfg.pack_len)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    values = pa.array(np.arange(offsets[-1], dtype=np.int64) % 32000)
    column = pa.LargeListArray.from_arrays(pa.array(offsets), values).cast(pa.list_(pa.int64()))
    return datasets.Dataset(pa.table({"input_ids": column}))


def measure(pack, dataset: datasets.Dataset, cfg: Config, bar) -> tuple[list[float], datasets.Dataset]:
    times, packed = [], None
    for _ in range(cfg.repeats):
        start = CLOCKS[cfg.clock]()
        packed = pack(dataset)
        times.append(CLOCKS[cfg.clock]() - start)
        bar.update(1)
    return times, packed


def fill_of(packed: datasets.Dataset, pack_len: int) -> tuple[int, float]:
    offsets = packed.data.column("input_ids").combine_chunks().offsets.to_numpy()
    return len(packed), float((offsets[-1] - offsets[0]) / (len(packed) * pack_len))


def run(cfg: Config, *, progress: bool = True) -> list[Result]:
    packers = {
        "flatcollate": lambda ds: pack_dataset(ds, cfg.pack_len, strategy="bfd"),
        "trl": lambda ds: trl_pack_dataset(ds, cfg.pack_len, strategy="bfd"),
    }
    results = []
    bar = tqdm(total=len(cfg.profiles) * len(packers) * cfg.repeats, unit="pass", disable=not progress)
    for profile in cfg.profiles:
        bar.set_description(f"{profile}: building the dataset")
        dataset = make_dataset(profile, cfg)
        for name, pack in packers.items():
            bar.set_description(f"{profile} {name}")
            times, packed = measure(pack, dataset, cfg, bar)
            packs, fill = fill_of(packed, cfg.pack_len)
            results.append(Result(profile, name, len(dataset), statistics.median(times), min(times), max(times),
                                  packs, fill))
    bar.close()
    return results


def markdown(results: list[Result]) -> str:
    lines = ["| profile | packer | sequences | time s (median, min-max) | packs | fill | x faster than trl |",
             "|---|---|---|---|---|---|---|"]
    trl_time = {r.profile: r.seconds_median for r in results if r.packer == "trl"}
    for r in results:
        lines.append(f"| {r.profile} | {r.packer} | {r.num_sequences:,} | {r.seconds_median:.2f} "
                     f"({r.seconds_min:.2f}-{r.seconds_max:.2f}) | {r.packs:,} | {100 * r.fill:.2f}% | "
                     f"{trl_time[r.profile] / r.seconds_median:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--num-sequences", type=int, default=Config.num_sequences, help="sequences per profile")
    parser.add_argument("--pack-len", type=int, default=Config.pack_len, help="tokens per pack")
    parser.add_argument("--repeats", type=int, default=Config.repeats, help="timed runs per packer")
    parser.add_argument("--out", default=None, help="folder for results.json and results.md")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu", help="what a timing counts")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    datasets.disable_progress_bars()
    cfg = Config(
        num_sequences=args.num_sequences, pack_len=args.pack_len, repeats=args.repeats, clock=args.clock
    )
    results = run(cfg, progress=not args.no_progress)
    table = markdown(results)
    print(table)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        payload = {"config": asdict(cfg), "versions": {"trl": trl.__version__, "datasets": datasets.__version__},
                   "results": [asdict(r) for r in results]}
        (out / "results.json").write_text(json.dumps(payload, indent=1))
        (out / "results.md").write_text(table + "\n")
    return results


if __name__ == "__main__":
    main()
