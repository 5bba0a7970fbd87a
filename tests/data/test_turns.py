"""What the model generates is trained: reasoning, tool calls and channels, read off the chat template.

`input_ids` equal `apply_chat_template(messages, tools=...)`; labels agree with the `{% generation %}` masks of every
training template installed with `trl` (`tools/template_agreement.py`).
"""

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from flatcollate.data import RowError, build_encoder

from .label_runs import trained_runs

trl = pytest.importorskip("trl")
TEMPLATES = Path(trl.__file__).parent / "chat_templates"
CITY = {"type": "object", "properties": {"city": {"type": "string"}}}
WEATHER = {"name": "get_weather", "description": "Weather in a city.", "parameters": CITY}
TOOLS = [{"type": "function", "function": WEATHER}]


def call(arguments):
    return {"type": "function", "function": {"name": "get_weather", "arguments": arguments}}


@pytest.fixture(scope="module")
def qwen(tokenizer_dir):
    return AutoTokenizer.from_pretrained(tokenizer_dir("qwen2.5-instruct"))


@pytest.mark.parametrize("arguments", [{"city": "Paris"}, '{"city": "Paris"}'], ids=["dict", "json_string"])
def test_tool_calls_and_tools_are_rendered_and_trained(qwen, arguments):
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [call(arguments)]},
        {"role": "tool", "content": '{"sky": "cloudy"}'},
        {"role": "assistant", "content": "Cloudy."},
    ]
    out = build_encoder(qwen, format="messages")({"messages": messages, "tools": json.dumps(TOOLS)}, index=0)
    assert out["input_ids"] == list(qwen.apply_chat_template(messages, tools=TOOLS)["input_ids"])
    runs = [qwen.decode(r) for r in trained_runs(out["labels"])]
    rendered = json.dumps({"name": "get_weather", "arguments": arguments}, ensure_ascii=False)
    assert runs == [f"<tool_call>\n{rendered}\n</tool_call><|im_end|>\n", "Cloudy.<|im_end|>\n"]


def test_reasoning_and_content_parts_are_trained(qwen):
    template = (TEMPLATES / "qwen3_training.jinja").read_text()
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "Capital of France?"}]},
        {"role": "assistant", "content": "Paris.", "reasoning_content": "France's capital is Paris."},
    ]
    out = build_encoder(qwen, format="messages", chat_template=template)({"messages": messages})
    assert out["input_ids"] == list(qwen.apply_chat_template(messages, chat_template=template)["input_ids"])
    (run,) = trained_runs(out["labels"])
    assert qwen.decode(run) == "<think>\nFrance's capital is Paris.\n</think>\n\nParis.<|im_end|>\n"


def test_earlier_reasoning_dropped_by_the_template_is_refused(qwen):
    """Qwen3's shipped template renders reasoning only after the last user message, so the first reply's would be lost
    from training: refused, naming the message and the field. Its training variant keeps every turn's reasoning."""
    turn = {"role": "assistant", "content": "A.", "reasoning_content": "think 1"}
    messages = [{"role": "user", "content": "q1"}, turn, {"role": "user", "content": "q2"}, {**turn, "content": "B."}]
    shipped = build_encoder(qwen, format="messages", chat_template=(TEMPLATES / "qwen3.jinja").read_text())
    with pytest.raises(RowError, match=r"row 2: .*message 1 \(assistant, 'A\.'\): its 'reasoning_content'") as err:
        shipped({"messages": messages}, index=2)
    assert err.value.reason == "template_drops_content"
    training = build_encoder(qwen, format="messages", chat_template=(TEMPLATES / "qwen3_training.jinja").read_text())
    out = training({"messages": messages})
    assert [qwen.decode(r) for r in trained_runs(out["labels"])] == [
        "<think>\nthink 1\n</think>\n\nA.<|im_end|>\n",
        "<think>\nthink 1\n</think>\n\nB.<|im_end|>\n",
    ]


def test_channel_headers_are_trained(qwen):
    template = (TEMPLATES / "gptoss_training.jinja").read_text()
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo", "thinking": "greet"}]
    out = build_encoder(qwen, format="messages", chat_template=template)({"messages": messages})
    (run,) = trained_runs(out["labels"])
    assert qwen.decode(run) == (
        "<|channel|>analysis<|message|>greet<|end|><|start|>assistant<|channel|>final<|message|>yo<|return|>"
    )


