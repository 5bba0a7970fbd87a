"""Compatibility matrix: every causal-LM architecture transformers ships, flattened vs per-sequence, per backend.

For each `model_type` of `MODEL_FOR_CAUSAL_LM_MAPPING_NAMES` (encoder-decoders skipped) a tiny random model is built
offline and `flatcollate.check.check_model` compares a flattened row with the sequences run alone, for vanilla
`sdpa`, vanilla `eager` (both `use_cache=False`, no `attention_mask`) and `flatcollate`
(`prepare_model_for_flattening`). Writes a markdown table (and JSON) with exact / contaminated / unsupported.

    python tools/compat_matrix.py --output docs/compatibility.md --json benchmarks/results/compat_matrix.json

With `--architectures image-text-to-text`, every `model_type` of `MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES` is
checked with images instead (`flatcollate.check.vision`: the family's tiny recipe, examples with 1, 2 and 0 images,
vanilla `sdpa` and `flatcollate`), or listed with the reason it was not built; each kind rewrites only its own section
of `--output`:

    python tools/compat_matrix.py --architectures image-text-to-text --output docs/compatibility.md
"""

import argparse
import json
import logging
import signal
import time
import warnings
from pathlib import Path

import torch
import transformers
from tqdm import tqdm
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.models.auto.modeling_auto import (
    MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
    MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
)

from flatcollate.attention import ATTN_IMPLEMENTATION
from flatcollate.check import check_model
from flatcollate.check.text import DEFAULT_BACKENDS
from flatcollate.check.vision import GRADIENT_CONTROL, SHIFT_CONTROL, not_built_reason
from flatcollate.testing import tiny_config

IMAGE_TEXT_HEADING = "## Image-text-to-text architectures"
"""Heading of the image-text section of `--output`; the text section is everything before it."""

IMAGE_TEXT_BACKENDS = ("sdpa", ATTN_IMPLEMENTATION)
"""Vanilla transformers as a vision model is built (SDPA) and a prepared model."""

INVESTIGATED: dict[str, str] = {}
"""`model_type` -> the measured cause of a flatcollate verdict other than exact on image-text families (the reason
column shows it after the check's own reason)."""

SECONDS_PER_ARCHITECTURE = 90
MAX_PARAMETERS = 20_000_000
"""Architectures whose shrunk config still holds more parameters (sizes the shrinker does not know) are not built."""


