"""`flatcollate bench`: measure padded vs flattened training on your model and data before switching.

With no arguments it runs an embedded offline default on the CPU in four to five minutes (a tiny Llama-shaped model,
the "flan" length profile, batch 8, one torch thread) and prints the padding of padded batches, tokens/s per mode,
ratios, optimizer step counts and, last, the headline: flatcollate and transformers' own padding-free path against
padded batches, with their spread over repeats. `--task` (below) measures image-text, preference, reward or GRPO
training instead. Every task runs through one harness (`flatcollate.bench.harness`), each (mode, repeat) a fresh
process.
"""

import argparse
import json
import shlex
from dataclasses import fields
from pathlib import Path

from .._paths import expand_path
from ..cli import HelpFormatter, UsageError, non_negative_int, positive_float, positive_int

# The options come from `config` alone; torch, transformers and the benchmark are imported inside the functions that
# check and run a command, so `flatcollate bench --help` answers at once.
from ..profiles.names import available_pair_profiles, available_profiles
from .config import MAX_IMAGES, NON_NEGATIVE, OPTIONAL_POSITIVE, POSITIVE, PairBenchConfig, SFTBenchConfig
from .options import check_plotting, check_writable
from .tasks import task_names

FIXED_FIELDS = ("model_overrides", "tiny")
"""Config fields set by `--set` and `--full-size`; every other field `name` is set by the option `--name` (dashes for
underscores), whose argparse destination is the field's name."""

TASK_OPTIONS = ("model", "full_size", "modes", "pack_len", "attn", "max_images", "min_pixels", "max_pixels")
"""Options only some tasks take, by destination: those whose field (`tiny` for `full_size`) the task's config has.
They default to None or False, so a given one is told apart from its default. `--vision` selects a task
(`task_of`)."""


def option(dest: str) -> str:
    """The option of an argparse destination (a config field): `"batch_size"` -> `"--batch-size"`."""
    return "--" + dest.replace("_", "-")


VISION_NUMBERS = (
    ("max_images", f"images per example, 0-N (default: {MAX_IMAGES})"),
    ("min_pixels", "the image processor's min_pixels (default: Qwen2-VL's, 56*56)"),
    ("max_pixels", "the image processor's max_pixels (default: Qwen2-VL's, 28*28*1280)"),
)
"""The numeric options only `--vision` takes, ints >= 0 (`check_fields` asks more of the pixel limits)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options shared by `flatcollate bench` and `benchmarks/throughput.py`: one per field of `SFTBenchConfig`, its
    help the field's (`config.option`), but `profile` (whose default depends on the task), `--set` and `--full-size`
    (`FIXED_FIELDS`). An option every task takes defaults to `SFTBenchConfig`'s value, one of `TASK_OPTIONS` to None."""
    default = SFTBenchConfig()
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
    for field in fields(default):
        if field.name in (*FIXED_FIELDS, "profile"):
            continue
        own, text = getattr(default, field.name), field.metadata["help"]
        value = None if field.name in TASK_OPTIONS else own
        if field.name in TASK_OPTIONS and own is not None:
            text += f" (default: {' '.join(own) if isinstance(own, tuple) else own})"
        parser.add_argument(
            option(field.name),
            type=argument_type(field.name, own),
            nargs="+" if isinstance(own, tuple) else None,
            choices=field.metadata.get("choices"),
            metavar=field.metadata.get("metavar"),
            default=value,
            help=text,
        )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def argument_type(name: str, default):
    """The argparse type of a config field's option: the counts' (`config.POSITIVE`, ...), else a positive float for
    the learning rate, an int for the seed, text for the rest."""
    if name in POSITIVE or name in OPTIONAL_POSITIVE:
        return positive_int
    if name in NON_NEGATIVE:
        return non_negative_int
    return {float: positive_float, int: int}.get(type(default))


