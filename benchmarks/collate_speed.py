"""Collator speed: flatcollate vs transformers' `DataCollatorWithFlattening` vs TRL's padding-free collator.

    python benchmarks/collate_speed.py --out benchmarks/results/collate_speed

Same batches for every collator (64 sequences, lengths from real length profiles), inputs as Python lists, numpy
arrays and torch tensors. Every run of a collator is a fresh process that builds the batches, warms up, and times
`--passes` passes over them; its figure is the median microseconds per call. The collators take turns within each
of `--repeats` repeats; the table shows the median over runs with its min-max, and each collator's time over
flatcollate's as the ratio of the medians with the min-max of the ratio within each repeat.
"""

import sys
from dataclasses import asdict, dataclass

import numpy as np
import torch
import transformers

from flatcollate import DataCollatorWithFlattening
from flatcollate.bench.repeats import format_spread, run_repeats, serve_worker
from flatcollate.cli import positive_int
from flatcollate.profiles import load_profile

from _common import CLOCKS, add_repeat_arguments, command_line, format_ratio, script_parser, write_results

COLLATORS = ("flatcollate", "transformers", "trl")


@dataclass(frozen=True)
class Config:
    profiles: tuple[str, ...] = ("flan", "gsm8k")
    input_kinds: tuple[str, ...] = ("list", "numpy", "torch")
    batch_size: int = 64
    num_batches: int = 8
    warmup: int = 3
    passes: int = 15
    seed: int = 0
    clock: str = "cpu"


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


def make_collator(name: str):
    if name == "trl":  # imported where it runs: TRL takes seconds to import
        from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

        return DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)
    if name == "transformers":
        return transformers.DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)
    return DataCollatorWithFlattening()


def measure(case: dict, collator: str) -> dict:
    """Worker: median microseconds per call of `collator` over `passes` passes of the case's batches."""
    cfg = Config(**case["config"])
    batches = make_batches(cfg, case["profile"], case["kind"])
    collate = make_collator(collator)
    for batch in batches[: cfg.warmup]:
        collate(batch)
    clock, per_call = CLOCKS[cfg.clock], []
    for _ in range(cfg.passes):
        start = clock()
        for batch in batches:
            collate(batch)
        per_call.append((clock() - start) / len(batches) * 1e6)
    tokens = float(np.mean([sum(len(f["input_ids"]) for f in b) for b in batches]))
    return {"us_per_call": float(np.median(per_call)), "tokens_per_batch": tokens}


def cases(cfg: Config) -> list[dict]:
    return [{"profile": p, "kind": k, "config": asdict(cfg)} for p in cfg.profiles for k in cfg.input_kinds]


def summarize(runs) -> list[dict]:
    """Per profile, input kind and collator: microseconds per call over the runs, and the ratio to flatcollate."""
    return [
        {
            "profile": run.case["profile"],
            "input_kind": run.case["kind"],
            "collator": name,
            "tokens_per_batch": run.first(name, "tokens_per_batch"),
            "us_per_call": run.spread(name, "us_per_call"),
            "vs_flatcollate": run.ratio(name, "flatcollate", "us_per_call"),
        }
        for run in runs
        for name in run.figures
    ]


def markdown(rows: list[dict]) -> str:
    lines = ["| profile | input | collator | tokens/batch | µs per call (median, min-max) | x slower than flatcollate "
             "(min-max) |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['profile']} | {r['input_kind']} | {r['collator']} | {r['tokens_per_batch']:.0f} | "
                     f"{format_spread(r['us_per_call'], 0)} | {format_ratio(r['vs_flatcollate'], 1)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict] | None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if serve_worker(argv, measure):
        return None
    parser = script_parser(__file__, __doc__)
    parser.add_argument("--out", default=None, help="folder for results.json and results.md")
    parser.add_argument(
        "--passes", type=positive_int, default=Config.passes, help="timed passes over the batches per run"
    )
    parser.add_argument("--batch-size", type=positive_int, default=Config.batch_size, help="sequences per batch")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu", help="what a timing counts")
    parser.add_argument("--profiles", nargs="+", default=list(Config.profiles), help="length profiles")
    parser.add_argument(
        "--inputs", nargs="+", choices=Config.input_kinds, default=list(Config.input_kinds), help="input containers"
    )
    add_repeat_arguments(parser)
    args = parser.parse_args(argv)
    cfg = Config(profiles=tuple(args.profiles), input_kinds=tuple(args.inputs), passes=args.passes,
                 batch_size=args.batch_size, clock=args.clock)
    runs = run_repeats(
        [sys.executable, __file__],
        cases(cfg),
        COLLATORS,
        repeats=args.repeats,
        label=lambda case: f"{case['profile']} {case['kind']}",
        progress=not args.no_progress,
    )
    rows = summarize(runs)
    command = command_line(__file__, argv)
    text = f"command: `{command}`\n\n{markdown(rows)}"
    print(text)
    versions = {"torch": torch.__version__, "transformers": transformers.__version__}
    payload = {"command": command, "config": asdict(cfg), "repeats": args.repeats, "versions": versions, "rows": rows}
    write_results(args.out, "results", payload | {"runs": [run.to_json() for run in runs]}, text)
    return rows


if __name__ == "__main__":
    main()
