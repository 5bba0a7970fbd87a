"""Agreement of flatcollate's chat labels with the `{% generation %}` masks of TRL's training chat templates.

For every `X_training.jinja` installed with `trl` whose base `X.jinja` renders the same text, conversations of four
kinds (plain, system, reasoning, tool calling) are labelled by flatcollate
(`flatcollate.data.turns`) and by the template's own markers (`return_assistant_tokens_mask`), compared by character.
A conversation agrees when every character the two mark differently is whitespace, inside a special-token string
(`<|im_end|>`, `<｜end▁of▁sentence｜>`, `<end_of_turn>`, ...) or inside a generation prompt (the header, which
flatcollate leaves to the prompt: inference starts after it). A template that refuses a conversation, or whose base
renders it differently, is counted as skipped.

Two sets of conversations: `--data built` (default), a few conversations of each kind written here, and `--data
shared`, real rows of `../shared/data`: HH-RLHF chats (plain; with a system prompt for system), GSM8K problems whose
worked solution is the reply's `reasoning_content` (two problems per conversation), and Glaive function-calling chats
turned into OpenAI `tools` / `tool_calls` / `tool` messages.

    python tools/template_agreement.py                  # markdown table per kind, then every disagreement
    python tools/template_agreement.py --data shared    # the same on real rows
"""

import argparse
import json
import re
import sys
from collections import Counter
from pathlib import Path

import jinja2
import numpy as np
from transformers.utils.chat_template_utils import render_jinja_template

from flatcollate.data.chat import ChatRenderer
from flatcollate.data.row_errors import RowError

KINDS = ("plain", "system", "reasoning", "tools")
# Special-token strings; Gemma 4's `<|tool_response>` (its stop token after a call) and `<turn|>` included.
SPECIAL = re.compile(
    r"<\|[^<>\s]*?\|>|<\|[a-z_]+>|<[a-z_]+\|>|<｜[^<>]*?｜>|</?s>|<(?:start|end)_of_turn>|<eos>|<bos>|\[/?INST\]"
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "convert",
            "description": "Convert an amount between currencies.",
            "parameters": {"type": "object", "properties": {"amount": {"type": "number"}, "to": {"type": "string"}}},
        },
    },
]


def _call(name, arguments, as_string):
    return {
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments) if as_string else arguments},
    }


def conversations(kind: str) -> list[tuple[list[dict], list | None]]:
    """`(messages, tools)` of one kind."""
    user = [
        {"role": "user", "content": "Where is the Louvre?"},
        {"role": "user", "content": "And how old is it?"},
        {"role": "user", "content": "Summarise that in one line."},
    ]
    replies = [
        "It is in Paris, on the right bank of the Seine.",
        "The palace dates from 1546; the museum opened in 1793.",
        "\nA Paris palace turned museum in 1793.",
    ]
    thoughts = [
        "The user asks for a location. The Louvre is in Paris.",
        "Palace 1546, museum 1793.",
        "One line: palace, Paris, 1793.",
    ]
    if kind in ("plain", "system"):
        head = [{"role": "system", "content": "You are a concise guide."}] if kind == "system" else []
        chats = [[*head, user[0], {"role": "assistant", "content": replies[0]}]]
        chats.append([*head, *[m for k in range(3) for m in (user[k], {"role": "assistant", "content": replies[k]})]])
        chats.append(
            [
                *head,
                user[1],
                {"role": "assistant", "content": "  spaced answer \n"},
                user[2],
                {"role": "assistant", "content": "ok"},
            ]
        )
        return [(c, None) for c in chats]
    if kind == "reasoning":
        turn = [{"role": "assistant", "content": replies[k], "reasoning_content": thoughts[k]} for k in range(3)]
        return [
            ([user[0], turn[0]], None),
            ([m for k in range(3) for m in (user[k], turn[k])], None),
            ([{"role": "system", "content": "Think first."}, user[1], turn[1], user[2], turn[2]], None),
        ]
    weather = {"city": "Paris"}
    chats = []
    for as_string in (False, True):
        call = {"role": "assistant", "content": "", "tool_calls": [_call("get_weather", weather, as_string)]}
        result = {"role": "tool", "name": "get_weather", "content": '{"temperature": 18, "sky": "cloudy"}'}
        final = {"role": "assistant", "content": "It is 18 degrees and cloudy in Paris."}
        chats.append(([{"role": "user", "content": "Weather in Paris?"}, call, result, final], TOOLS))
    two = {
        "role": "assistant",
        "content": "Let me check both.",
        "tool_calls": [
            _call("get_weather", {"city": "Lyon"}, False),
            _call("convert", {"amount": 10, "to": "USD"}, False),
        ],
    }
    chats.append(
        (
            [
                {"role": "system", "content": "Use tools when needed."},
                {"role": "user", "content": "Weather in Lyon, and 10 EUR in USD?"},
                two,
                {"role": "tool", "name": "get_weather", "content": "sunny"},
                {"role": "tool", "name": "convert", "content": "10.8"},
                {"role": "assistant", "content": "Sunny in Lyon; 10 EUR is 10.80 USD."},
                {"role": "user", "content": "Thanks!"},
                {"role": "assistant", "content": "You're welcome."},
            ],
            TOOLS,
        )
    )
    return chats


