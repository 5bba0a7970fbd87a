"""`flatcollate bench`: measure padded vs flattened training on your model and data before switching.

With no arguments it runs an embedded offline default on the CPU in about 3.5 minutes (a tiny Llama-shaped model,
the "flan" length profile, batch 8, one torch thread) and prints padding efficiency, tokens/s per mode, ratios,
optimizer step counts and, last, the headline: flatcollate and transformers' own padding-free path against padded
batches, with their spread over repeats. `--vision` measures image-text training instead (see
`flatcollate.bench.vision`), `--task dpo` preference training: trl.DPOTrainer on padded batches against
FlatDPOTrainer on flattened rows (see `flatcollate.bench.dpo`), `--task reward` reward-model training:
trl.RewardTrainer against FlatRewardTrainer on the same pairs (see `flatcollate.bench.reward`).
"""

import argparse
import math
import os
from dataclasses import fields
from pathlib import Path

from ..cli import HelpFormatter, UsageError

# The options come from `config` alone; torch, transformers and the benchmark are imported inside the functions that
# check and run a command, so `flatcollate bench --help` answers at once.
from ..profiles.names import available_pair_profiles, available_profiles
from .config import MAX_IMAGES, MODES, DPOBenchConfig, ThroughputConfig
from .options import check_attn, check_heads, check_memory, check_pack_len, check_profile, check_writable
from .overrides import check_overrides, parse_overrides

TEXT_ONLY = {"model": "--model", "full_size": "--full-size", "modes": "--modes", "pack_len": "--pack-len"}
TEXT_ONLY |= {"attn": "--attn"}
"""Options the vision profile does not take (its model and modes are fixed); they default to None or False, so a
given one is told apart from its default."""

