"""`flatcollate bench --task dpo|reward`: its options turned into a `DPOBenchConfig` and checked before any work
starts (one line and exit status 2 for a mistake), the command that reproduces the run, the run, the summary and the
files. Both tasks take the same options; `reward` trains `trl.RewardTrainer` and `FlatRewardTrainer`."""

import argparse
import importlib.util
import json
import shlex
from pathlib import Path

import numpy as np

from ..cli import UsageError
from .config import DPOBenchConfig
from .dpo_data import EOS_PER_REPLY
from .options import check_writable
from .overrides import check_overrides, parse_overrides

NOT_DPO = {
    "vision": "--vision",
    "modes": "--modes",
    "pack_len": "--pack-len",
    "attn": "--attn",
    "max_images": "--max-images",
    "max_pixels": "--max-pixels",
}
"""Options of the SFT and image-text benchmarks that `--task dpo` and `--task reward` do not take (default None or
False)."""

TRAINERS = {"dpo": ("trl.DPOTrainer", "FlatDPOTrainer"), "reward": ("trl.RewardTrainer", "FlatRewardTrainer")}
"""`--task` -> the padded and the flattened trainer it compares."""

OPTIONS = {
    "model": "--model",
    "profile": "--profile",
    "batch_size": "--batch-size",
    "max_length": "--max-length",
    "steps": "--steps",
    "warmup_steps": "--warmup-steps",
    "repeats": "--repeats",
    "lr": "--lr",
    "seed": "--seed",
    "device": "--device",
    "dtype": "--dtype",
    "threads": "--threads",
}
"""`DPOBenchConfig` field -> the option that sets it."""


def dpo_config_from_args(args: argparse.Namespace) -> DPOBenchConfig:
    """`DPOBenchConfig` from parsed `flatcollate bench` options (`--task dpo` or `reward`); `UsageError` for an option
    it does not take."""
    given = [option for name, option in NOT_DPO.items() if getattr(args, name) not in (None, False)]
    if given:
        padded, flattened = TRAINERS[args.task]
        raise UsageError(
            f"{given[0]} does not apply to --task {args.task} (it compares {padded} on padded batches with "
            f"{flattened} on flattened rows); leave it out."
        )
    default = DPOBenchConfig()
    values = {field: getattr(args, field) for field in OPTIONS}
    values |= {"model": args.model or default.model, "profile": args.profile or default.profile}
    base = default.model_overrides if not args.full_size else {}
    return DPOBenchConfig(**values, tiny=not args.full_size, model_overrides=parse_overrides(args.overrides, base))


def validate_dpo(config: DPOBenchConfig, out_dir: str | Path, *, set_keys: set[str], task: str = "dpo") -> None:
    """Raise `UsageError` for what would fail later: trl missing, an unknown model or pair profile, a `max_length`
    no pair's prompt (`task="reward"`: no whole pair) fits in, a `--set` key the model's config lacks, CUDA that is
    not there, an output folder that cannot be written."""
    import torch

    from ..check.options import validate_model_argument
    from ..profiles.pair_profile import load_pair_profile

    if importlib.util.find_spec("trl") is None:
        raise UsageError(f"--task {task} trains with {TRAINERS[task][0]}, and trl is not installed: pip install trl.")
    validate_model_argument(config.model)
    try:
        profile = load_pair_profile(config.profile)
    except ValueError as error:
        raise UsageError(f"--profile {config.profile}: {str(error).splitlines()[0]}") from None
    shortest = int(profile.prompt.min())
    if shortest >= config.max_length:
        raise UsageError(
            f"--max-length {config.max_length}: every prompt of the pair profile {config.profile} is at least "
            f"{shortest} tokens, and TRL drops pairs whose prompt fills max_length; raise --max-length."
        )
    whole = int((profile.prompt + np.maximum(profile.chosen, profile.rejected)).min()) + EOS_PER_REPLY
    if task == "reward" and whole > config.max_length:
        raise UsageError(
            f"--max-length {config.max_length}: no pair of the pair profile {config.profile} fits (the shortest, "
            f"prompt + longer reply + eos, is {whole} tokens), and RewardTrainer drops longer pairs; raise "
            "--max-length."
        )
    check_overrides(config, set_keys)
    if config.device == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device cuda: CUDA is not available (torch {torch.__version__}); use --device cpu or auto.")
    check_writable(Path(out_dir))


def dpo_command_line(config: DPOBenchConfig, out_dir: str | Path, *, task: str = "dpo") -> str:
    """The `flatcollate bench --task <task>` command that reproduces `config`: every option that differs from its
    default, and the output folder.

    >>> sizes = {**DPOBenchConfig().model_overrides, "hidden_size": 64}
    >>> dpo_command_line(DPOBenchConfig(steps=2, model_overrides=sizes), "out")
    'flatcollate bench --task dpo --steps 2 --set hidden_size=64 --out-dir out'
    """
    default = DPOBenchConfig()
    argv = ["flatcollate", "bench", "--task", task]
    for field, option in OPTIONS.items():
        if getattr(config, field) != getattr(default, field):
            argv += [option, str(getattr(config, field))]
    if not config.tiny:
        argv.append("--full-size")
    base = default.model_overrides if config.tiny else {}
    for key, value in config.model_overrides.items():
        if key not in base or base[key] != value:
            argv += ["--set", f"{key}={json.dumps(value)}"]
    return shlex.join([*argv, "--out-dir", str(out_dir)])


def run_dpo_command(args: argparse.Namespace) -> int:
    """`flatcollate bench --task dpo|reward`: check every option, print the command, run, print the summary, write
    the report files."""
    from . import dpo, reward
    from .dpo_report import dpo_summary_text, write_dpo_report

    config = dpo_config_from_args(args)
    set_keys = {item.partition("=")[0] for item in args.overrides}
    validate_dpo(config, args.out_dir, set_keys=set_keys, task=args.task)
    command = dpo_command_line(config, args.out_dir, task=args.task)
    run = reward.run_reward_bench if args.task == "reward" else dpo.run_dpo_bench
    result = {**run(config, progress=not args.no_progress), "command": command}
    print(dpo_summary_text(result))
    for path in write_dpo_report(result, args.out_dir):
        print(f"wrote {path}")
    return 0
