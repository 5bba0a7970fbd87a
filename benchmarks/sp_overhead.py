"""What sequence parallelism costs on the CPU: the all-to-all against the packed attention kernel, per layer and step.

For each group size (SP 1, 2, 4) the script starts that many processes (gloo over loopback, one thread each) and,
for rows of a few lengths, times forward + backward of:

- the all-to-all of one attention layer: query, key and value to head sharding and the output back (4 exchanges
  forward, 4 backward; `flatcollate.parallel.all_to_all`);
- the packed attention kernel of one layer on the whole row with this rank's heads (what each rank computes);
- a whole training step of a small Llama-shaped model (4 layers) on the row split over the group
  (`prepare_model_for_sequence_parallel`; SP 1 is `prepare_model_for_flattening` on the whole row).

Each call is timed between barriers and counts the slowest rank; a run's figure is the median of `--iterations`
calls after `--warmup`. Every run of a group size starts from a fresh process (which starts the group's processes),
the group sizes taking turns within each of `--repeats` repeats; the table shows the median over runs with its
min-max, and the all-to-all's cost relative to the kernel and to the step as the ratio of the medians with the
min-max of the ratio within each run. CPU figures: on a machine with fewer cores than processes, SP 2 and 4 share
cores, so step times do not show the speed-up GPUs get; the all-to-all volume and its share are what carry over.

    python benchmarks/sp_overhead.py                                       # prints the table
    python benchmarks/sp_overhead.py --out benchmarks/results/sp_overhead  # also JSON and markdown
"""

import gc
import os
import socket
import statistics
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from flatcollate import DataCollatorWithFlattening, prepare_model_for_flattening
from flatcollate.attention import packed_attention_forward
from flatcollate.bench.repeats import format_spread, ratio_spread, run_repeats, serve_worker
from flatcollate.cli import non_negative_int, positive_int
from flatcollate.parallel import prepare_model_for_sequence_parallel, split_for_sequence_parallel
from flatcollate.parallel.all_to_all import heads_to_sequence, sequence_to_heads
from flatcollate.testing import tiny_causal_lm

from _common import add_repeat_arguments, command_line, format_ratio, script_parser, write_results

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
    iterations: int = 5
    seed: int = 0


def row_lengths(tokens: int, seed: int) -> list[int]:
    """Sequence lengths (lognormal, 16 to 2048 tokens) that fill exactly `tokens`."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(mean=5.5, sigma=0.8, size=tokens), 16, 2048).astype(int)
    ends = np.cumsum(lengths)
    count = int(np.searchsorted(ends, tokens))
    kept = [*lengths[:count].tolist(), tokens - int(ends[count - 1]) if count else tokens]
    return [n for n in kept if n > 0]


def _timed(step, iterations: int, warmup: int) -> float:
    """Median milliseconds of `step` over `iterations` calls, each the slowest rank's, between barriers."""
    for _ in range(warmup):
        step()
    times = []
    for _ in range(iterations):
        dist.barrier()
        start = time.perf_counter()
        step()
        elapsed = torch.tensor([(time.perf_counter() - start) * 1e3])
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        times.append(float(elapsed))
    return statistics.median(times)


def measure_rank(config: Config, rank: int) -> dict:
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

    a2a = _timed(exchange, config.iterations, config.warmup) if size > 1 else 0.0
    attention = _timed(kernel, config.iterations, config.warmup)
    steps = _timed(step, config.iterations, config.warmup)
    return {"sequences": len(lengths), "all_to_all_ms": a2a, "kernel_ms": attention, "step_ms": steps}


def _rank(rank: int, config: Config, port: int) -> dict:
    """Join the group as `rank`, one torch thread, and measure."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=config.sp)
    figures = measure_rank(config, rank)
    dist.barrier()
    # The prepared model holds the group in reference cycles; left to the interpreter's exit, the group's gloo threads
    # are ended inside a destructor ("terminate called without an active exception", SIGABRT now and then on a busy
    # machine; see examples/accelerate/fsdp2_train.py `end_training`). Collected now, destroying the group joins them.
    gc.collect()
    dist.destroy_process_group()
    return figures


def _other_rank(index: int, config: Config, port: int) -> None:
    _rank(index + 1, config, port)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def measure(case: dict, variant: str) -> dict:
    """Worker: measure the case's row on a group of `variant` processes, this one rank 0 (rank 0's figures are the
    slowest rank's: every time is the maximum over the group)."""
    config = Config(sp=int(variant), **case)
    port = _free_port()
    others = None
    if config.sp > 1:
        others = mp.start_processes(
            _other_rank, args=(config, port), nprocs=config.sp - 1, join=False, start_method="spawn"
        )
    figures = _rank(0, config, port)
    while others is not None and not others.join():
        pass
    return figures