VISION_ONLY = {"max_images": "--max-images", "max_pixels": "--max-pixels"}
"""Options only the vision profile takes (default None)."""


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
    parser.add_argument(
        "--model", default=None, help=f"model_type or folder with a config.json (default: {default.model})"
    )
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
        default=None,
        metavar="MODE",
        help=f"what to measure, from {', '.join(MODES)}: padded_max pads to --max-length, hf_flattened is "
        f"transformers' own padding-free path (default: {' '.join(default.modes)})",
    )
    parser.add_argument(
        "--pack-len", type=_positive_int, default=None, help="tokens per pack (default: about a batch's tokens)"
    )
    parser.add_argument(
        "--attn",
        default=None,
        help=f"attention of the flattened modes (auto: flatcollate backend) (default: {default.flattened_attn})",
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


def add_vision_arguments(parser: argparse.ArgumentParser) -> None:
    """The options only the vision profile takes."""
    parser.add_argument(
        "--vision",
        action="store_true",
        help="image-text profile: a small Qwen2.5-VL-shaped model, padded vs flattened, 0-N images per example "
        "sized by Qwen2-VL's dynamic resolution (--profile gives the text lengths; --set sizes the language model)",
    )
    parser.add_argument(
        "--max-images",
        type=_non_negative_int,
        default=None,
        help=f"--vision: images per example, 0-N (default: {MAX_IMAGES})",
    )
    parser.add_argument(
        "--max-pixels",
        type=_non_negative_int,
        default=None,
        help="--vision: the image processor's max_pixels (default: Qwen2-VL's, 28*28*1280)",
    )


def config_from_args(args: argparse.Namespace, *, profile: str) -> ThroughputConfig:
    """`ThroughputConfig` from parsed options; `--set` values on top of the default tiny sizes."""
    default = ThroughputConfig()
    overrides = parse_overrides(args.overrides, default.model_overrides if not args.full_size else {})
    values = {
        "model": args.model or default.model,
        "tiny": not args.full_size,
        "model_overrides": overrides,
        "profile": profile,
        "batch_size": args.batch_size,
        "max_length": args.max_length,
        "steps": args.steps,
        "warmup_steps": args.warmup_steps,
        "repeats": args.repeats,
        "modes": tuple(args.modes or default.modes),
        "pack_len": args.pack_len,
        "flattened_attn": args.attn or default.flattened_attn,
        "lr": args.lr,
        "seed": args.seed,
        "device": args.device,
        "dtype": args.dtype,
        "threads": args.threads,
    }
    assert set(values) == {f.name for f in fields(ThroughputConfig)}
    return ThroughputConfig(**values)


def run_and_report(config: ThroughputConfig, out_dir: str, *, progress: bool) -> dict:
    """Run one benchmark, every (mode, repeat) in a fresh process, the modes taking turns (`flatcollate.bench.
    isolated`); print its summary and write the report files."""
    from .batches import UnlabelledBatch
    from .isolated import run_throughput_in_processes
    from .report import summary_text, write_report
    from .worker import WORKER_COMMAND

    try:
        result = run_throughput_in_processes(config, list(WORKER_COMMAND), progress=progress)
    except UnlabelledBatch as error:
        raise UsageError(str(error)) from None
    print(summary_text(result))
    for path in write_report(result, out_dir):
        print(f"wrote {path}")
    return result


def validate(config: ThroughputConfig, out_dir: str | os.PathLike | None, *, set_keys: set[str]) -> None:
    """Raise `UsageError` for what would fail or mislead later: an unknown model or profile, a `--set` key
    (`set_keys`) the config does not have or a size that is not a positive integer, CUDA that is not there, an
    attention backend that is unknown or not installed, a pack shorter than `--max-length`, head counts the model
    cannot be built with, more memory than the device has free, an output folder that cannot be written. Runs
    before any training."""
    import torch

    from ..check.options import validate_model_argument
    from .throughput import model_config, resolve_device

    validate_model_argument(config.model, command="bench")
    check_profile(config.profile)
    check_overrides(config, set_keys)
    if config.device == "cuda" and not torch.cuda.is_available():
        raise UsageError(
            f"--device cuda: CUDA is not available (torch {torch.__version__}, "
            f"{'no GPU found' if torch.version.cuda else 'a CPU-only build'}); use --device cpu or auto."
        )
    device = resolve_device(config.device).type
    check_attn(config.flattened_attn, device)
    check_pack_len(config.pack_len, config.max_length)
    check_heads(model_config(config), {k: v for k, v in config.model_overrides.items() if k in set_keys})
    check_memory(config, device)
    if out_dir is not None:
        check_writable(Path(out_dir))


def _command(args: argparse.Namespace) -> int:
    if args.task in ("dpo", "reward"):
        from .dpo_cli import run_dpo_command

        return run_dpo_command(args)
    args.profile = args.profile or ThroughputConfig().profile
    _refuse_options_of_the_other_profile(args)
    if args.vision:
        from .vision_report import run_vision_command

        return run_vision_command(args)
    config = config_from_args(args, profile=args.profile)
    validate(config, args.out_dir, set_keys={item.partition("=")[0] for item in args.overrides})
    run_and_report(config, args.out_dir, progress=not args.no_progress)
    return 0


def _refuse_options_of_the_other_profile(args: argparse.Namespace) -> None:
    """Raise `UsageError` for a text-only option given with `--vision`, or a vision-only one without it."""
    refused = TEXT_ONLY if args.vision else VISION_ONLY
    given = [option for name, option in refused.items() if getattr(args, name) not in (None, False)]
    if given and args.vision:
        raise UsageError(
            f"{given[0]} does not apply to --vision (its model is qwen2_5_vl, its modes padded and flattened); "
            "leave it out, or size the language model with --set."
        )
    if given:
        raise UsageError(f"{given[0]} applies to the image-text profile only: add --vision, or leave it out.")


def register_cli(subparsers) -> None:
    """Add the `bench` sub-command."""
    parser = subparsers.add_parser(
        "bench",
        help="training throughput and memory: padded vs transformers' padding-free vs flatcollate",
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    parser.add_argument(
        "--task",
        choices=("sft", "dpo", "reward"),
        default="sft",
        help="sft: supervised fine-tuning, the modes below; dpo: trl.DPOTrainer (padded) vs FlatDPOTrainer "
        "(flattened) on preference pairs, --batch-size pairs per step (needs trl); reward: trl.RewardTrainer vs "
        "FlatRewardTrainer on the same pairs",
    )
    parser.add_argument(
        "--profile",
        default=None,
        help=f"length profile: one of {', '.join(available_profiles())}, a tokenized dataset folder, or a lengths "
        f"file; with --task dpo or reward a pair profile, one of {', '.join(available_pair_profiles())} (default: "
        f"{ThroughputConfig().profile}; --task dpo, reward: {DPOBenchConfig().profile})",
    )
    parser.add_argument("--out-dir", default="flatcollate-bench", help="folder for JSON, markdown and plots")
    add_arguments(parser)
    add_vision_arguments(parser)
    parser.set_defaults(func=_command)
