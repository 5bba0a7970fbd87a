"""The `flatcollate check` command: options, usage errors in one line, and a verdict on the selected backend."""

import argparse
from typing import TYPE_CHECKING

from ..cli import HelpFormatter, positive_float
from .options import MAX_CHECK_TOKENS, validate_image_text_options, validate_options, validate_task_options

if TYPE_CHECKING:
    from .report import CheckReport

# torch, transformers and the check itself are imported inside the functions that validate and run a check, so
# `flatcollate check --help` answers at once.

DTYPES = ("bfloat16", "float16", "float32")
"""Names of the torch dtypes a flattened run can use."""

TASKS = ("sft", "dpo", "reward")
"""`flatcollate.check.tasks.TASKS` (without importing the check; a test keeps them equal)."""

DEFAULT_BACKENDS_TEXT = "sdpa eager flatcollate"
"""`flatcollate.check.text.DEFAULT_BACKENDS` as `--help` shows it (without importing the check; a test keeps them
equal)."""


def register_cli(subparsers) -> None:
    parser = subparsers.add_parser(
        "check",
        help="check that a model is exact on flattened batches, per backend",
        description=(
            "Run a tiny random copy of MODEL on one flattened row and on the same sequences one at a time, per\n"
            "attention backend, and compare logits, loss and gradients (fp32, CPU). An image-text-to-text MODEL\n"
            "(qwen2_vl, llava, ...) runs examples with 1, 2 and 0 images, flattened, against each example alone.\n\n"
            "Exit status 0 when the backend prepare_model_for_flattening selects is exact, 1 when it is not (or the\n"
            "family cannot be flattened exactly), 2 for a usage error. transformers' own backends are reported for\n"
            "information; --require-all-backends makes every checked backend count."
        ),
        formatter_class=HelpFormatter,
    )
    parser.add_argument(
        "model", help="a model_type registered in transformers (e.g. llama) or a local folder with a config.json"
    )
    parser.add_argument(
        "--backends",
        nargs="+",
        default=None,
        help="attention backends to check; 'flatcollate' is what prepare_model_for_flattening selects (default: "
        f"{DEFAULT_BACKENDS_TEXT})",
    )
    parser.add_argument(
        "--lengths",
        nargs="+",
        type=int,
        default=None,
        help=(
            "sequence lengths of the flattened row: at least two, "
            f"{MAX_CHECK_TOKENS} tokens in all at most (default: from the config, one sequence longer than every "
            "sliding window or attention chunk it declares, a length-1 sequence and an odd length)"
        ),
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights and tokens")
    parser.add_argument(
        "--tolerance",
        type=positive_float,
        default=None,
        help="largest absolute difference that counts as exact (> 0); default 1e-5 in float32 on the CPU, else twice "
        "the error of the per-sequence run in the same dtype and device",
    )
    parser.add_argument(
        "--device", default="cpu", help="where the flattened run goes: cpu, or cuda to reach the flash-attn kernels"
    )
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=DTYPES,
        help="dtype of the flattened run; the reference runs in float32 on the CPU",
    )
    parser.add_argument(
        "--task",
        default="sft",
        choices=TASKS,
        help="what is compared: the causal-LM logits, loss and gradients (sft); each sequence's completion "
        "log-probabilities (dpo: FlatDPOTrainer, FlatGRPOTrainer); each sequence's reward score (reward: "
        "FlatRewardTrainer); both run in float32 on the CPU, dpo on text and image-text families, reward on text "
        "families",
    )
    parser.add_argument(
        "--require-all-backends",
        action="store_true",
        help="exit 1 unless every checked backend is exact, not only the one prepare_model_for_flattening selects",
    )
    parser.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    import torch

    from .model import check_model
    from .text import DEFAULT_BACKENDS
    from .vision import image_text_model_type, not_built_reason

    args.backends = args.backends or list(DEFAULT_BACKENDS)
    validate_options(args)
    image_text = image_text_model_type(args.model)
    if args.task != "sft":
        validate_task_options(args, image_text)
    if image_text is not None:
        validate_image_text_options(args, image_text)
        if (not_built := not_built_reason(image_text)) is not None:
            print(f"verdict: {image_text} was not checked: {not_built}.")
            return 1
    else:
        model_type, reason = _family_reason(args.model)
        if reason is not None:
            print(f"verdict: {model_type} is NOT safe with flatcollate: {reason}.")
            return 1
    lengths = None if args.lengths is None else tuple(args.lengths)
    report = check_model(
        args.model,
        backends=tuple(args.backends),
        lengths=lengths,
        seed=args.seed,
        tolerance=args.tolerance,
        device=args.device,
        dtype=getattr(torch, args.dtype),
        task=args.task,
    )
    print(report.to_markdown())
    safe, line = _verdict(report, require_all=args.require_all_backends)
    print(f"\n{line}")
    return 0 if safe else 1


def _family_reason(model: str) -> tuple[str, str | None]:
    """The config's model_type and why it can never be exact on flattened batches (None when it may be)."""
    from transformers import AutoModelForCausalLM

    from ..families import family_of
    from ..testing import tiny_config

    config = tiny_config(model)
    model_type = config.model_type
    if type(config) in AutoModelForCausalLM._model_mapping:
        return model_type, None
    if (reason := family_of(model_type).unsupported) is not None:
        return model_type, reason
    if getattr(config, "is_encoder_decoder", False):
        return model_type, "it is an encoder-decoder model; flattening applies to decoder-only causal LMs"
    return model_type, f"transformers has no causal-LM class for {model_type}"


def _verdict(report: "CheckReport", *, require_all: bool) -> tuple[bool, str]:
    """Whether the backends that count are exact, and the one-line verdict."""
    from ..attention import ATTN_IMPLEMENTATION

    by_backend = {r.backend: r for r in report.results}
    selected = by_backend.get(ATTN_IMPLEMENTATION)
    counted = report.results if require_all or selected is None else [selected]
    failed = [r for r in counted if r.status != "exact"]
    subject = "with flatcollate" if counted == [selected] else "on every checked backend"
    if failed:
        why = "; ".join(f"{r.backend} {r.status}" + (f" ({r.reason})" if r.reason else "") for r in failed)
        return False, f"verdict: {report.model_type} is NOT safe {subject}: {why}."
    within = _tolerance_words(report)
    line = f"verdict: {report.model_type} is safe {subject} (logits, loss and gradients within {within})."
    others = [f"{r.backend} {r.status}" for r in report.results if r not in counted and r.status != "exact"]
    if others:
        line += (
            f" Other backends: {', '.join(others)}; information only, prepare_model_for_flattening does not use them "
            "(--require-all-backends makes them count)."
        )
    return True, line


def _tolerance_words(report: "CheckReport") -> str:
    if len(set(report.tolerances.values())) > 1:
        return f"the {report.dtype} tolerances above"
    return f"{report.tolerance:g}"