def summarize(runs) -> list[dict]:
    """Per row length and group size: times over the runs, the all-to-all over the kernel, its share of a step."""
    rows = []
    for run in runs:
        for variant in run.figures:
            a2a = run.values(variant, "all_to_all_ms")
            layers = [MODEL["num_hidden_layers"] * ms for ms in a2a]
            rows.append({
                "sp": int(variant),
                "tokens": run.case["tokens"],
                "sequences": run.first(variant, "sequences"),
                "all_to_all_ms": run.spread(variant, "all_to_all_ms"),
                "kernel_ms": run.spread(variant, "kernel_ms"),
                "step_ms": run.spread(variant, "step_ms"),
                "all_to_all_over_kernel": ratio_spread(a2a, run.values(variant, "kernel_ms")),
                "all_to_all_share_of_step": ratio_spread(layers, run.values(variant, "step_ms")),
            })
    return rows


def to_markdown(rows: list[dict]) -> str:
    lines = [
        "| SP | row tokens | sequences | all-to-all / layer ms (median, min-max) | kernel / layer ms (median, min-max) "
        "| all-to-all / kernel (min-max) | step ms (median, min-max) | all-to-all share of step (min-max) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: (r["tokens"], r["sp"])):
        alone = r["sp"] == 1
        a2a = "-" if alone else format_spread(r["all_to_all_ms"])
        ratio = "-" if alone else format_ratio(r["all_to_all_over_kernel"])
        share = "-" if alone else _percent(r["all_to_all_share_of_step"])
        lines.append(
            f"| {r['sp']} | {r['tokens']} | {r['sequences']} | {a2a} | {format_spread(r['kernel_ms'])} | {ratio} | "
            f"{format_spread(r['step_ms'], 0)} | {share} |"
        )
    return "\n".join(lines)


def _percent(ratio: dict) -> str:
    return f"{ratio['of_medians']:.0%} ({ratio['min']:.0%}-{ratio['max']:.0%})"


def main(argv: list[str] | None = None) -> list[dict] | None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if serve_worker(argv, measure):
        return None
    parser = script_parser(__file__, __doc__)
    parser.add_argument("--sp", type=positive_int, nargs="+", default=[1, 2, 4], help="group sizes (processes)")
    parser.add_argument("--tokens", type=positive_int, nargs="+", default=[1024, 4096, 8192], help="row lengths")
    parser.add_argument("--iterations", type=positive_int, default=Config.iterations, help="timed calls per run")
    parser.add_argument("--warmup", type=non_negative_int, default=Config.warmup, help="untimed calls before them")
    parser.add_argument("--out", default=None, help="folder for results.json and results.md")
    add_repeat_arguments(parser)
    args = parser.parse_args(argv)
    if any(MODEL["num_key_value_heads"] % size for size in args.sp):
        parser.error(f"every --sp must divide {MODEL['num_key_value_heads']} (the key-value heads), got {args.sp}")
    cases = [{"tokens": t, "warmup": args.warmup, "iterations": args.iterations} for t in args.tokens]
    runs = run_repeats(
        [sys.executable, __file__],
        cases,
        [str(size) for size in args.sp],
        repeats=args.repeats,
        label=lambda case: f"{case['tokens']} tokens, SP",
        progress=not args.no_progress,
    )
    rows = summarize(runs)
    command = command_line(__file__, argv)
    text = (
        f"command: `{command}`\nCPU, gloo over loopback, 1 thread per process, torch={torch.__version__}, "
        f"cores={os.cpu_count()}\n\n{to_markdown(rows)}"
    )
    print(text)
    payload = {"command": command, "repeats": args.repeats, "rows": rows, "runs": [run.to_json() for run in runs]}
    write_results(args.out, "results", payload, text)
    return rows


if __name__ == "__main__":
    main()
