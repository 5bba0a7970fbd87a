"""Streaming readers: rows each reader reads, by source shards vs by row index, with 1, 4 and 16 readers.

    python benchmarks/stream_readers.py --out benchmarks/results/stream_readers

`R` readers (data-parallel ranks times DataLoader workers) are simulated in one process: reader `r` is a
`StreamingPacker(rank=r, world_size=R)`, read to the end. Every row a source hands out is counted where it is read (a
`map` function on a `datasets.IterableDataset`, `__getitem__` on a list), so the counts are the rows each reader really
read, not the rows it kept. Sources, all of the same `num_rows` pre-tokenized rows:

- `iterable`: `Dataset.to_iterable_dataset(num_shards=...)`, read by shards (`sharding="auto"`, at least one shard per
  reader) and by row index (`sharding="rows"`, what every reader did before);
- `list`: random access, split by row index; the cursor jumps over other readers' rows.

Times: the slowest reader (what a parallel run waits for) and all readers together (the CPU spent), median of repeats.
"""

import argparse
import json
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import datasets
import numpy as np

from flatcollate.streaming import StreamingPacker


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


def run(cfg: Config) -> list[Result]:
    rows = make_rows(cfg)
    table = datasets.Dataset.from_list([{"input_ids": row["input_ids"].tolist()} for row in rows])

    def iterable():
        counter = ReadCounter()
        return table.to_iterable_dataset(num_shards=cfg.num_shards).map(counter), counter

    def random_access():
        counter = ReadCounter(rows)
        return counter, counter

    cases = [("iterable", "shards", iterable), ("iterable", "rows", iterable), ("list", "rows", random_access)]
    results = []
    for num_readers in cfg.readers:
        slowest, totals, reads = {case: [] for case in cases}, {case: [] for case in cases}, {}
        for case in cases:  # warm-up
            read_all(case[2], num_readers=1, sharding=_sharding(case[1]), cfg=cfg)
        for _ in range(cfg.repeats):
            for case in cases:  # the modes take turns, so a busy moment of the machine hits them alike
                reads[case], seconds = read_all(case[2], num_readers=num_readers, sharding=_sharding(case[1]), cfg=cfg)
                slowest[case].append(max(seconds))
                totals[case].append(sum(seconds))
        for case in cases:
            source, mode, _ = case
            results.append(
                Result(
                    source,
                    mode,
                    num_readers,
                    min(reads[case]),
                    max(reads[case]),
                    sum(reads[case]),
                    cfg.num_rows,
                    statistics.median(slowest[case]),
                    statistics.median(totals[case]),
                    min(totals[case]),
                    max(totals[case]),
                )
            )
            print(f"{source} {mode} x{num_readers}: {sum(reads[case]):,} reads, {results[-1].all_s_median:.2f} s")
    return results


def _sharding(mode: str) -> str:
    # One reader reads by row index under "auto"; "shards" forces its single shard set (the whole source).
    return "shards" if mode == "shards" else "rows"


def markdown(results: list[Result]) -> str:
    lines = [
        "| source | split by | readers | rows read per reader (min-max) | total reads | reads per row "
        "| slowest reader s | all readers s (median, min-max) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.source} | {'shards' if r.mode == 'shards' else 'row index'} | {r.readers} | {r.reads_min:,}-"
            f"{r.reads_max:,} | {r.reads_total:,} | {r.reads_total / r.rows:.2f} | {r.slowest_s_median:.2f} | "
            f"{r.all_s_median:.2f} ({r.all_s_min:.2f}-{r.all_s_max:.2f}) |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-rows", type=int, default=Config.num_rows)
    parser.add_argument("--num-shards", type=int, default=Config.num_shards)
    parser.add_argument("--readers", type=int, nargs="+", default=list(Config.readers))
    parser.add_argument("--repeats", type=int, default=Config.repeats)
    parser.add_argument("--out", default=None, help="folder for results.json and results.md")
    args = parser.parse_args(argv)
    if max(args.readers) > args.num_shards:
        parser.error(f"--num-shards {args.num_shards} must be at least the most readers ({max(args.readers)})")
    datasets.disable_progress_bars()
    cfg = Config(num_rows=args.num_rows, num_shards=args.num_shards, readers=tuple(args.readers), repeats=args.repeats)
    results = run(cfg)
    table = markdown(results)
    print(table)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        payload = {
            "config": asdict(cfg),
            "versions": {"datasets": datasets.__version__},
            "results": [asdict(r) for r in results],
        }
        (out / "results.json").write_text(json.dumps(payload, indent=1))
        (out / "results.md").write_text(table + "\n")
    return results


if __name__ == "__main__":
    main()