def add_vision_arguments(parser: argparse.ArgumentParser) -> None:
    """The options only the vision profile takes."""
    parser.add_argument(
        "--vision",
        action="store_true",
        help="image-text profile: a small Qwen2.5-VL-shaped model, padded vs flattened, 0-N images per example "
        "sized by Qwen2-VL's dynamic resolution (--profile gives the text lengths; --set sizes the language model)",
    )
    for dest, text in VISION_NUMBERS:
        parser.add_argument(option(dest), type=non_negative_int, default=None, help=f"--vision: {text}")


def parse_overrides(items: list[str], base: dict) -> dict:
    """`base` updated with every `KEY=VALUE` of `items` (values parsed as JSON, else kept as text).

    >>> parse_overrides(["hidden_size=256", "hidden_act=gelu"], {"hidden_size": 128})
    {'hidden_size': 256, 'hidden_act': 'gelu'}
    """
    overrides = dict(base)
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--set expects KEY=VALUE, got {item!r} (e.g. --set hidden_size=256).")
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key] = value
    return overrides


def task_of(args: argparse.Namespace) -> str:
    """The task the options select: `--vision` is `--task vision`."""
    if args.vision and args.task not in ("sft", "vision"):
        raise UsageError(f"--vision does not apply to --task {args.task}; leave it out.")
    return "vision" if args.vision else args.task


def config_from_args(task, args: argparse.Namespace):
    """`task`'s config from parsed options: every option the task takes, `--set` values on top of the default sizes
    (none with `--full-size`); `UsageError` for an option it does not take."""
    given = [dest for dest in TASK_OPTIONS if getattr(args, dest, None) not in (None, False)]
    takes = {"full_size" if field.name == "tiny" else field.name for field in fields(task.config)}
    refused = [dest for dest in given if dest not in takes]
    if refused:
        raise UsageError(f"{option(refused[0])} does not apply to {task.flag} ({task.scope}); leave it out.")
    default, values = task.config(), {}
    for field in fields(default):
        value = getattr(args, field.name, None) if field.name not in FIXED_FIELDS else None
        if value is not None:
            values[field.name] = tuple(value) if isinstance(getattr(default, field.name), tuple) else value
    if hasattr(default, "tiny"):
        values["tiny"] = not args.full_size
    base = default.model_overrides if values.get("tiny", True) else {}
    return task.config(**values, model_overrides=parse_overrides(args.overrides, base))


def command_line(task, config, out_dir: str | Path) -> str:
    """The `flatcollate bench` command that reproduces `config` of `task`: every option that differs from its
    default, and the output folder.

    >>> from flatcollate.bench.harness import get_task
    >>> sizes = {**PairBenchConfig().model_overrides, "hidden_size": 64}
    >>> command_line(get_task("dpo"), PairBenchConfig(steps=2, model_overrides=sizes), "out")
    'flatcollate bench --task dpo --steps 2 --set hidden_size=64 --out-dir out'
    """
    default = task.config()
    argv = ["flatcollate", "bench", *task.flag.split()] if task.name != "sft" else ["flatcollate", "bench"]
    for field in fields(config):
        value = getattr(config, field.name)
        if field.name not in FIXED_FIELDS and value != getattr(default, field.name):
            flag = option(field.name)
            argv += [flag, *map(str, value)] if isinstance(value, tuple) else [flag, str(value)]
    if not getattr(config, "tiny", True):
        argv.append("--full-size")
    base = default.model_overrides if getattr(config, "tiny", True) else {}
    for key, value in config.model_overrides.items():
        if key not in base or base[key] != value:
            argv += ["--set", f"{key}={json.dumps(value)}"]
    return shlex.join([*argv, "--out-dir", str(out_dir)])


