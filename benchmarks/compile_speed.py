"""`torch.compile` on a prepared model: compile time, then eager against compiled training steps on flattened batches.

Both models are the same prepared tiny causal LM (`flatcollate.models.tiny_causal_lm`, sizes below), trained with
SGD on the same flattened batches (`DataCollatorWithFlattening`, lengths from a length profile, a new length mix
every step). The compiled copy is `torch.compile(model, backend=..., dynamic=...)`; its first step (tracing and code
generation included) and its second, of another total length (a recompile unless shapes are dynamic already), are
timed on the wall clock, compile workers included. The steps that follow alternate eager and compiled on each batch,
so both see the same machine load; their ratio is measured side by side.

    python benchmarks/compile_speed.py                                  # CPU, tiny Llama, prints the table
    python benchmarks/compile_speed.py --output benchmarks/results/compile_speed

With `--output` it writes `<device>.json` and `<device>.md` into that folder.
"""

import argparse
import copy
import itertools
import json
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from flatcollate import DataCollatorWithFlattening, load_profile
from flatcollate.bench.batches import synthetic_sequences
from flatcollate.modeling import prepare_model_for_flattening
from flatcollate.models import tiny_causal_lm


@dataclass(frozen=True)
class Config:
    """One measurement: model, batches and compile settings."""

    family: str = "llama"
    layers: int = 4
    hidden_size: int = 256
    profile: str = "gsm8k"
    sequences_per_batch: int = 8
    max_length: int = 512
    backend: str = "inductor"
    dynamic: bool | None = True
    clock: str = "cpu"
    warmup: int = 2
    repeats: int = 10
    seed: int = 0


@dataclass(frozen=True)
class Result:
    config: Config
    device: str
    first_step_s: float
    second_step_s: float
    compiles: int
    tokens_per_batch: float
    eager_ms: float
    eager_iqr_ms: float
    compiled_ms: float
    compiled_iqr_ms: float
    speedup: float
    max_loss_diff: float


def flattened_batches(config: Config, count: int) -> list[dict]:
    """`count` flattened batches of `sequences_per_batch` sequences each, lengths drawn from the profile."""
    n = config.sequences_per_batch
    seqs = synthetic_sequences(
        load_profile(config.profile), n * count, max_length=config.max_length, vocab_size=256, seed=config.seed
    )
    offsets = np.concatenate([[0], np.cumsum(seqs.lengths)])
    collate = DataCollatorWithFlattening()
    features = [
        {"input_ids": seqs.tokens[s:e], "labels": seqs.labels[s:e]} for s, e in itertools.pairwise(offsets)
    ]  # a loop over sequences, not tokens: each one a slice of the drawn token buffer
    return [collate(features[i * n : (i + 1) * n]) for i in range(count)]


class _CountingBackend:
    """Hands every graph to the named backend and counts them (one per compiled forward or backward graph)."""

    def __init__(self, name: str):
        self.compile, self.count = torch._dynamo.lookup_backend(name), 0

    def __call__(self, graph_module, example_inputs):
        self.count += 1
        return self.compile(graph_module, example_inputs)


def _step(model, optimizer, batch) -> float:
    loss = model(**batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss.detach())


def _clock(kind: str):
    return time.process_time if kind == "cpu" else time.perf_counter


def measure(config: Config) -> Result:
    overrides = {"num_hidden_layers": config.layers, "hidden_size": config.hidden_size}
    overrides |= {"intermediate_size": 2 * config.hidden_size, "head_dim": config.hidden_size // 4}
    eager = prepare_model_for_flattening(tiny_causal_lm(config.family, **overrides)).train()
    twin = copy.deepcopy(eager)
    torch._dynamo.reset()
    backend = _CountingBackend(config.backend)
    compiled = torch.compile(twin, backend=backend, dynamic=config.dynamic)
    batches = flattened_batches(config, 2 + config.warmup + config.repeats)
    eager_opt, compiled_opt = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager, twin))
    first_steps, loss_diffs = [], []
    for batch in batches[:2]:  # compile (and, with static shapes, recompile): wall clock, compile workers included
        start = time.perf_counter()
        compiled_loss = _step(compiled, compiled_opt, batch)
        first_steps.append(time.perf_counter() - start)
        loss_diffs.append(abs(compiled_loss - _step(eager, eager_opt, batch)))
    clock, eager_ms, compiled_ms = _clock(config.clock), [], []
    for index, batch in enumerate(batches[2:]):  # interleaved so both see the same machine load
        timings = []
        for model, optimizer in ((eager, eager_opt), (compiled, compiled_opt)):
            start = clock()
            timings.append((_step(model, optimizer, batch), (clock() - start) * 1e3))
        loss_diffs.append(abs(timings[0][0] - timings[1][0]))
        if index >= config.warmup:
            eager_ms.append(timings[0][1])
            compiled_ms.append(timings[1][1])
    tokens = [b["input_ids"].shape[1] for b in batches[2 + config.warmup :]]
    return Result(
        config=config,
        device="cpu",
        first_step_s=first_steps[0],
        second_step_s=first_steps[1],
        compiles=backend.count,
        tokens_per_batch=float(np.mean(tokens)),
        eager_ms=statistics.median(eager_ms),
        eager_iqr_ms=_iqr(eager_ms),
        compiled_ms=statistics.median(compiled_ms),
        compiled_iqr_ms=_iqr(compiled_ms),
        speedup=statistics.median(eager_ms) / statistics.median(compiled_ms),
        max_loss_diff=max(loss_diffs),
    )


