"""`flatcollate bench`: measure padded vs flattened training on your model and data before switching.

With no arguments it runs an embedded offline default on the CPU in a couple of minutes (a tiny Llama-shaped model,
the "flan" length profile, batch 8, one torch thread) and prints padding efficiency, tokens/s per mode, ratios,
optimizer step counts and, last, the headline: flatcollate and transformers' own padding-free path against padded
batches, with their spread over repeats. `--vision` measures image-text training instead (see
`flatcollate.bench.vision`).
"""

import argparse
import difflib
import json
import math
import os
import tempfile
from dataclasses import fields
from pathlib import Path

import torch
from transformers import AutoConfig

from ..check_cli import validate_model_argument
from ..cli import HelpFormatter, UsageError
from ..models import tiny_config
from .batches import MODES
from .profiles import available_profiles, load_profile
from .report import summary_text, write_report
from .throughput import ThroughputConfig, run_throughput
from .vision_report import add_vision_arguments, run_vision_command


def _positive_int(text: str) -> int:
    return _bounded(int, text, minimum=1, what="a positive integer")


def _non_negative_int(text: str) -> int:
    return _bounded(int, text, minimum=0, what="an integer >= 0")


def _positive_float(text: str) -> float:
    return _bounded(float, text, minimum=None, what="a positive, finite number")


def _bounded(kind, text: str, *, minimum: int | None, what: str):
    """argparse type: `kind(text)`, at least `minimum` (or > 0 and finite for floats), else a one-line error."""
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    bad = value < minimum if minimum is not None else not (math.isfinite(value) and value > 0)
    if bad:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


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
        help="config attribute to override, e.g. --set hidden_size=256 (repeatable; values parsed as JSON; the key "
        "must exist in the model's config)",
    )
    parser.add_argument(
        "--batch-size", type=_positive_int, default=default.batch_size, help="sequences per optimizer step"
    )
    parser.add_argument(
        "--max-length", type=_positive_int, default=default.max_length, help="longer sequences are truncated"
    )
    parser.add_argument("--steps", type=_positive_int, default=default.steps, help="optimizer steps per timed pass")
    parser.add_argument(
        "--warmup-steps",
        type=_non_negative_int,
        default=default.warmup_steps,
        help="untimed steps before every timed pass (each mode also warms up until its step times settle)",
    )
    parser.add_argument(
        "--repeats", type=_positive_int, default=default.repeats, help="timed passes per mode, interleaved"
    )
    parser.add_argument(
        "--modes",
        nargs="+",
        choices=MODES,
        default=list(default.modes),
        metavar="MODE",
        help=f"what to measure, from {', '.join(MODES)}: padded_max pads to --max-length, hf_flattened is "
        "transformers' own padding-free path",
    )
    parser.add_argument(
        "--pack-len", type=_positive_int, default=None, help="tokens per pack (default: about a batch's tokens)"
    )
    parser.add_argument(
        "--attn", default=default.flattened_attn, help="attention of the flattened modes (auto: flatcollate backend)"
    )
    parser.add_argument("--lr", type=_positive_float, default=default.lr, help="AdamW learning rate")
    parser.add_argument("--seed", type=int, default=default.seed, help="seed of lengths, token ids and weights")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default=default.device, help="auto: CUDA if any")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default=default.dtype, help="model dtype")
    parser.add_argument(
        "--threads",
        type=_positive_int,
        default=None,
        help="torch CPU threads (default: 1 on a CPU, where more threads on a shared machine distort timings)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def config_from_args(args: argparse.Namespace, *, profile: str) -> ThroughputConfig:
    """`ThroughputConfig` from parsed options; `--set` values on top of the default tiny sizes."""
    default = ThroughputConfig()
    overrides = dict(default.model_overrides) if not args.full_size else {}
    for item in args.overrides:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--set expects KEY=VALUE, got {item!r} (e.g. --set hidden_size=256).")
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


def validate(config: ThroughputConfig, out_dir: str | os.PathLike | None, *, set_keys: set[str]) -> None:
    """Raise `UsageError` for what would fail or mislead later: an unknown model or profile, a `--set` key
    (`set_keys`) the config does not have or a size that is not a positive integer, CUDA that is not there, an
    output folder that cannot be written. Runs before any training."""
    validate_model_argument(config.model)
    try:
        load_profile(config.profile)
    except (ValueError, OSError) as error:
        raise UsageError(
            f"--profile {config.profile}: {str(error).splitlines()[0]} (named profiles: "
            f"{', '.join(available_profiles())})"
        ) from None
    _check_overrides(config, set_keys)
    if config.device == "cuda" and not torch.cuda.is_available():
        raise UsageError(
            f"--device cuda: CUDA is not available (torch {torch.__version__}, "
            f"{'no GPU found' if torch.version.cuda else 'a CPU-only build'}); use --device cpu or auto."
        )
    if out_dir is not None:
        check_writable(Path(out_dir))


def _check_overrides(config: ThroughputConfig, keys: set[str]) -> None:
    """Every override names an attribute of the model's config; sizes that are positive integers stay so."""
    base = (
        AutoConfig.from_pretrained(config.model) if Path(config.model).is_dir() else AutoConfig.for_model(config.model)
    )
    if config.tiny:
        base = tiny_config(base)
    known = set(base.to_dict()) | set(base.attribute_map)
    for key in sorted(keys):
        if key not in known and not hasattr(base, key):
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise UsageError(f"--set {key}: the {base.model_type} config has no attribute {key!r}{hint}")
        current, value = getattr(base, key, None), config.model_overrides[key]
        is_size = isinstance(current, int) and not isinstance(current, bool) and current > 0
        if is_size and not (isinstance(value, int) and not isinstance(value, bool) and value > 0):
            raise UsageError(
                f"--set {key}={json.dumps(value)}: {key} is a positive integer (the config has {current})."
            )


def check_writable(out_dir: Path) -> None:
    """Raise `UsageError` unless `out_dir` is (or can be created as) a folder this process can write files into."""
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"--out-dir {out_dir}: exists and is not a folder.")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out_dir):
            pass
    except OSError as error:
        raise UsageError(f"--out-dir {out_dir}: cannot write there ({error.strerror or error}).") from None


def _command(args: argparse.Namespace) -> int:
    if args.vision:
        return run_vision_command(args)
    config = config_from_args(args, profile=args.profile)
    validate(config, args.out_dir, set_keys={item.partition("=")[0] for item in args.overrides})
    run_and_report(config, args.out_dir, progress=not args.no_progress)
    return 0


def register_cli(subparsers) -> None:
    """Add the `bench` sub-command."""
    parser = subparsers.add_parser(
        "bench",
        help="training throughput and memory: padded vs transformers' padding-free vs flatcollate",
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    parser.add_argument(
        "--profile",
        default=ThroughputConfig().profile,
        help=f"length profile: one of {', '.join(available_profiles())}, a tokenized dataset folder, or a lengths file",
    )
    parser.add_argument("--out-dir", default="flatcollate-bench", help="folder for JSON, markdown and plots")
    add_arguments(parser)
    add_vision_arguments(parser)
    parser.set_defaults(func=_command)
