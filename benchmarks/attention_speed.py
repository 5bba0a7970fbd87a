"""Forward + backward time of packed attention against padded SDPA, for the same sequences.

Packed: all sequences in one row, `flatcollate`'s packed attention (on CPU the per-sequence SDPA kernel; on CUDA the
best kernel available). Padded: the sequences in a `(B, H, max L, D)` batch, SDPA with a causal + padding mask, which
is what a padded batch costs. Every run of a kernel is a fresh process (`--repeats` of them, the kernels taking
turns) that times `--iterations` calls after a warm-up; a run's figure is the median of its calls, the table shows
the median over runs with its min-max, and the ratio of the medians with the min-max of the ratio within each run.

    python benchmarks/attention_speed.py                       # CPU, small sizes; prints the table
    python benchmarks/attention_speed.py --device cuda --dtype bfloat16 --scale 8 --output results/attention_speed

With `--output` it also writes `<device>.json` and `<device>.md` into that folder.
"""

import statistics
import sys
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F

from flatcollate.attention import packed_attention_forward, select_kernel
from flatcollate.bench.repeats import format_spread, run_repeats, serve_worker
from flatcollate.boundaries import lengths_to_cu_seqlens
from flatcollate.cli import positive_int

from _common import add_repeat_arguments, command_line, format_ratio, script_parser, time_calls, write_results

KERNELS = ("packed", "padded")


@dataclass(frozen=True)
class Config:
    """One measurement: a length mix and the attention shape."""

    name: str
    lengths: tuple[int, ...]
    heads: int = 8
    kv_heads: int = 2
    head_dim: int = 64
    device: str = "cpu"
    dtype: str = "float32"
    warmup: int = 2
    iterations: int = 7


def length_mixes(scale: int, seed: int = 0) -> dict[str, tuple[int, ...]]:
    """Named length mixes; `scale` multiplies every length (1 keeps CPU runs short)."""
    rng = np.random.default_rng(seed)
    mixes = {
        "uniform": rng.integers(16, 256, size=16),
        "one_long_many_short": np.array([512] + [24] * 15),
        "chat_like": np.clip(rng.lognormal(mean=4.5, sigma=0.8, size=16), 8, 512).astype(int),
        "equal": np.full(8, 256),
    }
    return {name: tuple(int(x) * scale for x in lengths) for name, lengths in mixes.items()}


def _inputs(config: Config):
    dtype = getattr(torch, config.dtype)
    total = sum(config.lengths)
    make = lambda h: torch.randn(1, h, total, config.head_dim, device=config.device, dtype=dtype, requires_grad=True)  # noqa: E731
    q, k, v = make(config.heads), make(config.kv_heads), make(config.kv_heads)
    cu = torch.from_numpy(lengths_to_cu_seqlens(np.array(config.lengths))).to(config.device)
    longest = max(config.lengths)
    kwargs = {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": longest, "max_length_k": longest}
    return (q, k, v), kwargs


def _padded(packed, lengths):
    """The same tokens as a padded `(B, H, max L, D)` batch and its causal + padding mask `(B, 1, L, L)`."""
    longest = max(lengths)
    rows = []
    for tensor in packed:  # a handful of tensors, each split per sequence: setup only, not timed
        pieces = torch.split(tensor.detach()[0], list(lengths), dim=1)
        rows.append(torch.stack([F.pad(p, (0, 0, 0, longest - p.shape[1])) for p in pieces]).requires_grad_())
    valid = (
        torch.arange(longest, device=packed[0].device)[None, :]
        < torch.tensor(lengths, device=packed[0].device)[:, None]
    )
    causal = torch.ones(longest, longest, dtype=torch.bool, device=packed[0].device).tril()
    mask = causal[None, None] & valid[:, None, None, :]
    return rows, mask


def measure(case: dict, kernel: str) -> dict:
    """Worker: median milliseconds of one forward + backward of `kernel` on the case's sequences."""
    config = Config(**{**case, "lengths": tuple(case["lengths"])})
    (q, k, v), kwargs = _inputs(config)
    if kernel == "packed":
        module = torch.nn.Module()

        def step():
            out, _ = packed_attention_forward(module, q, k, v, None, **kwargs)
            out.sum().backward()

        name = select_kernel(q[0].transpose(0, 1), softcap=None, dropout=0.0)
    else:
        (pq, pk, pv), mask = _padded((q, k, v), config.lengths)

        def step():
            out = F.scaled_dot_product_attention(pq, pk, pv, attn_mask=mask, enable_gqa=config.heads != config.kv_heads)
            out.sum().backward()

        name = "sdpa"
    synchronize = torch.cuda.synchronize if config.device == "cuda" else None
    times = time_calls(step, iterations=config.iterations, warmup=config.warmup, synchronize=synchronize)
    return {"ms": statistics.median(times), "kernel": name}


def summarize(runs) -> list[dict]:
    """Per mix: the packed and padded figures over the runs and their ratio."""
    rows = []
    for run in runs:
        lengths = run.case["lengths"]
        rows.append({
            "mix": run.case["name"],
            "sequences": len(lengths),
            "tokens": sum(lengths),
            "fill": sum(lengths) / (len(lengths) * max(lengths)),
            "kernel": run.first("packed", "kernel"),
            "packed_ms": run.spread("packed", "ms"),
            "padded_ms": run.spread("padded", "ms"),
            "padded_over_packed": run.ratio("padded", "packed", "ms"),
        })
    return rows


def to_markdown(rows: list[dict]) -> str:
    lines = [
        "| mix | sequences | tokens | fill | kernel | packed ms (median, min-max) | padded SDPA ms (median, min-max) | "
        "padded / packed (min-max) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['mix']} | {r['sequences']} | {r['tokens']} | {r['fill']:.2f} | {r['kernel']} | "
            f"{format_spread(r['packed_ms'])} | {format_spread(r['padded_ms'])} | "
            f"{format_ratio(r['padded_over_packed'])} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if serve_worker(argv, measure):
        return 0
    parser = script_parser(__file__, __doc__)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu or cuda")
    parser.add_argument("--dtype", default="float32", help="float32, bfloat16 or float16")
    parser.add_argument("--scale", type=positive_int, default=1, help="multiply every sequence length")
    parser.add_argument(
        "--iterations", type=positive_int, default=Config.iterations, help="timed forward + backward calls per run"
    )
    parser.add_argument("--output", default=None, help="folder for <device>.json and <device>.md")
    add_repeat_arguments(parser)
    args = parser.parse_args(argv)
    configs = [
        Config(name=name, lengths=lengths, device=args.device, dtype=args.dtype, iterations=args.iterations)
        for name, lengths in length_mixes(args.scale).items()
    ]
    runs = run_repeats(
        [sys.executable, __file__],
        [asdict(config) for config in configs],
        KERNELS,
        repeats=args.repeats,
        label=lambda case: case["name"],
        progress=not args.no_progress,
    )
    rows = summarize(runs)
    command = command_line(__file__, argv)
    text = f"command: `{command}`\ndevice={args.device} dtype={args.dtype} torch={torch.__version__}\n\n"
    text += to_markdown(rows)
    print(text)
    payload = {"command": command, "repeats": args.repeats, "rows": rows, "runs": [run.to_json() for run in runs]}
    write_results(args.output, args.device, payload, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
