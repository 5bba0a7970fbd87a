"""Collator speed: flatcollate vs transformers' `DataCollatorWithFlattening` vs TRL's padding-free collator.

    python benchmarks/collate_speed.py --out benchmarks/results/collate_speed

Same batches for every collator (64 sequences, lengths from real length profiles), inputs as Python lists, numpy
arrays and torch tensors; microseconds per call (median and spread over repeats) and ratios, in one run.
"""

import argparse
import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import transformers
from tqdm.auto import tqdm
from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

from flatcollate import DataCollatorWithFlattening
from flatcollate.bench import load_profile

CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}
"""`cpu`: this process's CPU seconds (all threads), which other work on a shared machine disturbs far less than
wall-clock seconds (`wall`)."""


@dataclass(frozen=True)
class Config:
    profiles: tuple[str, ...] = ("flan", "gsm8k")
    input_kinds: tuple[str, ...] = ("list", "numpy", "torch")
    batch_size: int = 64
    num_batches: int = 8
    warmup: int = 3
    repeats: int = 15
    seed: int = 0
    clock: str = "cpu"


@dataclass
class Result:
    profile: str
    input_kind: str
    collator: str
    tokens_per_batch: float
    median_us: float
    p10_us: float
    p90_us: float
    ratios: dict = field(default_factory=dict)


def make_batches(cfg: Config, profile: str, kind: str) -> list[list[dict]]:
    prompt, completion = load_profile(profile).sample(cfg.batch_size * cfg.num_batches, seed=cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    convert = {"list": lambda a: a.tolist(), "numpy": lambda a: a, "torch": torch.from_numpy}[kind]
    batches = []
    for b in range(cfg.num_batches):
        batch = []
        for length in (prompt + completion)[b * cfg.batch_size : (b + 1) * cfg.batch_size]:
            ids = rng.integers(0, 32000, int(length))
            labels = ids.copy()
            labels[: int(length) // 3] = -100
            batch.append({"input_ids": convert(ids), "labels": convert(labels)})
        batches.append(batch)
    return batches


def collators() -> dict:
    return {
        "flatcollate": DataCollatorWithFlattening(),
        "transformers": transformers.DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True),
        "trl": DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True),
    }


def time_collator(collate, batches, cfg: Config) -> list[float]:
    for batch in batches[: cfg.warmup]:
        collate(batch)
    per_call = []
    for _ in range(cfg.repeats):
        start = CLOCKS[cfg.clock]()
        for batch in batches:
            collate(batch)
        per_call.append((CLOCKS[cfg.clock]() - start) / len(batches) * 1e6)
    return per_call


def run(cfg: Config, *, progress: bool = True) -> list[Result]:
    results = []
    bar = tqdm(total=len(cfg.profiles) * len(cfg.input_kinds) * len(collators()), unit="collator", disable=not progress)
    for profile in cfg.profiles:
        for kind in cfg.input_kinds:
            batches = make_batches(cfg, profile, kind)
            tokens = float(np.mean([sum(len(f["input_ids"]) for f in b) for b in batches]))
            timings = {}
            for name, collator in collators().items():
                bar.set_description(f"{profile} {kind} {name}")
                timings[name] = time_collator(collator, batches, cfg)
                bar.update(1)
            ours = statistics.median(timings["flatcollate"])
            for name, values in timings.items():
                q = np.percentile(values, [10, 50, 90])
                results.append(Result(profile, kind, name, tokens, float(q[1]), float(q[0]), float(q[2]),
                                      {"vs_flatcollate": float(q[1]) / ours}))
    bar.close()
    return results


def markdown(results: list[Result]) -> str:
    lines = ["| profile | input | collator | tokens/batch | median µs | p10-p90 µs | x slower than flatcollate |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r.profile} | {r.input_kind} | {r.collator} | {r.tokens_per_batch:.0f} | {r.median_us:.0f} | "
                     f"{r.p10_us:.0f}-{r.p90_us:.0f} | {r.ratios['vs_flatcollate']:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--out", default=None, help="folder for results.json and results.md")
    parser.add_argument("--repeats", type=int, default=Config.repeats, help="timed passes over the batches")
    parser.add_argument("--batch-size", type=int, default=Config.batch_size, help="sequences per batch")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu", help="what a timing counts")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    cfg = Config(repeats=args.repeats, batch_size=args.batch_size, clock=args.clock)
    results = run(cfg, progress=not args.no_progress)
    table = markdown(results)
    print(table)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        payload = {"config": asdict(cfg), "versions": {"torch": torch.__version__,
                   "transformers": transformers.__version__}, "results": [asdict(r) for r in results]}
        (out / "results.json").write_text(json.dumps(payload, indent=1))
        (out / "results.md").write_text(table + "\n")
    return results


if __name__ == "__main__":
    main()