def test_a_template_that_rewrites_history_is_refused_naming_the_message(qwen):
    template = (
        "{% for m in messages %}{% if m.role == 'assistant' and loop.last %}<a>{{ m.content }}</a>"
        "{% elif m.role == 'assistant' %}<a>(earlier)</a>{% else %}<u>{{ m.content }}</u>{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<a>{% endif %}"
    )
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "one"},
                {"role": "user", "content": "r"}, {"role": "assistant", "content": "two"}]
    with pytest.raises(RowError, match=r"row 3: field 'messages', message 1 \(assistant, 'one'\).*differently") as err:
        build_encoder(qwen, format="messages", chat_template=template)({"messages": messages}, index=3)
    assert err.value.reason == "template_rewrites_history"


# `{G}` and `{/G}` mark where a `{% generation %}` variant of each template puts its markers: around what the model
# writes after the generation prompt, through its end of turn.
# Ends the last reply with `<|return|>` and earlier ones with `<|end|>`, keyed on `loop.last` alone (gpt-oss also keys
# it on `add_generation_prompt`, so a reply rendered as a turn the conversation goes on from ends in `<|end|>` there).
END_BY_LOOP_LAST = (
    "{%- for m in messages %}<|start|>{{ m.role }}<|message|>{%- if m.role == 'assistant' %}{G}{{ m.content }}"
    "{%- if loop.last %}<|return|>{%- else %}<|end|>{%- endif %}{/G}{%- else %}{{ m.content }}<|end|>{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}<|start|>assistant<|message|>{%- endif %}"
)
# DeepSeek-R1's way: the generation prompt forces `<think>\n`, which the history of past replies does not keep.
THINK_PROMPT_NOT_KEPT = (
    "{%- for m in messages %}{%- if m.role == 'user' %}<｜User｜>{{ m.content }}"
    "{%- else %}<｜Assistant｜>{G}{{ m.content }}<｜end▁of▁sentence｜>{/G}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<｜Assistant｜><think>\n{%- endif %}"
)


@pytest.mark.parametrize(
    "template", [END_BY_LOOP_LAST, THINK_PROMPT_NOT_KEPT], ids=["end_by_loop_last", "think_prompt_not_kept"]
)
def test_labels_equal_the_generation_mask_of_the_marked_variant(qwen, template):
    """Each earlier reply's own end of turn is trained (before: only `<|`, the part it shares with `<|return|>`), and a
    reply starting with `<` is trained from its first character, the token merging it with the header's `>` included
    (before: from where the prompt's `<think>` and the reply part, one character in)."""
    plain = template.replace("{G}", "").replace("{/G}", "")
    marked = template.replace("{G}", "{% generation %}").replace("{/G}", "{% endgeneration %}")
    replies = ["<b>Paris</b>.", "Since 1793.", "<i>A palace</i>, then a museum."]
    questions = ["Where is the Louvre?", "How old is the museum?", "One line?"]
    messages = []
    for question, reply in zip(questions, replies, strict=True):
        messages += [{"role": "user", "content": question}, {"role": "assistant", "content": reply}]
    out = build_encoder(qwen, format="messages", chat_template=plain)({"messages": messages}, index=0)
    reference = qwen.apply_chat_template(
        messages, chat_template=marked, return_dict=True, return_assistant_tokens_mask=True
    )
    assert out["input_ids"] == list(reference["input_ids"])
    assert [label != -100 for label in out["labels"]] == [bool(m) for m in reference["assistant_masks"]]


def test_reasoning_the_template_drops_is_refused_naming_the_field(qwen):
    """Qwen2.5's template renders no reasoning (Mistral-Nemo's neither): the reasoning would be lost from training."""
    messages = [
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": "Paris.", "reasoning_content": "France's capital is Paris."},
    ]
    named = r"row 5: field 'messages', message 1 \(assistant, 'Paris\.'\).*'reasoning_content'.*chat_template"
    with pytest.raises(RowError, match=named) as err:
        build_encoder(qwen, format="messages")({"messages": messages}, index=5)
    assert err.value.reason == "template_drops_content"
    assert isinstance(err.value, ValueError)


