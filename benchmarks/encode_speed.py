"""Encoder speed: `build_encoder` (ids and labels) vs `apply_chat_template(tokenize=True)` (ids only), same rows.

    python benchmarks/encode_speed.py --out benchmarks/results/encode_speed

Workloads from the shared data (`FLATCOLLATE_SHARED_DATA`, default `../shared/data`): HH-RLHF multi-turn chats
(2-22 messages), Glaive tool-call chats in ShareGPT form (tools in the system prompt; Qwen2.5 and Llama-3.2 only, as
Mistral v0.2's template refuses tool turns), and one long conversation of 330 messages made by chaining HH-RLHF chats.
Conversations per second, median and p10-p90 over repeats after a warm-up, and the encoder's time relative to
`apply_chat_template` (median of the per-repeat ratios; 1.0 = as fast; the target is within 2x), in one run.
"""

import argparse
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import transformers
from transformers import AutoTokenizer

from flatcollate.data import build_encoder

SHARED = Path(os.environ.get("FLATCOLLATE_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
TEMPLATE_KWARGS = {"llama-3.2-instruct": {"date_string": "26 Jul 2024"}}
SHAREGPT_ROLES = {"human": "user", "gpt": "assistant", "function_call": "assistant", "observation": "tool"}


@dataclass(frozen=True)
class Config:
    tokenizers: tuple[str, ...] = ("qwen2.5-instruct", "llama-3.2-instruct", "mistral-7b-instruct-v0.2")
    workloads: tuple[str, ...] = ("hh_rlhf", "glaive_tools", "long_330")
    num_rows: int = 300
    long_messages: int = 330
    warmup: int = 1
    repeats: int = 5


@dataclass
class Result:
    workload: str
    tokenizer: str
    method: str
    conversations: int
    messages_per_conversation: float
    median_per_s: float
    p10_per_s: float
    p90_per_s: float
    ratios: dict = field(default_factory=dict)


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


def time_methods(methods: dict, rows: list[dict], cfg: Config) -> dict[str, list[float]]:
    """Conversations per second of each method and repeat; the methods take turns within each repeat, so a shared
    machine's changing load falls on all of them alike."""
    for _ in range(cfg.warmup):
        for fn in methods.values():
            for row in rows:
                fn(row)
    per_s = {name: [] for name in methods}
    for _ in range(cfg.repeats):
        for name, fn in methods.items():
            start = time.perf_counter()
            for row in rows:
                fn(row)
            per_s[name].append(len(rows) / (time.perf_counter() - start))
    return per_s


def run(cfg: Config) -> list[Result]:
    results = []
    for name in cfg.tokenizers:
        tok = AutoTokenizer.from_pretrained(SHARED / "tokenizers" / name)
        kwargs = TEMPLATE_KWARGS.get(name, {})
        for workload in cfg.workloads:
            if workload == "glaive_tools" and name.startswith("mistral"):
                continue
            fmt, rows = load_workload(workload, cfg)
            encoder = build_encoder(tok, format=fmt, chat_template_kwargs=kwargs)
            methods = {"apply_chat_template": reference_call(tok, kwargs, fmt), "flatcollate": encoder}
            timings = time_methods(methods, rows, cfg)
            reference = np.asarray(timings["apply_chat_template"])
            key = "messages" if fmt == "messages" else "conversations"
            mean_messages = float(np.mean([len(r[key]) for r in rows]))
            for method, values in timings.items():
                q = np.percentile(values, [10, 50, 90])
                # Paired by repeat: time of this method over time of apply_chat_template in the same repeat.
                ratio = float(np.median(reference / np.asarray(values)))
                results.append(
                    Result(workload, name, method, len(rows), mean_messages, float(q[1]), float(q[0]), float(q[2]),
                           {"time_vs_apply_chat_template": ratio})
                )
    return results


def markdown(results: list[Result]) -> str:
    lines = [
        "| workload | tokenizer | method | rows | messages/row | conversations/s (median) | p10-p90 "
        "| time vs apply_chat_template |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.workload} | {r.tokenizer} | {r.method} | {r.conversations} | {r.messages_per_conversation:.1f} | "
            f"{r.median_per_s:.1f} | {r.p10_per_s:.1f}-{r.p90_per_s:.1f} | "
            f"{r.ratios['time_vs_apply_chat_template']:.2f}x |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="folder for results.json and results.md")
    parser.add_argument("--repeats", type=int, default=Config.repeats)
    parser.add_argument("--num-rows", type=int, default=Config.num_rows)
    parser.add_argument("--tokenizers", nargs="+", default=list(Config.tokenizers))
    args = parser.parse_args(argv)
    cfg = Config(repeats=args.repeats, num_rows=args.num_rows, tokenizers=tuple(args.tokenizers))
    results = run(cfg)
    table = markdown(results)
    print(table)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        payload = {"config": asdict(cfg), "versions": {"transformers": transformers.__version__},
                   "results": [asdict(r) for r in results]}
        (out / "results.json").write_text(json.dumps(payload, indent=1))
        (out / "results.md").write_text(table + "\n")
    return results


if __name__ == "__main__":
    main()
