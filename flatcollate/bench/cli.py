"""`flatcollate bench`: measure padded vs flattened training on your model and data before switching.

With no arguments it runs an embedded offline default on the CPU in a few minutes (a tiny Llama-shaped model, the
"flan" length profile, batch 8) and prints padding efficiency, tokens/s per mode, ratios and optimizer step counts.
"""

import argparse
import json
from dataclasses import fields

from .batches import MODES
from .profiles import available_profiles
from .report import summary_text, write_report
from .throughput import ThroughputConfig, run_throughput


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options shared by `flatcollate bench` and `benchmarks/throughput.py`, defaults from `ThroughputConfig`."""
    default = ThroughputConfig()
    parser.add_argument("--model", default=default.model, help="model_type or folder with a config.json")
    parser.add_argument(
        "--full-size", action="store_true", help="keep the config's own sizes (random weights; meant for a GPU)"
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="config attribute to override, e.g. --set hidden_size=256 (repeatable; values parsed as JSON)",
    )
    parser.add_argument("--batch-size", type=int, default=default.batch_size)
    parser.add_argument("--max-length", type=int, default=default.max_length)
    parser.add_argument("--steps", type=int, default=default.steps, help="optimizer steps per timed pass")
    parser.add_argument("--warmup-steps", type=int, default=default.warmup_steps)
    parser.add_argument("--repeats", type=int, default=default.repeats)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(default.modes))
    parser.add_argument("--pack-len", type=int, default=None)
    parser.add_argument(
        "--attn", default=default.flattened_attn, help="attention of the flattened modes (auto: flatcollate backend)"
    )
    parser.add_argument("--lr", type=float, default=default.lr)
    parser.add_argument("--seed", type=int, default=default.seed)
    parser.add_argument("--device", default=default.device, help="auto, cpu or cuda")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default=default.dtype)
    parser.add_argument("--threads", type=int, default=None, help="CPU threads for torch (1 on a shared machine)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def config_from_args(args: argparse.Namespace, *, profile: str) -> ThroughputConfig:
    """`ThroughputConfig` from parsed options; `--set` values on top of the default tiny sizes."""
    default = ThroughputConfig()
    overrides = dict(default.model_overrides) if not args.full_size else {}
    for item in args.overrides:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set expects KEY=VALUE, got {item!r} (e.g. --set hidden_size=256).")
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key] = value
    values = {
        "model": args.model,
        "tiny": not args.full_size,
        "model_overrides": overrides,
        "profile": profile,
        "batch_size": args.batch_size,
        "max_length": args.max_length,
        "steps": args.steps,
        "warmup_steps": args.warmup_steps,
        "repeats": args.repeats,
        "modes": tuple(args.modes),
        "pack_len": args.pack_len,
        "flattened_attn": args.attn,
        "lr": args.lr,
        "seed": args.seed,
        "device": args.device,
        "dtype": args.dtype,
        "threads": args.threads,
    }
    assert set(values) == {f.name for f in fields(ThroughputConfig)}
    return ThroughputConfig(**values)


def run_and_report(config: ThroughputConfig, out_dir: str, *, progress: bool) -> dict:
    """Run one benchmark, print its summary and write the report files."""
    result = run_throughput(config, progress=progress)
    print(summary_text(result))
    for path in write_report(result, out_dir):
        print(f"wrote {path}")
    return result


def _command(args: argparse.Namespace) -> int:
    run_and_report(config_from_args(args, profile=args.profile), args.out_dir, progress=not args.no_progress)
    return 0


def register_cli(subparsers) -> None:
    """Add the `bench` sub-command."""
    parser = subparsers.add_parser(
        "bench",
        help="training throughput and memory: padded vs flattened vs packed",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--profile",
        default=ThroughputConfig().profile,
        help=f"length profile: one of {', '.join(available_profiles())}, a tokenized dataset folder, or a lengths file",
    )
    parser.add_argument("--out-dir", default="flatcollate-bench", help="folder for JSON, markdown and plots")
    add_arguments(parser)
    parser.set_defaults(func=_command)
