"""Dataset packing: flatcollate's whole-dataset best-fit decreasing vs TRL's `pack_dataset`, on the same dataset.

    python benchmarks/pack_speed.py --sizes 100000 1000000 --short-sizes 10000000 --out benchmarks/results/pack_speed

Lengths are drawn from real length profiles; both packers get the same in-memory `datasets.Dataset` of `input_ids`
and return a packed dataset. Every timed pass runs in a fresh process that builds the dataset first (not timed), so
each pass gets the same memory to start from and its peak memory can be read: `peak_rss` is the most resident memory
seen while packing (sampled every 5 ms), `extra_rss` that peak minus the memory held before packing (the dataset).
Within each repeat the packers take turns. Sizes in `--short-sizes` use short rows: every length and the pack length
divided by `--short-divisor` (rounded up), so as many sequences share a pack while the token columns fit in memory.
Time (median, min-max over repeats), packs, fill and memory are printed side by side, with TRL's time over each
packer's as the ratio of the medians and the min-max of the ratio within each repeat.
"""

import os
import sys
import threading
from dataclasses import asdict, dataclass

import numpy as np

from flatcollate.bench.repeats import run_repeats, serve_worker
from flatcollate.cli import positive_int

from _common import CLOCKS, add_repeat_arguments, command_line, format_ratio, script_parser, write_results

PACKERS = ("flatcollate", "trl")


@dataclass(frozen=True)
class Config:
    profiles: tuple[str, ...] = ("flan", "gsm8k")
    sizes: tuple[int, ...] = (100_000, 1_000_000)
    short_sizes: tuple[int, ...] = ()
    short_divisor: int = 16
    short_repeats: int = 3
    pack_len: int = 4096
    repeats: int = 5
    seed: int = 0
    clock: str = "cpu"


@dataclass(frozen=True)
class Case:
    profile: str
    num_sequences: int
    pack_len: int
    divisor: int  # lengths and pack_len divided by this (1: real lengths)
    seed: int


@dataclass
class Result:
    profile: str
    packer: str
    num_sequences: int
    pack_len: int
    divisor: int
    num_tokens: int
    seconds: list[float]
    seconds_median: float
    seconds_min: float
    seconds_max: float
    trl_over_this: dict
    packs: int
    fill: float
    peak_rss_gib: float
    extra_rss_gib: float


def make_dataset(case: Case):
    """`input_ids` rows with the profile's lengths, built from offsets (token values do not matter to packing)."""
    import datasets
    import pyarrow as pa

    from flatcollate.profiles import load_profile

    prompt, completion = load_profile(case.profile).sample(case.num_sequences, seed=case.seed)
    lengths = -(-np.minimum(prompt + completion, case.pack_len * case.divisor) // case.divisor)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    values = np.arange(offsets[-1], dtype=np.int64)
    values %= 32000  # in place: the dataset holds one int64 per token and nothing else
    column = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values)).cast(pa.list_(pa.int64()))
    return datasets.Dataset(pa.table({"input_ids": column}), fingerprint=f"pack-speed-{case}")


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measure(payload: dict, packer: str) -> dict:
    """Worker: build the dataset, pack it, report time, packs, fill and memory."""
    import datasets

    datasets.disable_progress_bars()
    case, clock = Case(**payload["case"]), payload["clock"]
    dataset = make_dataset(case)
    pack_len = case.pack_len
    if packer == "flatcollate":
        from flatcollate.data import pack_dataset

        def pack(ds):
            return pack_dataset(ds, pack_len, strategy="bfd")
    else:
        from trl.data_utils import pack_dataset as trl_pack_dataset

        def pack(ds):
            return trl_pack_dataset(ds, pack_len, strategy="bfd")

    before = _rss()
    peak, done = [before], threading.Event()

    def sample():
        while not done.wait(0.005):
            peak[0] = max(peak[0], _rss())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    start = CLOCKS[clock]()
    packed = pack(dataset)
    seconds = CLOCKS[clock]() - start
    done.set()
    sampler.join()
    peak[0] = max(peak[0], _rss())
    offsets = packed.data.column("input_ids").combine_chunks().offsets.to_numpy()
    tokens = int(offsets[-1] - offsets[0])
    return {"seconds": seconds, "packs": len(packed), "fill": tokens / (len(packed) * pack_len), "tokens": tokens,
            "peak_rss": peak[0], "extra_rss": peak[0] - before}


