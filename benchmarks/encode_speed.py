"""Encoder speed: `build_encoder` (ids and labels) vs `apply_chat_template(tokenize=True)` (ids only), same rows.

    python benchmarks/encode_speed.py --out benchmarks/results/encode_speed

Workloads from the shared data (`FLATCOLLATE_SHARED_DATA`, default `../shared/data`): HH-RLHF multi-turn chats
(2-22 messages), Glaive tool-call chats in ShareGPT form (tools in the system prompt; Qwen2.5 and Llama-3.2 only, as
Mistral v0.2's template refuses tool turns), and one long conversation of 330 messages made by chaining HH-RLHF chats.
Every run of a method is a fresh process that loads the tokenizer, warms up, and times `--passes` passes over the
rows; its figure is the median conversations per second. The methods take turns within each of `--repeats` repeats;
the table shows the median over runs with its min-max, and the encoder's time relative to `apply_chat_template` as
the ratio of the medians with the min-max of the ratio within each repeat (1.0 = as fast; the target is within 2x).
"""

import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import transformers

from flatcollate.bench.repeats import format_spread, run_repeats, serve_worker
from flatcollate.cli import positive_int

from _common import add_repeat_arguments, command_line, format_ratio, script_parser, write_results

SHARED = Path(os.environ.get("FLATCOLLATE_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
TEMPLATE_KWARGS = {"llama-3.2-instruct": {"date_string": "26 Jul 2024"}}
SHAREGPT_ROLES = {"human": "user", "gpt": "assistant", "function_call": "assistant", "observation": "tool"}
METHODS = ("apply_chat_template", "flatcollate")


@dataclass(frozen=True)
class Config:
    tokenizers: tuple[str, ...] = ("qwen2.5-instruct", "llama-3.2-instruct", "mistral-7b-instruct-v0.2")
    workloads: tuple[str, ...] = ("hh_rlhf", "glaive_tools", "long_330")
    num_rows: int = 300
    long_messages: int = 330
    warmup: int = 1
    passes: int = 3


def load_workload(name: str, cfg: Config) -> tuple[str, list[dict]]:
    """`(format, rows)`: rows as the encoder takes them."""
    hh_path = SHARED / "datasets" / "hh_rlhf_harmless_base_test_messages.jsonl"
    if name == "glaive_tools":
        rows = json.loads((SHARED / "datasets" / "glaive_toolcall_en_demo.json").read_text())
        return "sharegpt", rows[: cfg.num_rows]
    with open(hh_path) as f:
        rows = [json.loads(line) for line in f]
    if name == "hh_rlhf":
        return "messages", rows[: cfg.num_rows]
    # Chats start on a user turn and end on an assistant turn, so chaining them keeps the roles alternating.
    messages = []
    for row in rows:
        messages += row["messages"]
        if len(messages) >= cfg.long_messages:
            break
    return "messages", [{"messages": messages[: cfg.long_messages]}]


def reference_call(tok, kwargs: dict, fmt: str):
    """`apply_chat_template(tokenize=True)` on the same conversation (ShareGPT rows converted as the encoder does)."""
    if fmt == "messages":
        return lambda row: tok.apply_chat_template(row["messages"], **kwargs)
    roles = SHAREGPT_ROLES

    def call(row):
        messages = [{"role": roles[t["from"]], "content": t["value"]} for t in row["conversations"]]
        return tok.apply_chat_template(messages, tools=json.loads(row["tools"]) if row["tools"] else None, **kwargs)

    return call


def measure(case: dict, method: str) -> dict:
    """Worker: conversations per second of `method` on the case's rows, median of `passes` passes."""
    from transformers import AutoTokenizer

    from flatcollate.data import build_encoder

    cfg = Config(**case["config"])
    tok = AutoTokenizer.from_pretrained(SHARED / "tokenizers" / case["tokenizer"])
    kwargs = TEMPLATE_KWARGS.get(case["tokenizer"], {})
    fmt, rows = load_workload(case["workload"], cfg)
    if method == "flatcollate":
        encode = build_encoder(tok, format=fmt, chat_template_kwargs=kwargs)
    else:
        encode = reference_call(tok, kwargs, fmt)
    for _ in range(cfg.warmup):
        for row in rows:
            encode(row)
    per_s = []
    for _ in range(cfg.passes):
        start = time.perf_counter()
        for row in rows:
            encode(row)
        per_s.append(len(rows) / (time.perf_counter() - start))
    key = "messages" if fmt == "messages" else "conversations"
    mean_messages = float(np.mean([len(r[key]) for r in rows]))
    return {"per_s": statistics.median(per_s), "conversations": len(rows), "messages_per_conversation": mean_messages}


def cases(cfg: Config) -> list[dict]:
    return [
        {"tokenizer": name, "workload": workload, "config": asdict(cfg)}
        for name in cfg.tokenizers
        for workload in cfg.workloads
        if not (workload == "glaive_tools" and name.startswith("mistral"))
    ]


def summarize(runs) -> list[dict]:
    """Per workload, tokenizer and method: conversations per second over the runs, and time relative to
    `apply_chat_template` (its rate over this method's)."""
    return [
        {
            "workload": run.case["workload"],
            "tokenizer": run.case["tokenizer"],
            "method": method,
            "conversations": run.first(method, "conversations"),
            "messages_per_conversation": run.first(method, "messages_per_conversation"),
            "per_s": run.spread(method, "per_s"),
            "time_vs_apply_chat_template": run.ratio("apply_chat_template", method, "per_s"),
        }
        for run in runs
        for method in METHODS
    ]


def markdown(rows: list[dict]) -> str:
    lines = [
        "| workload | tokenizer | method | rows | messages/row | conversations/s (median, min-max) "
        "| time vs apply_chat_template (min-max) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['workload']} | {r['tokenizer']} | {r['method']} | {r['conversations']} | "
            f"{r['messages_per_conversation']:.1f} | {format_spread(r['per_s'])} | "
            f"{format_ratio(r['time_vs_apply_chat_template'])} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict] | None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if serve_worker(argv, measure):
        return None
    parser = script_parser(__file__, __doc__)
    parser.add_argument("--out", default=None, help="folder for results.json and results.md")
    parser.add_argument("--passes", type=positive_int, default=Config.passes, help="timed passes over the rows per run")
    parser.add_argument("--num-rows", type=positive_int, default=Config.num_rows, help="conversations per workload")
    parser.add_argument("--tokenizers", nargs="+", default=list(Config.tokenizers), help="folders in the shared data")
    parser.add_argument(
        "--workloads", nargs="+", choices=Config.workloads, default=list(Config.workloads), help="conversation sets"
    )
    add_repeat_arguments(parser)
    args = parser.parse_args(argv)
    cfg = Config(
        passes=args.passes, num_rows=args.num_rows, tokenizers=tuple(args.tokenizers), workloads=tuple(args.workloads)
    )
    runs = run_repeats(
        [sys.executable, __file__],
        cases(cfg),
        METHODS,
        repeats=args.repeats,
        label=lambda case: f"{case['workload']} {case['tokenizer']}",
        progress=not args.no_progress,
    )
    rows = summarize(runs)
    command = command_line(__file__, argv)
    text = f"command: `{command}`\n\n{markdown(rows)}"
    print(text)
    payload = {"command": command, "config": asdict(cfg), "repeats": args.repeats, "rows": rows}
    payload |= {"versions": {"transformers": transformers.__version__}, "runs": [run.to_json() for run in runs]}
    write_results(args.out, "results", payload, text)
    return rows


if __name__ == "__main__":
    main()