def _two_tools(content: str) -> list[dict]:
    calls = [call({"city": "Lyon"}), {"type": "function", "function": {"name": "convert", "arguments": {"to": "USD"}}}]
    return [
        {"role": "user", "content": "Weather in Lyon, and 10 EUR in USD?"},
        {"role": "assistant", "content": content, "tool_calls": calls},
        {"role": "tool", "name": "get_weather", "content": "sunny"},
        {"role": "tool", "name": "convert", "content": "10.8"},
        {"role": "assistant", "content": "Sunny; 10.80 USD."},
    ]


def test_diffusion_gemma_trains_the_call_and_its_stop_token_never_the_tool_response(qwen):
    """The tool response is written inside the assistant turn; `<|tool_response>` after the call is Gemma 4's stop
    token for a call (generation_config eos_token_id [1, 106, 50]), so it is trained; what follows it is not."""
    template = (TEMPLATES / "diffusion_gemma_training.jinja").read_text()
    out = build_encoder(qwen, format="messages", chat_template=template)({"messages": _two_tools(""), "tools": TOOLS})
    runs = [qwen.decode(r) for r in trained_runs(out["labels"])]
    assert runs[0].startswith("<|tool_call>call:get_weather{city:") and runs[0].endswith("<tool_call|><|tool_response>")
    assert not any("response:" in run or "sunny" in run or "10.8<" in run for run in runs), runs
    assert runs[-1] == "Sunny; 10.80 USD.<turn|>\n"


def test_a_reply_the_template_splits_around_tool_responses_is_refused_naming_the_message(qwen):
    """Diffusion-Gemma writes a tool-calling reply's content after the tool responses: refused, never guessed."""
    template = (TEMPLATES / "diffusion_gemma_training.jinja").read_text()
    encode = build_encoder(qwen, format="messages", chat_template=template)
    named = r"row 7: field 'messages', message 1 \(assistant, 'Checking\.'\).*after the tool"
    with pytest.raises(RowError, match=named) as err:
        encode({"messages": _two_tools("Checking."), "tools": TOOLS}, index=7)
    assert err.value.reason == "template_splits_reply"


def test_gptoss_reply_after_two_tool_results_trains_its_channel_header(qwen):
    """gpt-oss renders a tool-calling turn's content as analysis while tool results are the last messages and drops
    it once a reply follows: the next reply still starts right after its generation prompt."""
    template = (TEMPLATES / "gptoss_training.jinja").read_text()
    out = build_encoder(qwen, format="messages", chat_template=template)({"messages": _two_tools("Checking.")})
    runs = [qwen.decode(r) for r in trained_runs(out["labels"])]
    assert runs[-1] == "<|channel|>final<|message|>Sunny; 10.80 USD.<|return|>"


