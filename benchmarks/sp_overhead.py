"""What sequence parallelism costs on the CPU: the all-to-all against the packed attention kernel, per layer and step.

For each group size (SP 1, 2, 4) the script starts that many processes (gloo over loopback, one thread each) and,
for rows of a few lengths, times forward + backward of:

- the all-to-all of one attention layer: query, key and value to head sharding and the output back (4 exchanges
  forward, 4 backward; `flatcollate.parallel.all_to_all`);
- the packed attention kernel of one layer on the whole row with this rank's heads (what each rank computes);
- a whole training step of a small Llama-shaped model (4 layers) on the row split over the group
  (`prepare_model_for_sequence_parallel`; SP 1 is `prepare_model_for_flattening` on the whole row).

Each repeat is timed between barriers and counts the slowest rank. CPU figures: on a machine with fewer cores than
processes, SP 2 and 4 share cores, so step times do not show the speed-up GPUs get; the all-to-all volume and its
share are what carry over.

    python benchmarks/sp_overhead.py                                       # prints the table
    python benchmarks/sp_overhead.py --out benchmarks/results/sp_overhead  # also JSON and markdown
"""

import argparse
import json
import os
import socket
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from flatcollate import DataCollatorWithFlattening, prepare_model_for_flattening
from flatcollate.attention import packed_attention_forward
from flatcollate.models import tiny_causal_lm
from flatcollate.parallel import prepare_model_for_sequence_parallel, split_for_sequence_parallel
from flatcollate.parallel.all_to_all import heads_to_sequence, sequence_to_heads

MODEL = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 32,
    "vocab_size": 1024,
    "max_position_embeddings": 4096,
}


@dataclass(frozen=True)
class Config:
    """One measurement: a group size and a row of `tokens` tokens (sequences of lognormal lengths)."""

    sp: int
    tokens: int
    warmup: int = 1
    repeats: int = 5
    seed: int = 0


@dataclass(frozen=True)
class Result:
    config: Config
    sequences: int
    all_to_all_ms: float
    all_to_all_spread_ms: float
    kernel_ms: float
    kernel_spread_ms: float
    step_ms: float
    step_spread_ms: float
    all_to_all_share_of_step: float


def row_lengths(tokens: int, seed: int) -> list[int]:
    """Sequence lengths (lognormal, 16 to 2048 tokens) that fill exactly `tokens`."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(mean=5.5, sigma=0.8, size=tokens), 16, 2048).astype(int)
    ends = np.cumsum(lengths)
    count = int(np.searchsorted(ends, tokens))
    kept = [*lengths[:count].tolist(), tokens - int(ends[count - 1]) if count else tokens]
    return [n for n in kept if n > 0]


def _timed(step, repeats: int, warmup: int) -> list[float]:
    """Milliseconds of `step` per repeat, the slowest rank's, each between barriers."""
    for _ in range(warmup):
        step()
    times = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        step()
        elapsed = torch.tensor([(time.perf_counter() - start) * 1e3])
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        times.append(float(elapsed))
    return times


def _spread(values: list[float]) -> float:
    """Interquartile range; 0 for fewer than two repeats."""
    if len(values) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(values, n=4)
    return q3 - q1