def run(cfg: Config, *, progress: bool = True, on_case=None) -> list[Result]:
    """Every case, the packers taking turns within each repeat; `on_case(results so far)` after each case."""
    cases = [Case(p, n, cfg.pack_len, 1, cfg.seed) for n in cfg.sizes for p in cfg.profiles]
    short_len = -(-cfg.pack_len // cfg.short_divisor)
    cases += [Case(p, n, short_len, cfg.short_divisor, cfg.seed) for n in cfg.short_sizes for p in cfg.profiles]
    report = None if on_case is None else lambda runs: on_case([r for run in runs for r in _results(run)])
    runs = run_repeats(
        [sys.executable, __file__],
        [{"case": asdict(case), "clock": cfg.clock} for case in cases],
        PACKERS,
        repeats=[cfg.repeats if case.divisor == 1 else cfg.short_repeats for case in cases],
        label=lambda payload: "{profile} {num_sequences:,} (/{divisor})".format(**payload["case"]),
        progress=progress,
        on_case=report,
    )
    return [result for run in runs for result in _results(run)]


def _results(run) -> list[Result]:
    case = Case(**run.case["case"])
    results = []
    for name in PACKERS:
        seconds, first = run.values(name, "seconds"), run.figures[name][0]
        spread = run.spread(name, "seconds")
        results.append(Result(
            case.profile, name, case.num_sequences, case.pack_len, case.divisor, first["tokens"], seconds,
            spread["median"], spread["min"], spread["max"], run.ratio("trl", name, "seconds"), first["packs"],
            first["fill"], max(run.values(name, "peak_rss")) / 2**30, max(run.values(name, "extra_rss")) / 2**30,
        ))
    return results


def markdown(results: list[Result]) -> str:
    lines = ["| profile | sequences | pack_len | tokens | packer | time s (median, min-max) | packs | fill | "
             "peak RSS GiB (extra) | x faster than trl (min-max) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        short = f" (lengths /{r.divisor})" if r.divisor > 1 else ""
        lines.append(f"| {r.profile} | {r.num_sequences:,}{short} | {r.pack_len} | {r.num_tokens / 1e6:,.0f}M | "
                     f"{r.packer} | {r.seconds_median:.2f} ({r.seconds_min:.2f}-{r.seconds_max:.2f}) | {r.packs:,} | "
                     f"{100 * r.fill:.2f}% | {r.peak_rss_gib:.1f} ({r.extra_rss_gib:.1f}) | "
                     f"{format_ratio(r.trl_over_this, 1)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[Result] | None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if serve_worker(argv, measure):
        return None
    parser = script_parser(__file__, __doc__)
    parser.add_argument("--sizes", "--num-sequences", type=positive_int, nargs="*", default=Config.sizes,
                        help="sequences per profile")
    parser.add_argument("--short-sizes", type=positive_int, nargs="*", default=Config.short_sizes,
                        help="sequences per profile, with short rows")
    parser.add_argument("--short-divisor", type=positive_int, default=Config.short_divisor,
                        help="lengths and pack length divided by this for --short-sizes")
    parser.add_argument("--short-repeats", type=positive_int, default=Config.short_repeats,
                        help="runs of every packer for --short-sizes, each in a fresh process")
    parser.add_argument("--pack-len", type=positive_int, default=Config.pack_len, help="tokens per pack")
    parser.add_argument("--profiles", nargs="+", default=list(Config.profiles), help="length profiles")
    parser.add_argument("--out", default=None, help="folder for results.json and results.md")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default=Config.clock, help="what a timing counts")
    add_repeat_arguments(parser, repeats=Config.repeats)
    args = parser.parse_args(argv)
    cfg = Config(profiles=tuple(args.profiles), sizes=tuple(args.sizes), short_sizes=tuple(args.short_sizes),
                 short_divisor=args.short_divisor, short_repeats=args.short_repeats, pack_len=args.pack_len,
                 repeats=args.repeats, clock=args.clock)
    command = command_line(__file__, argv)

    def save(results: list[Result]) -> None:  # after every case, so a long run keeps what it measured
        if not args.out:
            return
        import datasets
        import trl

        payload = {"command": command, "config": asdict(cfg), "cpus": os.cpu_count(),
                   "versions": {"trl": trl.__version__, "datasets": datasets.__version__},
                   "results": [asdict(r) for r in results]}
        write_results(args.out, "results", payload, f"command: `{command}`\n\n{markdown(results)}")

    results = run(cfg, progress=not args.no_progress, on_case=save)
    print(f"command: `{command}`\n\n{markdown(results)}")
    return results


if __name__ == "__main__":
    main()