def shared_conversations(kind: str, data: Path, count: int) -> list[tuple[list[dict], list | None]]:
    """`count` real conversations of one kind from the shared data folder, taken evenly through each file."""
    datasets = data / "datasets"
    if kind in ("plain", "system"):
        lines = (datasets / "hh_rlhf_harmless_base_test_messages.jsonl").read_text().splitlines()
        offset = 0 if kind == "plain" else 1  # other rows for each kind
        rows = [json.loads(line)["messages"] for line in _evenly(lines, count, offset)]
        head = [{"role": "system", "content": "You are a helpful and harmless assistant."}] if kind == "system" else []
        return [([*head, *messages], None) for messages in rows]
    if kind == "reasoning":
        lines = (datasets / "gsm8k_train.jsonl").read_text().splitlines()
        chats = []
        for a, b in zip(*(_evenly(lines, count, offset) for offset in (0, 1)), strict=True):
            messages = []
            for problem in (json.loads(a), json.loads(b)):
                work, answer = problem["answer"].rsplit("####", 1)
                messages.append({"role": "user", "content": problem["question"]})
                messages.append(
                    {
                        "role": "assistant",
                        "content": f"The answer is {answer.strip()}.",
                        "reasoning_content": work.strip(),
                    }
                )
            chats.append((messages, None))
        return chats
    rows = json.loads((datasets / "glaive_toolcall_en_demo.json").read_text())
    calling = [row for row in rows if any(turn["from"] == "function_call" for turn in row["conversations"])]
    # Arguments as a dict in even rows and as JSON text in odd ones (DeepSeek-V3's template takes only text).
    return [_openai_tools_chat(row, as_string=k % 2 == 1) for k, row in enumerate(_evenly(calling, count, 0))]