def _agreement_tool():
    path = Path(__file__).parents[2] / "tools" / "template_agreement.py"
    spec = importlib.util.spec_from_file_location("template_agreement", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("template_agreement", module)
    spec.loader.exec_module(module)
    return module


# A reasoning conversation refused because the template renders no reasoning, or only the last turn's.
REASONING_DROPPED = "'reasoning_content' is not in the rendered reply"


def _check_refusals(details, allowed: set[str]) -> None:
    """Refused rows, each documented (docs/data.md): templates in `allowed` (Phi-3/3.5 drop tool messages;
    Diffusion-Gemma writes a tool-calling reply's content after the tool responses), and, in the reasoning kind, the
    templates that drop reasoning."""
    refused = [(name, kind, detail) for name, kind, _, outcome, detail in details if outcome == "refused"]
    assert {name for name, kind, _ in refused if kind != "reasoning"} <= allowed, refused
    assert all(REASONING_DROPPED in detail for _, kind, detail in refused if kind == "reasoning"), refused


def test_labels_agree_with_every_trl_training_template(qwen):
    """Every `*_training.jinja` of the installed trl whose base renders the same text, four kinds of conversations
    (docs/data.md has the table and the reason for each remaining difference). Most templates render no reasoning,
    or only the last turn's, so fewer reasoning conversations are compared than others."""
    tool = _agreement_tool()
    result = tool.measure(qwen, TEMPLATES)
    for kind, counts in result["counts"].items():
        compared = counts["agree"] + counts["differ"]
        assert compared >= (12 if kind == "reasoning" else 30), (kind, counts, result["details"])
        assert counts["differ"] == 0, result["details"]
    _check_refusals(result["details"], {"phi3", "phi3_5", "diffusion_gemma"})


def test_labels_agree_with_every_trl_training_template_on_real_rows(qwen, shared_data, monkeypatch):
    """Held out: real HH-RLHF chats (plain, with a system prompt), GSM8K solutions as `reasoning_content` and Glaive
    function calls as OpenAI `tool_calls`, 24 of each, none looked at while writing the label rule (docs/data.md).
    Negative control: spans that start two characters late disagree."""
    tool = _agreement_tool()
    result = tool.measure(qwen, TEMPLATES, shared=shared_data)
    for kind, counts in result["counts"].items():
        compared = counts["agree"] + counts["differ"]
        assert compared >= (40 if kind == "reasoning" else 200), (kind, counts, result["details"][:5])
        assert counts["differ"] == 0, [d for d in result["details"] if d[3] == "differ"][:5]
    _check_refusals(result["details"], {"phi3", "phi3_5"})

    generated_spans = tool.ChatRenderer.generated_spans

    def late(self, *args, **kwargs):
        return [(start + 2, end) for start, end in generated_spans(self, *args, **kwargs)]

    monkeypatch.setattr(tool.ChatRenderer, "generated_spans", late)
    shifted = tool.measure(qwen, TEMPLATES, ["qwen2_5", "gemma3"], shared=shared_data, count=4)["counts"]
    assert shifted["plain"]["differ"] == shifted["plain"]["agree"] + shifted["plain"]["differ"] > 0, shifted


def _hh_chain(shared_data, count: int) -> list[dict]:
    messages = []
    with open(shared_data / "datasets" / "hh_rlhf_harmless_base_test_messages.jsonl") as f:
        for line in f:
            messages += json.loads(line)["messages"]
            if len(messages) >= count:
                return messages[:count]
    return messages


def test_a_long_chat_renders_prefixes_only_for_its_first_and_last_reply(qwen, shared_data):
    """Replies between the first and last that pass the cheap check pay no render: the encoder's time grows with the
    chat's length, not its square (a 330-message chat rendered 330 prefixes before)."""
    from flatcollate.data.chat import ChatRenderer
    from flatcollate.data.turns import generated_spans

    messages = _hh_chain(shared_data, 330)
    renderer = ChatRenderer(qwen)
    text, prefix = renderer.render(messages), renderer.prefix_renderer(messages)
    calls = []

    def counted(head, add_generation_prompt):
        calls.append(len(head))
        return prefix(head, add_generation_prompt)

    kwargs = {"generation_prompt": renderer.reply_prefix, "end_of_turn": renderer.reply_suffix, "where": "row 0"}
    fast = generated_spans(text, messages, render=counted, **kwargs)
    assert len(calls) <= 6, len(calls)
    slow = generated_spans(text, messages, render=prefix, render_every_reply=True, **kwargs)
    assert fast.tolist() == slow.tolist()


@pytest.mark.parametrize("name", ["qwen2.5-instruct", "llama-3.2-instruct", "mistral-7b-instruct-v0.2"])
def test_labels_with_the_cheap_check_equal_rendering_every_reply(name, tokenizer_dir, shared_data, monkeypatch):
    """Slow reference: every reply's prefixes rendered. HH-RLHF chats, Glaive tool calls and one 120-message chat
    (all 2300 + 300 rows of each tokenizer compared once: identical, docs/data.md)."""
    import functools

    import flatcollate.data.chat as chat

    tok = AutoTokenizer.from_pretrained(tokenizer_dir(name))
    kwargs = {"date_string": "26 Jul 2024"} if name.startswith("llama") else {}
    hh_text = (shared_data / "datasets" / "hh_rlhf_harmless_base_test_messages.jsonl").read_text()
    hh = [json.loads(line) for line in hh_text.splitlines()[:60]]
    glaive = json.loads((shared_data / "datasets" / "glaive_toolcall_en_demo.json").read_text())[:40]
    for fmt, rows in (("messages", [*hh, {"messages": _hh_chain(shared_data, 120)}]), ("sharegpt", glaive)):
        encode = build_encoder(tok, format=fmt, chat_template_kwargs=kwargs, on_error="skip")
        fast = [encode(row, index=k) for k, row in enumerate(rows)]
        with monkeypatch.context() as patch:
            patch.setattr(chat, "generated_spans", functools.partial(chat.generated_spans, render_every_reply=True))
            slow = [encode(row, index=k) for k, row in enumerate(rows)]
        assert fast == slow