def measure(config: Config, rank: int) -> Result:
    size, group = config.sp, dist.group.WORLD
    lengths = row_lengths(config.tokens, config.seed)
    generator = torch.Generator().manual_seed(config.seed)
    rows = [{"input_ids": torch.randint(0, MODEL["vocab_size"], (n,), generator=generator)} for n in lengths]
    row = DataCollatorWithFlattening()(rows)
    part = split_for_sequence_parallel(row, rank=rank, world_size=size)
    boundaries = {k: v for k, v in part.items() if k.startswith(("cu_seq_lens", "max_length"))}
    heads, kv_heads, dim = MODEL["num_attention_heads"], MODEL["num_key_value_heads"], MODEL["head_dim"]
    total, local = part["cu_seq_lens_q"][-1].item(), part["input_ids"].shape[1]

    def tensor(*shape):
        return torch.randn(*shape, generator=generator).requires_grad_()

    q, k, v = tensor(local, heads, dim), tensor(local, kv_heads, dim), tensor(local, kv_heads, dim)

    def exchange():
        moved = [sequence_to_heads(t, group, size) for t in (q, k, v)]
        back = heads_to_sequence(moved[0], group, size)  # the output has the query's shape
        (back.sum() + moved[1].sum() + moved[2].sum()).backward()

    hq, hk, hv = (tensor(1, h // size, total, dim) for h in (heads, kv_heads, kv_heads))
    layer = torch.nn.Module()

    def kernel():
        out, _ = packed_attention_forward(layer, hq, hk, hv, None, **boundaries)
        out.sum().backward()

    model = tiny_causal_lm("llama", seed=config.seed, use_cache=False, **MODEL).train()
    if size > 1:
        prepare_model_for_sequence_parallel(model, group)
        inputs = {key: value for key, value in part.items() if key != "shift_labels"}
    else:
        model = prepare_model_for_flattening(model)
        inputs = {key: value for key, value in row.items() if key != "labels"}

    def step():
        model(**inputs).logits.float().mean().backward()

    a2a = _timed(exchange, config.repeats, config.warmup) if size > 1 else [0.0]
    attention = _timed(kernel, config.repeats, config.warmup)
    steps = _timed(step, config.repeats, config.warmup)
    layers = MODEL["num_hidden_layers"]
    return Result(
        config=config,
        sequences=len(lengths),
        all_to_all_ms=statistics.median(a2a),
        all_to_all_spread_ms=_spread(a2a),
        kernel_ms=statistics.median(attention),
        kernel_spread_ms=_spread(attention),
        step_ms=statistics.median(steps),
        step_spread_ms=_spread(steps),
        all_to_all_share_of_step=layers * statistics.median(a2a) / statistics.median(steps),
    )


def _worker(rank: int, size: int, port: int, configs: list[Config], out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
    results = [measure(config, rank) for config in configs]
    if rank == 0:
        Path(out).write_text(json.dumps([asdict(r) for r in results]))
    dist.barrier()
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run(configs: list[Config]) -> list[Result]:
    """Measure `configs` (one group size at a time, each in its own processes)."""
    results = []
    for size in sorted({c.sp for c in configs}):
        group_configs = [c for c in configs if c.sp == size]
        with tempfile.TemporaryDirectory() as folder:
            out = os.path.join(folder, "results.json")
            mp.start_processes(
                _worker, args=(size, _free_port(), group_configs, out), nprocs=size, start_method="spawn"
            )
            for raw in json.loads(Path(out).read_text()):
                results.append(Result(**{**raw, "config": Config(**raw["config"])}))
    return results


def to_markdown(results: list[Result]) -> str:
    lines = [
        "| SP | row tokens | sequences | all-to-all / layer ms (IQR) | kernel / layer ms (IQR) | all-to-all / kernel "
        "| step ms (IQR) | all-to-all share of step |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(results, key=lambda r: (r.config.tokens, r.config.sp)):
        c = r.config
        a2a = "-" if c.sp == 1 else f"{r.all_to_all_ms:.1f} ({r.all_to_all_spread_ms:.1f})"
        ratio = "-" if c.sp == 1 else f"{r.all_to_all_ms / r.kernel_ms:.2f}"
        share = "-" if c.sp == 1 else f"{r.all_to_all_share_of_step:.0%}"
        lines.append(
            f"| {c.sp} | {c.tokens} | {r.sequences} | {a2a} | {r.kernel_ms:.1f} ({r.kernel_spread_ms:.1f}) | "
            f"{ratio} | {r.step_ms:.1f} ({r.step_spread_ms:.1f}) | {share} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--sp", type=int, nargs="+", default=[1, 2, 4], help="group sizes (processes)")
    parser.add_argument("--tokens", type=int, nargs="+", default=[1024, 4096, 8192], help="row lengths")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="folder for results.json and results.md")
    args = parser.parse_args(argv)
    if args.repeats < 1 or any(size < 1 or MODEL["num_key_value_heads"] % size for size in args.sp):
        parser.error(f"--repeats must be at least 1 and every --sp must divide {MODEL['num_key_value_heads']}")
    configs = [
        Config(sp=size, tokens=tokens, warmup=args.warmup, repeats=args.repeats)
        for size in args.sp
        for tokens in args.tokens
    ]
    results = run(configs)
    table = to_markdown(results)
    print(f"CPU, gloo over loopback, 1 thread per process, torch={torch.__version__}, cores={os.cpu_count()}\n{table}")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps([asdict(r) for r in results], indent=1))
        (args.out / "results.md").write_text(table + "\n")
    return results


if __name__ == "__main__":
    main()