def architectures(only: list[str] | None = None) -> list[str]:
    """Decoder-only text `model_type`s with a causal-LM head, sorted (encoder-decoders and multimodal models out)."""
    names = sorted(only or MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    return [name for name in names if not _is_encoder_decoder(name) and not multimodal(name)]


def multimodal(model_type: str) -> bool:
    """Whether the config nests a vision or audio model (the causal-LM class is then a multimodal wrapper)."""
    sub_configs = getattr(CONFIG_MAPPING[model_type], "sub_configs", {}) or {}
    return any(word in key for key in sub_configs for word in ("vision", "audio", "speech", "image", "vq"))


def _is_encoder_decoder(model_type: str) -> bool:
    try:
        return bool(getattr(AutoConfig.for_model(model_type), "is_encoder_decoder", False))
    except Exception:  # a config that cannot be built with defaults is kept; its row records the error
        return False


def run_one(model_type: str, *, seconds: int = SECONDS_PER_ARCHITECTURE) -> dict:
    """One architecture's row; a build or run failure is recorded with its message, never hidden."""
    started = time.perf_counter()
    signal.alarm(seconds)
    try:
        with torch.device("meta"):  # count parameters without allocating them
            size = sum(p.numel() for p in AutoModelForCausalLM.from_config(tiny_config(model_type)).parameters())
        if size > MAX_PARAMETERS:
            raise ValueError(f"the shrunk config still has {size / 1e6:.0f}M parameters (sizes not shrunk)")
        report = check_model(model_type, backends=DEFAULT_BACKENDS)  # lengths derived from the config
    except Exception as error:  # any architecture may fail to build tiny; the matrix records why
        message = f"{type(error).__name__}: {str(error).splitlines()[0][:160]}" if str(error) else type(error).__name__
        return {"model_type": model_type, "error": message, "seconds": time.perf_counter() - started}
    finally:
        signal.alarm(0)
    results = {
        r.backend: {"status": r.status, "logits_diff": r.logits_diff, "reason": r.reason} for r in report.results
    }
    return {
        "model_type": model_type,
        "results": results,
        "lengths": list(report.lengths),
        "overrides": report.overrides,
        "seconds": time.perf_counter() - started,
    }


def run_one_image_text(model_type: str, *, seconds: int = SECONDS_PER_ARCHITECTURE) -> dict:
    """One image-text-to-text family's row: checked with images, or the reason it was not built or did not run."""
    started = time.perf_counter()
    reason = not_built_reason(model_type)
    if reason is not None:
        return {"model_type": model_type, "error": reason, "seconds": 0.0}
    signal.alarm(seconds)
    try:
        report = check_model(model_type, backends=IMAGE_TEXT_BACKENDS)
    except Exception as error:  # a tiny recipe may stop working with a transformers release; the row records why
        first = str(error).strip().splitlines()
        message = f"{type(error).__name__}: {first[0][:160]}" if first else type(error).__name__
        return {"model_type": model_type, "error": f"check failed: {message}", "seconds": time.perf_counter() - started}
    finally:
        signal.alarm(0)
    results = {
        r.backend: {
            "status": r.status,
            "logits_diff": r.logits_diff,
            "loss_diff": r.loss_diff,
            "grad_diff": r.grad_diff,
            "reason": r.reason,
        }
        for r in report.results
    }
    return {
        "model_type": model_type,
        "results": results,
        "lengths": list(report.lengths),
        "tolerances": report.tolerances,
        "controls": {key: report.exercised.get(key, "") for key in (SHIFT_CONTROL, GRADIENT_CONTROL)},
        "seconds": time.perf_counter() - started,
    }


class TooSlow(Exception):
    """An architecture ran past `SECONDS_PER_ARCHITECTURE` (e.g. a pure-PyTorch fallback of a missing kernel)."""


def _too_slow(signum, frame):
    raise TooSlow("ran past the time limit (--seconds) on CPU")


def _cell(result: dict) -> str:
    if result["status"] == "unsupported":
        return f"unsupported ({result['reason']})"
    return f"{result['status']} ({result['logits_diff']:.1e})"


HEADS = [
    (
        "`*ForCausalLM`, `*ForConditionalGeneration` (image-text)",
        "exact",
        "labels shifted inside the model; the collator masks each sequence's first label (`separator_id=-100`)",
    ),
    (
        "`*ForTokenClassification`",
        "exact with `DataCollatorWithFlattening(separator_id=None)`",
        "each token labelled in place, so every label counts; given the causal rule, the prepared model warns",
    ),
    ("base models (`*Model`)", "exact", "hidden states per token"),
    (
        "`*ForSequenceClassification`, `*ForQuestionAnswering`, `*ForMultipleChoice`",
        "refused by `prepare_model_for_flattening`",
        "they read one position per row (the last non-pad token, or indices into it): one answer for N sequences",
    ),
    (
        "encoder-only models (BERT, RoBERTa, DistilBERT, ModernBERT as masked LMs)",
        "refused by `prepare_model_for_flattening`",
        "their attention looks both ways; the packed kernels are causal",
    ),
]
"""Heads other than the causal LM's, what flattening does with them and why (`flatcollate.modeling.heads`)."""

HEADS_SECTION = "\n".join(
    [
        "## Heads and encoders",
        "",
        "The table checks causal-LM heads; other heads of the same families (`tests/modeling/test_heads.py`):",
        "",
        "| head | flattened | why |",
        "|---|---|---|",
        *(f"| {head} | {verdict} | {why} |" for head, verdict, why in HEADS),
    ]
)


def to_markdown(rows: list[dict]) -> str:
    """The generated `docs/compatibility.md`."""
    built = [r for r in rows if "results" in r]
    exact = [r for r in built if r["results"]["flatcollate"]["status"] == "exact"]
    lines = [
        "# Compatibility matrix",
        "",
        f"Generated by `python tools/compat_matrix.py` with transformers {transformers.__version__}: for every",
        "decoder-only causal-LM architecture transformers ships, a tiny random fp32 model on CPU runs one flattened",
        "row of sequences and the same sequences one at a time; `exact` means logits, loss and gradients agree within",
        "1e-5 (the largest logit difference is in brackets). The lengths come from each config, as `flatcollate check`",
        "derives them: one sequence longer than every sliding window or attention chunk the config declares (windows",
        "longer than a CPU check reaches are shrunk to 64 tokens in the tiny copy), a length-1 sequence and an odd",
        "length; soft-capping is set to bite (`flatcollate.check.lengths`). The lengths column lists them. `sdpa` and",
        "`eager` are transformers' own backends called as a trainer would (`use_cache=False`, no `attention_mask`);",
        "`flatcollate` is a model passed through `prepare_model_for_flattening` (packed backend, or patched mask",
        "builders for families whose layers do not use the attention interface). The per-sequence reference runs each",
        "sequence as users run it, `model(input_ids=sequence)`, with the positions the model numbers itself: RoBERTa",
        "and the families built on its embeddings number them from `padding_idx + 1`, which transformers' own",
        "backends miss when flattened and flatcollate follows. Hybrids pass a state-carrying layer, an attention",
        "layer, then another (`flatcollate.testing.tiny_hybrids`), as released hybrids interleave them.",
        "",
        f"flatcollate is exact on **{len(exact)} of {len(built)}** architectures that build "
        f"({100 * len(exact) / max(len(built), 1):.0f}%); {len(rows) - len(built)} more could not be built as tiny "
        "random models and are listed at the end.",
        "",
        "| model_type | lengths | sdpa | eager | flatcollate |",
        "|---|---|---|---|---|",
    ]
    for row in built:
        cells = [_cell(row["results"][b]) for b in DEFAULT_BACKENDS]
        shrunk = ", ".join(f"{k}={v}" for k, v in row["overrides"].items() if k != "initializer_range")
        lengths = " ".join(map(str, row["lengths"])) + (f" ({shrunk})" if shrunk else "")
        lines.append(f"| {row['model_type']} | {lengths} | " + " | ".join(cells) + " |")
    skipped = sorted(n for n in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES if multimodal(n))
    lines += ["", f"Multimodal architectures left out (not text decoders): {', '.join(skipped)}."]
    lines += ["", HEADS_SECTION]
    failed = [r for r in rows if "error" in r]
    if failed:
        lines += ["", "## Not built", "", "| model_type | error |", "|---|---|"]
        lines += [f"| {r['model_type']} | {r['error'].replace('|', '/')} |" for r in failed]
    return "\n".join(lines) + "\n"


def image_text_markdown(rows: list[dict]) -> str:
    """The image-text-to-text section of `docs/compatibility.md`: one row per family of the mapping."""
    built = [r for r in rows if "results" in r]
    exact = [r for r in built if r["results"][ATTN_IMPLEMENTATION]["status"] == "exact"]
    lines = [
        IMAGE_TEXT_HEADING,
        "",
        "Generated by",
        "`python tools/compat_matrix.py --architectures image-text-to-text --output docs/compatibility.md`",
        f"with transformers {transformers.__version__}: for every `model_type` of",
        "`MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES`, a tiny random fp32 model on CPU",
        "(`flatcollate.testing.tiny_vision`: 2 text layers, 3 in hybrids, 1 vision layer) takes three examples with",
        "1, 2 and 0 images, laid out as the family's processor lays them out, flattened into one row by",
        "`VisionDataCollatorWithFlattening`; the reference runs each example",
        "alone (SDPA). `exact` means logits, loss and gradients agree within 1e-5, or within eight fp32 rounding steps",
        "at the quantity's size where that is coarser (a projector's gradient sums over every image token, in another",
        "order when batched); the diffs column gives flatcollate's logits / loss / gradients gaps.",
        "*vanilla transformers* is the unprepared model (SDPA, `use_cache=False`) on the same batch, the largest logit",
        "difference in brackets; *flatcollate* is the model after `prepare_model_for_flattening`. Same check as",
        "`flatcollate check <model_type>`. Controls (`flatcollate.vision.controls`): every parameter of the tiny",
        "model carries seeded noise; the batch with its images reversed across examples must move the logits by more",
        "than 1e-2 (*images reversed*: the largest logit change), and every vision-tower and projector parameter must",
        "get a gradient (*gradients*: those that get one, of those on the image path; the few a family never runs on",
        "these examples, such as a CLIP tower's final norm, are named with their reason in `Family.unused_by_design`);",
        "otherwise a family is `unverified`, not `exact`.",
        "",
        f"flatcollate exact on **{len(exact)} of {len(built)}** families that build as tiny models "
        f"({100 * len(exact) / max(len(built), 1):.0f}%); {len(rows) - len(built)} of the {len(rows)} families are not "
        "built (reason given).",
        "",
        "| family | vanilla transformers | flatcollate | max abs diffs (logits / loss / grads) | images reversed "
        "| gradients | reason |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in sorted(rows, key=lambda r: r["model_type"]):
        if "error" in row:
            lines.append(f"| {row['model_type']} | not built | not built |  |  |  | {row['error'].replace('|', '/')} |")
            continue
        vanilla, ours = row["results"]["sdpa"], row["results"][ATTN_IMPLEMENTATION]
        diffs = (
            " / ".join(f"{ours[k]:.1e}" for k in ("logits_diff", "loss_diff", "grad_diff"))
            if ours["logits_diff"] is not None
            else ""
        )
        why = "; ".join(filter(None, [ours["reason"], INVESTIGATED.get(row["model_type"])]))
        controls = row.get("controls", {})
        shift = controls.get(SHIFT_CONTROL, "").split(";")[0].removeprefix("the logits move by ")
        gradients = controls.get(GRADIENT_CONTROL, "").replace(" parameters get one", "")
        cells = [_cell(vanilla), ours["status"], diffs, shift, gradients, why.replace("|", "/")]
        lines.append(f"| {row['model_type']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_section(path: Path, markdown: str, *, image_text: bool) -> None:
    """Replace the text section (everything before `IMAGE_TEXT_HEADING`) or the image-text section of `path`."""
    old = path.read_text() if path.exists() else ""
    text, heading, rest = old.partition(IMAGE_TEXT_HEADING)
    section = heading + rest
    text, section = (text, markdown) if image_text else (markdown, section)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text.rstrip("\n") + "\n\n" + section if text and section else text or section)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=Path("docs/compatibility.md"))
    parser.add_argument("--json", type=Path, default=None, help="also write the raw rows here")
    parser.add_argument("--only", nargs="+", default=None, help="model types to run (default: all)")
    parser.add_argument(
        "--architectures",
        choices=("text", "image-text-to-text"),
        default="text",
        help="which mapping to run; each rewrites only its own section of --output",
    )
    parser.add_argument(
        "--seconds", type=int, default=SECONDS_PER_ARCHITECTURE, help="time limit per architecture (more on a busy CPU)"
    )
    parser.add_argument(
        "--merge", type=Path, default=None, help="JSON rows of an earlier run; the rows run now replace theirs"
    )
    args = parser.parse_args(argv)
    signal.signal(signal.SIGALRM, _too_slow)
    transformers.logging.set_verbosity_error()
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    image_text = args.architectures == "image-text-to-text"
    names = sorted(args.only or MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES) if image_text else architectures(args.only)
    run = run_one_image_text if image_text else run_one
    rows = [run(name, seconds=args.seconds) for name in tqdm(names, desc="architectures")]
    if args.merge is not None:
        fresh = {row["model_type"]: row for row in rows}
        earlier = json.loads(args.merge.read_text())
        rows = [fresh.pop(row["model_type"], row) for row in earlier] + list(fresh.values())
    write_section(args.output, image_text_markdown(rows) if image_text else to_markdown(rows), image_text=image_text)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