def _evenly(items: list, count: int, offset: int) -> list:
    step = max(len(items) // count, 1)
    return items[offset::step][:count]


def _openai_tools_chat(row: dict, *, as_string: bool) -> tuple[list[dict], list]:
    """A Glaive ShareGPT row as OpenAI messages: `function_call` -> an assistant `tool_calls` message (arguments a
    dict or its JSON text), `observation` -> a `tool` message named after the call."""
    roles = {"human": "user", "gpt": "assistant", "system": "system"}
    messages, name = [], None
    for turn in row["conversations"]:
        if turn["from"] == "function_call":
            call = json.loads(turn["value"])
            name = call["name"]
            messages.append(
                {"role": "assistant", "content": "", "tool_calls": [_call(name, call["arguments"], as_string)]}
            )
        elif turn["from"] == "observation":
            messages.append({"role": "tool", "name": name, "content": turn["value"]})
        else:
            messages.append({"role": roles[turn["from"]], "content": turn["value"]})
    tools = [{"type": "function", "function": tool} for tool in json.loads(row["tools"])]
    return messages, tools


def template_pairs(directory: Path) -> list[tuple[str, str, str]]:
    """`(name, base, training)` for every `*_training.jinja` with its base template next to it."""
    pairs = []
    for path in sorted(directory.glob("*_training.jinja")):
        base = path.with_name(path.name.replace("_training", ""))
        if base.exists():
            pairs.append((base.stem, base.read_text(), path.read_text()))
    return pairs


def _char_mask(length: int, spans) -> np.ndarray:
    mask = np.zeros(length, dtype=bool)
    for start, end in spans:
        mask[start:end] = True
    return mask


def _prompt_runs(text: str, diff: np.ndarray, ours, marked, header: str) -> list[tuple[int, int]]:
    """Runs of differing characters right before or after the start of a reply that are part of the generation
    prompt (`<think>` of `<|im_start|>assistant\n<think>\n`): the prompt the model is given, not what it writes."""
    runs = []
    for start in {int(s) for s, _ in ours} | {int(s) for s, _ in marked}:
        for lo, hi in ((start, start), (start, start)):
            while lo > 0 and diff[lo - 1]:
                lo -= 1
            while hi < len(text) and diff[hi]:
                hi += 1
            for a, b in ((lo, start), (start, hi)):
                if a < b and text[a:b] in header:
                    runs.append((a, b))
    return runs


def as_parts(messages: list[dict]) -> list[dict]:
    """Text contents as `[{"type": "text", "text": ...}]`, for the image-text templates that read only parts."""
    return [
        {**m, "content": [{"type": "text", "text": m["content"]}]} if isinstance(m.get("content"), str) else m
        for m in messages
    ]


def compare(renderer: ChatRenderer, base: str, messages: list[dict], tools) -> tuple[str, str]:
    """`("agree" | "differ" | "skipped", detail)` for one conversation."""
    context = {**renderer.tokenizer.special_tokens_map, **renderer.template_kwargs}
    try:
        (text,), (marked,) = render_jinja_template(
            [messages], tools=tools, chat_template=renderer.chat_template, return_assistant_tokens_mask=True, **context
        )
        (plain,), _ = render_jinja_template([messages], tools=tools, chat_template=base, **context)
    except (jinja2.TemplateError, TypeError, ValueError) as err:  # the template refuses the conversation: a skip
        return "skipped", f"template refuses: {type(err).__name__}: {str(err)[:80]}"
    if plain != text:
        return "skipped", "base and training templates render differently"
    if isinstance(messages[0]["content"], str) and messages[0]["content"] not in text:
        return compare(renderer, base, as_parts(messages), tools)
    try:
        ours = renderer.generated_spans(text, messages, tools=tools, where="row")
    except RowError as err:
        refused = err.reason in ("template_drops_content", "template_splits_reply")
        return "refused" if refused else "differ", f"flatcollate refuses: {err}"[:200]
    diff = _char_mask(len(text), ours) ^ _char_mask(len(text), marked)
    allowed = np.array([c.isspace() for c in text], dtype=bool)
    allowed |= _char_mask(len(text), [m.span() for m in SPECIAL.finditer(text)])
    allowed |= _char_mask(len(text), _prompt_runs(text, diff, ours, marked, renderer.reply_prefix))
    bad = np.flatnonzero(diff & ~allowed)
    if bad.size == 0:
        return "agree", ""
    a, b = max(int(bad[0]) - 30, 0), int(bad[0]) + 40
    side = "flatcollate" if _char_mask(len(text), ours)[bad[0]] else "template"
    return "differ", f"{bad.size} chars, first marked by {side} only: {text[a:b]!r}"


def measure(
    tokenizer, directory: Path, names: list[str] | None = None, *, shared: Path | None = None, count: int = 24
) -> dict:
    """`{kind: Counter(agree=, differ=, refused=, skipped=)}` and the list of disagreements; with `shared` (the shared
    data folder), on `count` real conversations of each kind instead of the built ones."""
    counts = {kind: Counter() for kind in KINDS}
    chats = {
        kind: conversations(kind) if shared is None else shared_conversations(kind, shared, count) for kind in KINDS
    }
    details = []
    for name, base, training in template_pairs(directory):
        if names is not None and name not in names:
            continue
        renderer = ChatRenderer(tokenizer, chat_template=training)
        for kind in KINDS:
            for k, (messages, tools) in enumerate(chats[kind]):
                outcome, detail = compare(renderer, base, messages, tools)
                counts[kind][outcome] += 1
                if outcome != "agree":
                    details.append((name, kind, k, outcome, detail))
    return {"counts": counts, "details": details}


def main(argv=None) -> None:
    import trl
    from transformers import AutoTokenizer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", default="../shared/data/tokenizers/qwen2.5-instruct")
    parser.add_argument("--data", choices=("built", "shared"), default="built", help="conversations to compare")
    parser.add_argument("--shared-dir", type=Path, default=Path("../shared/data"))
    parser.add_argument("--count", type=int, default=24, help="real conversations per kind (--data shared)")
    args = parser.parse_args(argv)
    shared = args.shared_dir if args.data == "shared" else None
    result = measure(
        AutoTokenizer.from_pretrained(args.tokenizer),
        Path(trl.__file__).parent / "chat_templates",
        shared=shared,
        count=args.count,
    )
    print("| kind | agree | differ | refused (template drops or splits a message) | skipped | agreement |")
    print("|---|---|---|---|---|---|")
    for kind, c in result["counts"].items():
        rate = c["agree"] / max(c["agree"] + c["differ"], 1)
        print(f"| {kind} | {c['agree']} | {c['differ']} | {c['refused']} | {c['skipped']} | {rate:.1%} |")
    for row in result["details"]:
        print(*row, sep=" | ")


if __name__ == "__main__":
    sys.exit(main())