def validate(task, config, out_dir: str | Path | None) -> None:
    """Raise `UsageError` for what would fail or mislead later, before any training: a field no benchmark takes, an
    unknown model, a `--set` value the model's config cannot take (`flatcollate.testing.tiny_text.check_overrides`),
    CUDA that is not there, what the task itself checks (`Task.validate`: profile, backend, memory, trl...), an output
    folder that cannot be written, no matplotlib for the report's plots (the `bench` extra)."""
    import torch

    from ..check.options import validate_model_argument
    from .build import model_config
    from .config import check_fields

    try:
        check_fields(config)
    except ValueError as error:
        raise UsageError(str(error)) from None
    if hasattr(config, "model"):
        validate_model_argument(config.model, command="bench")
        try:
            model_config(config)
        except ValueError as error:
            raise UsageError(f"--set {error}") from None
    if config.device == "cuda" and not torch.cuda.is_available():
        raise UsageError(
            f"--device cuda: CUDA is not available (torch {torch.__version__}, "
            f"{'no GPU found' if torch.version.cuda else 'a CPU-only build'}); use --device cpu or auto."
        )
    task.validate(config)
    if out_dir is not None:
        check_writable(expand_path(out_dir))
        check_plotting()


def run_and_report(task, config, out_dir: str | Path, *, progress: bool) -> dict:
    """Print the command that reproduces the run, run it (`harness.run_bench`), print its summary and write the
    report files."""
    from . import harness
    from .batches import UnlabelledBatch
    from .report import summary_text, write_report

    command = command_line(task, config, out_dir)
    try:
        result = {**harness.run_bench(task.name, config, progress=progress), "command": command}
    except UnlabelledBatch as error:
        raise UsageError(str(error)) from None
    print(summary_text(result))
    for path in write_report(result, out_dir):
        print(f"wrote {path}")
    return result


def _command(args: argparse.Namespace) -> int:
    if args.loss_memory is not None:
        return _loss_memory(args)
    from .harness import get_task

    task = get_task(task_of(args))
    config = config_from_args(task, args)
    validate(task, config, args.out_dir)
    run_and_report(task, config, args.out_dir, progress=not args.no_progress)
    return 0


def _loss_memory(args: argparse.Namespace) -> int:
    """`--loss-memory`: the loss part of one step, full logits against the fused loss (`bench.loss_memory`)."""
    from .loss_memory import LossMemoryConfig, run

    if len(args.loss_memory) > 2:
        raise UsageError(f"--loss-memory takes at most TOKENS and VOCAB, got {args.loss_memory}.")
    sizes = dict(zip(("tokens", "vocab_size"), args.loss_memory, strict=False))
    config = LossMemoryConfig(**sizes, repeats=args.repeats, threads=args.threads or LossMemoryConfig.threads)
    check_writable(expand_path(args.out_dir))
    run(config, out_dir=expand_path(args.out_dir))
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
        "--task",
        choices=task_names(),
        default="sft",
        help="sft: supervised fine-tuning, the modes below; vision: as --vision; dpo: trl.DPOTrainer (padded) vs "
        "FlatDPOTrainer (flattened) on preference pairs, --batch-size pairs per step (needs trl); kto: "
        "trl.KTOTrainer vs FlatKTOTrainer, each pair as a desirable and an undesirable example; reward: "
        "trl.RewardTrainer vs FlatRewardTrainer on the same pairs; grpo: GRPOTrainer's log-prob pass vs "
        "FlatGRPOTrainer's, each prompt with two completions",
    )
    parser.add_argument(
        "--profile",
        default=None,
        help=f"length profile: one of {', '.join(available_profiles())}, a tokenized dataset folder, or a lengths "
        f"file; with --task dpo, kto, reward or grpo a pair profile, one of {', '.join(available_pair_profiles())} "
        f"(default: {SFTBenchConfig().profile}; the preference tasks: {PairBenchConfig().profile})",
    )
    parser.add_argument("--out-dir", default="flatcollate-bench", help="folder for JSON, markdown and plots")
    parser.add_argument(
        "--loss-memory",
        nargs="*",
        type=positive_int,
        metavar="N",
        default=None,
        help="instead of a task: peak memory and tokens/s of the loss part of one step, full logits against "
        "prepare_model_for_flattening(fused_loss=True), on the CPU; optional TOKENS and VOCAB (default: 8192 "
        "131072); takes --repeats, --threads and --out-dir",
    )
    add_arguments(parser)
    add_vision_arguments(parser)
    parser.set_defaults(func=_command)
