"""Forward + backward time of packed attention against padded SDPA, for the same sequences.

Packed: all sequences in one row, `flatcollate`'s packed attention (on CPU the per-sequence SDPA kernel; on CUDA the
best kernel available). Padded: the sequences in a `(B, H, max L, D)` batch, SDPA with a causal + padding mask, which
is what a padded batch costs. Both run in one process, interleaved, so their ratio is measured side by side.

    python benchmarks/attention_speed.py                       # CPU, small sizes; prints the table
    python benchmarks/attention_speed.py --device cuda --dtype bfloat16 --scale 8 --output results/attention_speed

With `--output` it also writes `<device>.json` and `<device>.md` into that folder.
"""

import argparse
import json
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from flatcollate.attention import packed_attention_forward, select_kernel
from flatcollate.boundaries import lengths_to_cu_seqlens


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
    repeats: int = 7


@dataclass(frozen=True)
class Result:
    config: Config
    kernel: str
    packed_ms: float
    packed_spread_ms: float
    padded_ms: float
    padded_spread_ms: float
    speedup: float
    fill: float


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


def _timed(step, device: str) -> float:
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    step()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3


def measure(config: Config) -> Result:
    (q, k, v), kwargs = _inputs(config)
    (pq, pk, pv), mask = _padded((q, k, v), config.lengths)
    module = torch.nn.Module()

    def packed_step():
        out, _ = packed_attention_forward(module, q, k, v, None, **kwargs)
        out.sum().backward()

    def padded_step():
        out = F.scaled_dot_product_attention(pq, pk, pv, attn_mask=mask, enable_gqa=config.heads != config.kv_heads)
        out.sum().backward()

    for _ in range(config.warmup):
        packed_step(), padded_step()
    packed, padded = [], []
    for _ in range(config.repeats):  # interleaved so both see the same machine load
        packed.append(_timed(packed_step, config.device))
        padded.append(_timed(padded_step, config.device))
    fill = sum(config.lengths) / (len(config.lengths) * max(config.lengths))
    kernel = select_kernel(q[0].transpose(0, 1), softcap=None, dropout=0.0)
    return Result(
        config=config,
        kernel=kernel,
        packed_ms=statistics.median(packed),
        packed_spread_ms=_iqr(packed),
        padded_ms=statistics.median(padded),
        padded_spread_ms=_iqr(padded),
        speedup=statistics.median(padded) / statistics.median(packed),
        fill=fill,
    )


def _iqr(values: list[float]) -> float:
    """Interquartile range; 0 for a single repeat, which has no spread to show."""
    if len(values) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(values, n=4)
    return q3 - q1


def to_markdown(results: list[Result]) -> str:
    lines = [
        "| mix | sequences | tokens | fill | kernel | packed ms (IQR) | padded SDPA ms (IQR) | padded / packed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        c = r.config
        lines.append(
            f"| {c.name} | {len(c.lengths)} | {sum(c.lengths)} | {r.fill:.2f} | {r.kernel} | "
            f"{r.packed_ms:.1f} ({r.packed_spread_ms:.1f}) | {r.padded_ms:.1f} ({r.padded_spread_ms:.1f}) | "
            f"{r.speedup:.2f}x |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu or cuda")
    parser.add_argument("--dtype", default="float32", help="float32, bfloat16 or float16")
    parser.add_argument("--scale", type=int, default=1, help="multiply every sequence length")
    parser.add_argument("--repeats", type=int, default=7, help="timed forward + backward passes per kernel")
    parser.add_argument("--output", type=Path, default=None, help="folder for <device>.json and <device>.md")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.scale < 1:
        parser.error(f"--repeats and --scale must be at least 1, got {args.repeats} and {args.scale}")
    configs = [
        Config(name=name, lengths=lengths, device=args.device, dtype=args.dtype, repeats=args.repeats)
        for name, lengths in length_mixes(args.scale).items()
    ]
    results = [measure(config) for config in tqdm(configs, desc="length mixes", disable=args.no_progress)]
    table = to_markdown(results)
    print(f"device={args.device} dtype={args.dtype} torch={torch.__version__}\n{table}")
    if args.output is None:
        return 0
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / f"{args.device}.json").write_text(json.dumps([asdict(r) for r in results], indent=1))
    (args.output / f"{args.device}.md").write_text(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
