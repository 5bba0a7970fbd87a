"""Streaming readers: rows each reader reads, by source shards vs by row index, with 1, 4 and 16 readers.

    python benchmarks/stream_readers.py --out benchmarks/results/stream_readers

`R` readers (data-parallel ranks times DataLoader workers) are simulated in one process: reader `r` is a
`StreamingPacker(rank=r, world_size=R)`, read to the end. Every row a source hands out is counted where it is read (a
`map` function on a `datasets.IterableDataset`, `__getitem__` on a list), so the counts are the rows each reader really
read, not the rows it kept. Sources, all of the same `num_rows` pre-tokenized rows:

- `iterable`: `Dataset.to_iterable_dataset(num_shards=...)`, read by shards (`sharding="auto"`, at least one shard per
  reader) and by row index (`sharding="rows"`, what every reader did before);
- `list`: random access, split by row index; the cursor jumps over other readers' rows.

Times: the slowest reader (what a parallel run waits for) and all readers together (the CPU spent). Every run of a
source and split is a fresh process that builds the rows, reads once with one reader (warm-up), then with all `R`
readers; the three take turns within each of `--repeats` repeats. The table shows the median over runs with its
min-max, and all readers' time over that of the iterable split by shards, as the ratio of the medians with the
min-max of the ratio within each repeat.
"""

import sys
import time
from dataclasses import asdict, dataclass

import datasets
import numpy as np

from flatcollate.bench.repeats import run_repeats, serve_worker
from flatcollate.cli import positive_int
from flatcollate.streaming import StreamingPacker

from _common import add_repeat_arguments, command_line, script_parser, write_results

VARIANTS = ("iterable/shards", "iterable/rows", "list/rows")
"""`source/split`: what a reader reads and how the readers split it."""


@dataclass(frozen=True)
class Config:
    num_rows: int = 10_000
    num_shards: int = 64
    readers: tuple[int, ...] = (1, 4, 16)
    pack_len: int = 2048
    buffer_size: int = 64
    repeats: int = 5
    seed: int = 0


@dataclass
class Result:
    source: str
    mode: str
    readers: int
    reads_min: int
    reads_max: int
    reads_total: int
    rows: int
    slowest_s_median: float
    all_s_median: float
    all_s_min: float
    all_s_max: float
    vs_shards: float
    vs_shards_min: float
    vs_shards_max: float


class ReadCounter:
    """Counts the rows handed out: a `map` function, and a random-access wrapper of a list."""

    def __init__(self, rows: list | None = None):
        self.rows, self.reads = rows, 0
        self._fingerprint = "counted"  # identifies the wrapped list without reading rows

    def __call__(self, row: dict) -> dict:
        self.reads += 1
        return row

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict:
        self.reads += 1
        return self.rows[index]


def make_rows(cfg: Config) -> list[dict]:
    lengths = np.random.default_rng(cfg.seed).integers(8, 257, size=cfg.num_rows)
    return [{"input_ids": np.full(int(n), i % 32000, dtype=np.int64)} for i, n in enumerate(lengths)]


def read_all(make_source, *, num_readers: int, sharding: str, cfg: Config) -> tuple[list[int], list[float]]:
    """Rows read and seconds taken by each reader, read one after the other."""
    reads, seconds = [], []
    for reader in range(num_readers):
        source, counter = make_source()
        packer = StreamingPacker(
            source,
            pack_len=cfg.pack_len,
            buffer_size=cfg.buffer_size,
            rank=reader,
            world_size=num_readers,
            sharding=sharding,
        )
        start = time.perf_counter()
        for _ in packer:
            pass
        seconds.append(time.perf_counter() - start)
        reads.append(counter.reads)
    return reads, seconds