def _iqr(values: list[float]) -> float:
    """Interquartile range; 0 for a single repeat, which has no spread to show."""
    if len(values) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(values, n=4)
    return q3 - q1


def to_markdown(results: list[Result]) -> str:
    lines = [
        "| model | backend | dynamic | tokens/batch | 1st step s (compile) | 2nd step s | graphs compiled | "
        "eager ms (IQR) | compiled ms (IQR) | eager / compiled | max loss diff |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        c = r.config
        lines.append(
            f"| {c.family} {c.layers}x{c.hidden_size} | {c.backend} | {c.dynamic} | {r.tokens_per_batch:.0f} | "
            f"{r.first_step_s:.1f} | {r.second_step_s:.1f} | {r.compiles} | {r.eager_ms:.1f} ({r.eager_iqr_ms:.1f}) | "
            f"{r.compiled_ms:.1f} ({r.compiled_iqr_ms:.1f}) | {r.speedup:.2f}x | {r.max_loss_diff:.1e} |"
        )
    return "\n".join(lines)


def _dynamic(value: str) -> bool | None:
    return {"true": True, "false": False, "none": None}[value.lower()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    defaults = Config()
    parser.add_argument("--family", default=defaults.family, help="model_type of the tiny model")
    parser.add_argument("--layers", type=int, default=defaults.layers, help="decoder layers")
    parser.add_argument("--hidden-size", type=int, default=defaults.hidden_size, help="hidden size (4 heads)")
    parser.add_argument("--profile", default=defaults.profile, help="length profile of the sequences")
    parser.add_argument("--batch-size", type=int, default=defaults.sequences_per_batch, help="sequences per batch")
    parser.add_argument("--max-length", type=int, default=defaults.max_length, help="longest sequence kept")
    parser.add_argument("--backends", nargs="+", default=["inductor", "aot_eager"], help="torch.compile backends")
    parser.add_argument(
        "--dynamic", type=_dynamic, default=defaults.dynamic, help="torch.compile's dynamic= (true, false, none)"
    )
    parser.add_argument("--clock", choices=["cpu", "wall"], default=defaults.clock, help="clock of the timed steps")
    parser.add_argument("--warmup", type=int, default=defaults.warmup, help="untimed steps after the first two")
    parser.add_argument("--repeats", type=int, default=defaults.repeats, help="timed steps per model")
    parser.add_argument("--output", type=Path, default=None, help="folder for <device>.json and <device>.md")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.warmup < 0 or args.layers < 1 or args.hidden_size % 4:
        parser.error(
            f"--repeats must be >= 1, --warmup >= 0, --layers >= 1 and --hidden-size a multiple of 4; got "
            f"{args.repeats}, {args.warmup}, {args.layers}, {args.hidden_size}"
        )
    configs = [
        Config(
            family=args.family,
            layers=args.layers,
            hidden_size=args.hidden_size,
            profile=args.profile,
            sequences_per_batch=args.batch_size,
            max_length=args.max_length,
            backend=backend,
            dynamic=args.dynamic,
            clock=args.clock,
            warmup=args.warmup,
            repeats=args.repeats,
        )
        for backend in args.backends
    ]
    results = [measure(config) for config in tqdm(configs, desc="backends", disable=args.no_progress)]
    table = to_markdown(results)
    print(
        f"device=cpu ({torch.get_num_threads()} threads) torch={torch.__version__} clock of timed steps={args.clock}; "
        f"compile steps on the wall clock\n{table}"
    )
    if args.output is None:
        return 0
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "cpu.json").write_text(json.dumps([asdict(r) for r in results], indent=1))
    (args.output / "cpu.md").write_text(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