def measure(case: dict, variant: str) -> dict:
    """Worker: `readers` readers of one source read to the end, one after the other, after a warm-up read by one
    reader; rows each reader read, the slowest reader's seconds and all readers' seconds."""
    cfg = Config(**case["config"])
    datasets.disable_progress_bars()
    rows = make_rows(cfg)
    source, mode = variant.split("/")
    if source == "iterable":
        table = datasets.Dataset.from_list([{"input_ids": row["input_ids"].tolist()} for row in rows])

        def make_source():
            counter = ReadCounter()
            return table.to_iterable_dataset(num_shards=cfg.num_shards).map(counter), counter

    else:

        def make_source():
            counter = ReadCounter(rows)
            return counter, counter

    read_all(make_source, num_readers=1, sharding=_sharding(mode), cfg=cfg)  # warm-up
    reads, seconds = read_all(make_source, num_readers=case["readers"], sharding=_sharding(mode), cfg=cfg)
    return {"reads": reads, "slowest_s": max(seconds), "all_s": sum(seconds)}


def summarize(runs, cfg: Config) -> list[Result]:
    """Per reader count and variant: rows read, and the times over the runs (median, min-max); the time of all
    readers over that of the iterable split by shards, within each repeat and of the medians."""
    results = []
    for run in runs:
        for variant in VARIANTS:
            source, mode = variant.split("/")
            reads = run.first(variant, "reads")
            slowest, total = run.spread(variant, "slowest_s"), run.spread(variant, "all_s")
            ratio = run.ratio(variant, "iterable/shards", "all_s")
            results.append(
                Result(
                    source,
                    mode,
                    run.case["readers"],
                    min(reads),
                    max(reads),
                    sum(reads),
                    cfg.num_rows,
                    slowest["median"],
                    total["median"],
                    total["min"],
                    total["max"],
                    ratio["of_medians"],
                    ratio["min"],
                    ratio["max"],
                )
            )
    return results


def _sharding(mode: str) -> str:
    # One reader reads by row index under "auto"; "shards" forces its single shard set (the whole source).
    return "shards" if mode == "shards" else "rows"


def markdown(results: list[Result]) -> str:
    lines = [
        "| source | split by | readers | rows read per reader (min-max) | total reads | reads per row "
        "| slowest reader s | all readers s (median, min-max) | all readers, x shards' time (min-max) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.source} | {'shards' if r.mode == 'shards' else 'row index'} | {r.readers} | {r.reads_min:,}-"
            f"{r.reads_max:,} | {r.reads_total:,} | {r.reads_total / r.rows:.2f} | {r.slowest_s_median:.2f} | "
            f"{r.all_s_median:.2f} ({r.all_s_min:.2f}-{r.all_s_max:.2f}) | "
            f"{r.vs_shards:.2f} ({r.vs_shards_min:.2f}-{r.vs_shards_max:.2f}) |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[Result] | None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if serve_worker(argv, measure):
        return None
    parser = script_parser(__file__, __doc__)
    parser.add_argument("--num-rows", type=positive_int, default=Config.num_rows, help="rows of the stream")
    parser.add_argument("--num-shards", type=positive_int, default=Config.num_shards, help="shards of the iterable")
    parser.add_argument(
        "--readers", type=positive_int, nargs="+", default=list(Config.readers), help="reader counts, one case each"
    )
    parser.add_argument("--out", default=None, help="folder for results.json and results.md")
    add_repeat_arguments(parser, repeats=Config.repeats)
    args = parser.parse_args(argv)
    if max(args.readers) > args.num_shards:
        parser.error(f"--num-shards {args.num_shards} must be at least the most readers ({max(args.readers)})")
    cfg = Config(num_rows=args.num_rows, num_shards=args.num_shards, readers=tuple(args.readers), repeats=args.repeats)
    runs = run_repeats(
        [sys.executable, __file__],
        [{"readers": readers, "config": asdict(cfg)} for readers in cfg.readers],
        VARIANTS,
        repeats=args.repeats,
        label=lambda case: f"{case['readers']} readers",
        progress=not args.no_progress,
    )
    results = summarize(runs, cfg)
    command = command_line(__file__, argv)
    text = f"command: `{command}`\n\n{markdown(results)}"
    print(text)
    payload = {"command": command, "config": asdict(cfg), "versions": {"datasets": datasets.__version__}}
    payload |= {"results": [asdict(r) for r in results], "runs": [run.to_json() for run in runs]}
    write_results(args.out, "results", payload, text)
    return results


if __name__ == "__main__":
    main()
