"""Chat encoding: one rendering, one tokenization, labels placed by character offsets.

Checked on every row of the shared conversational datasets with every shared chat tokenizer: `input_ids` equal
`apply_chat_template(tokenize=True)`, and labels equal the `{% generation %}` mask of the training templates (up to
the one documented difference of the Qwen2.5 training template).
"""

import json
from unittest import mock

import datasets
import numpy as np
import pytest
from transformers import AutoTokenizer

from flatcollate.data import RowError, SkippedRow, build_encoder
from flatcollate.data.chat import ChatRenderer

from .chat_rows import MIXED
from .label_runs import trained_runs

CHAT_KWARGS = {
    "qwen2.5-instruct": {},
    "llama-3.2-instruct": {"date_string": "26 Jul 2024"},
    "mistral-7b-instruct-v0.2": {},
}
TRAINING_TEMPLATES = {"qwen2.5-instruct": "qwen2_5_training.jinja", "llama-3.2-instruct": "llama3_training.jinja"}
# One type for every message, as Parquet and `Dataset.from_list` store mixed conversations: None where it has none.
MESSAGE = {
    "role": datasets.Value("string"),
    "content": datasets.Value("string"),
    "tool_calls": datasets.List(
        {
            "type": datasets.Value("string"),
            "function": {"name": datasets.Value("string"), "arguments": datasets.Value("string")},
        }
    ),
    "name": datasets.Value("string"),
    "tool_call_id": datasets.Value("string"),
    "reasoning_content": datasets.Value("string"),
}
# Mistral-Nemo's way with the system message: it is written into the *last* user turn only, so it vanishes from a
# conversation that ends on an assistant reply.
SYSTEM_IN_LAST_USER_TURN = (
    "{%- if messages[0].role == 'system' %}{%- set system = messages[0].content %}"
    "{%- set messages = messages[1:] %}{%- endif %}{{ bos_token }}"
    "{%- for m in messages %}{%- if m.role == 'user' %}"
    "{%- if loop.last and system is defined %}[INST]{{ system }}\n\n{{ m.content }}[/INST]"
    "{%- else %}[INST]{{ m.content }}[/INST]{%- endif %}"
    "{%- else %}{{ m.content }}{{ eos_token }}{%- endif %}{%- endfor %}"
)


@pytest.fixture(scope="module")
def tokenizers(tokenizer_dir):
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = AutoTokenizer.from_pretrained(tokenizer_dir(name))
        return cache[name]

    return get


@pytest.fixture(scope="module")
def hh_rows(shared_data):
    with open(shared_data / "datasets" / "hh_rlhf_harmless_base_test_messages.jsonl") as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def glaive_rows(shared_data):
    return json.loads((shared_data / "datasets" / "glaive_toolcall_en_demo.json").read_text())


def reference_mask(offsets, spans):
    """Slow reference of the label rule: a token is trained iff its characters overlap a trained span."""
    return [any(a < e and s < b for s, e in spans) for a, b in offsets]


# -- regressions ------------------------------------------------------------------------------------------------


def test_reply_starting_with_newline_merges_with_the_header(tokenizers):
    tok = tokenizers("qwen2.5-instruct")
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "\n1. step"}]
    out = build_encoder(tok, format="messages")({"messages": messages})
    assert out["input_ids"] == list(tok.apply_chat_template(messages)["input_ids"])
    (run,) = trained_runs(out["labels"])
    # "assistant\n" + "\n1." tokenizes as "assistant", "ĊĊ", "1", ".": the merged token carries reply text, so it is
    # trained.
    assert tok.convert_ids_to_tokens(run)[0] == "ĊĊ"
    assert tok.decode(run) == "\n\n1. step<|im_end|>\n"


def test_empty_turns_are_content(tokenizers):
    tok = tokenizers("qwen2.5-instruct")
    messages = [m for _ in range(22) for m in ({"role": "user", "content": ""}, {"role": "assistant", "content": "ok"})]
    out = build_encoder(tok, format="messages")({"messages": messages}, index=0)
    assert out["input_ids"] == list(tok.apply_chat_template(messages)["input_ids"])
    assert [tok.decode(r) for r in trained_runs(out["labels"])] == ["ok<|im_end|>\n"] * 22


def test_template_that_drops_a_message_names_it(tokenizers):
    tok = tokenizers("mistral-7b-instruct-v0.2")
    encoder = build_encoder(tok, format="messages", chat_template=SYSTEM_IN_LAST_USER_TURN)
    messages = [
        {"role": "system", "content": "Always answer in French."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "bonjour"},
    ]
    with pytest.raises(RowError, match=r"row 4: .*message 0 \(system, 'Always answer in Fr.*'\).*drops") as err:
        encoder({"messages": messages}, index=4)
    assert err.value.reason == "template_drops_content"
    # A template that writes the reply before the question: reported as a move.
    backwards = "{% for m in messages|reverse %}<{{ m.role }}>{{ m.content }}{% endfor %}{{ eos_token }}"
    encoder = build_encoder(tok, format="messages", chat_template=backwards)
    with pytest.raises(RowError, match=r"row 4: .*message 1 \(user, 'hi'\) is rendered before message 0"):
        encoder({"messages": messages}, index=4)


def test_conversation_is_rendered_and_tokenized_once(tokenizers):
    tok = tokenizers("qwen2.5-instruct")
    encoder = build_encoder(tok, format="messages")
    messages = [{"role": r, "content": f"turn {i}"} for i, r in enumerate(["user", "assistant"] * 20)]
    with (
        mock.patch.object(
            type(tok), "apply_chat_template", autospec=True, side_effect=type(tok).apply_chat_template
        ) as render,
        mock.patch.object(type(tok), "__call__", autospec=True, side_effect=type(tok).__call__) as tokenize,
    ):
        encoder({"messages": messages})
    assert render.call_count == 1 and tokenize.call_count == 1


def test_bad_rows_are_skipped_with_a_reason(tokenizers):
    encoder = build_encoder(tokenizers("qwen2.5-instruct"), format="messages", on_error="skip")
    cases = {
        "no_assistant": [{"role": "user", "content": "u"}],
        "ends_without_reply": [
            {"role": "user", "content": "u"},
            {"role": "assistant", "content": "a"},
            {"role": "user", "content": "v"},
        ],
        "bad_message": [{"role": "user"}],
        "unknown_role": [{"role": "bot", "content": "u"}],
    }
    for reason, messages in cases.items():
        skipped = encoder({"messages": messages}, index=7)
        assert isinstance(skipped, SkippedRow)
        assert (skipped.index, skipped.reason) == (7, reason)
        assert skipped.message.startswith("row 7")
    skipped = encoder(["not", "a", "dict"], index=8)
    assert (skipped.index, skipped.reason) == (8, "not_a_dict")
    assert skipped.message.startswith("row 8: expected a dict of fields, got list.")
    assert encoder({"text": "x"}, index=9).reason == "missing_field"
    assert build_encoder(tokenizers("qwen2.5-instruct"), on_error="skip")({"text": "x"}).reason == "unknown_format"
    with pytest.raises(TypeError, match="row 8: expected a dict"):
        build_encoder(tokenizers("qwen2.5-instruct"))(["not", "a", "dict"], index=8)


def stored(rows: list[dict]) -> datasets.Dataset:
    return datasets.Dataset.from_list(rows, features=datasets.Features({"messages": datasets.List(MESSAGE)}))


@pytest.mark.parametrize("name", list(CHAT_KWARGS))
def test_none_valued_keys_are_absent(tokenizers, name):
    """A message's None-valued keys (`tool_calls`, `name`, `tool_call_id`, `reasoning_content`) are left out, as
    `apply_chat_template` leaves them out: the stored rows encode as the rows written with their own keys only."""
    tok, kwargs = tokenizers(name), CHAT_KWARGS[name]
    encoder = build_encoder(tok, format="messages", chat_template_kwargs=kwargs, on_error="skip")
    for i, (row, written) in enumerate(zip(stored(MIXED), MIXED, strict=True)):
        assert row["messages"][0]["tool_calls"] is None and row["messages"][1]["reasoning_content"] is None
        out = encoder(row, index=i)
        assert out == encoder(written, index=i)
        if name == "mistral-7b-instruct-v0.2" and i == 1:  # its template refuses tool turns, with or without None
            assert out.reason == "template_error"
            continue
        assert out["input_ids"] == list(tok.apply_chat_template(row["messages"], **kwargs)["input_ids"])
        assert len(trained_runs(out["labels"])) == len(row["messages"]) // 2


def test_none_valued_keys_crash_the_template_where_present(tokenizers):
    """The control: Llama-3.2's template takes `'tool_calls' in message` for a tool call, so the stored plain row
    fails to render where its None-valued keys are kept (the prefix renders), and renders where they are left out."""
    tok, kwargs = tokenizers("llama-3.2-instruct"), CHAT_KWARGS["llama-3.2-instruct"]
    messages = stored(MIXED)[0]["messages"]
    renderer = ChatRenderer(tok, template_kwargs=kwargs)
    with pytest.raises(TypeError, match="object of type 'NoneType' has no len"):
        renderer.prefix_renderer(messages)(messages, False)
    present = [{k: v for k, v in m.items() if v is not None} for m in messages]
    rendered = tok.apply_chat_template(messages, tokenize=False, **kwargs)
    assert renderer.prefix_renderer(present)(present, False) == rendered


def test_an_error_the_template_raises_is_the_rows_error(tokenizers):
    """Mistral v0.2's template joins strings, so content parts make it raise a `TypeError`, not a template error:
    the row is still refused as a `RowError` naming it, and skipped with `on_error="skip"`."""
    tok = tokenizers("mistral-7b-instruct-v0.2")
    row = {"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi."}]}, MIXED[0]["messages"][1]]}
    with pytest.raises(TypeError, match="can only concatenate str"):  # the control: what the template raises
        tok.apply_chat_template(row["messages"], tokenize=False)
    skipped = build_encoder(tok, format="messages", on_error="skip")(row, index=3)
    assert (skipped.index, skipped.reason) == (3, "encode_error")
    assert skipped.message.startswith("row 3: ") and "TypeError: can only concatenate str" in skipped.message
    with pytest.raises(RowError, match=r"row 3: .*TypeError: can only concatenate str.*on_error=\"skip\"") as caught:
        build_encoder(tok, format="messages")(row, index=3)
    assert caught.value.reason == "encode_error" and isinstance(caught.value.__cause__, TypeError)


# -- every row of the shared conversational data -----------------------------------------------------------------


@pytest.mark.parametrize("name", list(CHAT_KWARGS))
def test_input_ids_equal_apply_chat_template_on_hh_rows(tokenizers, hh_rows, name):
    """Every 4th row of hh_rlhf_harmless_base_test_messages.jsonl (575 of 2300) per tokenizer; the generation-marker
    test below covers all 2300 rows with the Qwen2.5 and Llama-3.2 tokenizers."""
    tok, kwargs = tokenizers(name), CHAT_KWARGS[name]
    encoder = build_encoder(tok, format="messages", chat_template_kwargs=kwargs)
    end = {"qwen2.5-instruct": "<|im_end|>\n", "llama-3.2-instruct": "<|eot_id|>", "mistral-7b-instruct-v0.2": "</s>"}
    for i, row in enumerate(hh_rows[::4]):
        out = encoder(row, index=i)
        assert out["input_ids"] == list(tok.apply_chat_template(row["messages"], **kwargs)["input_ids"]), i
        replies = [m["content"] for m in row["messages"] if m["role"] == "assistant"]
        assert len(trained_runs(out["labels"])) == len(replies), i
    # Decoding every run costs more than the encoding: the last row's replies are decoded.
    decoded = [tok.decode(r) for r in trained_runs(out["labels"])]
    assert [d.strip() for d in decoded] == [r.strip() + end[name].strip() for r in replies]


@pytest.mark.parametrize("name", ["qwen2.5-instruct", "llama-3.2-instruct"])
def test_sharegpt_tool_rows_every_row(tokenizers, glaive_rows, name):
    """All 300 rows of glaive_toolcall_en_demo.json (tools in the system prompt, tool turns)."""
    tok, kwargs = tokenizers(name), CHAT_KWARGS[name]
    encoder = build_encoder(tok, format="sharegpt", chat_template_kwargs=kwargs)
    roles = {"human": "user", "gpt": "assistant", "function_call": "assistant", "observation": "tool"}
    for i, row in enumerate(glaive_rows):
        out = encoder(row, index=i)
        messages = [{"role": roles[t["from"]], "content": t["value"]} for t in row["conversations"]]
        tools = json.loads(row["tools"]) if row["tools"] else None
        expected = tok.apply_chat_template(messages, tools=tools, **kwargs)["input_ids"]
        assert out["input_ids"] == list(expected), i
        assert len(trained_runs(out["labels"])) == sum(m["role"] == "assistant" for m in messages), i


def test_template_rejections_are_skipped_with_their_reason(tokenizers, glaive_rows):
    """All 300 glaive rows with Mistral v0.2, whose template refuses roles that do not alternate (tool turns)."""
    tok = tokenizers("mistral-7b-instruct-v0.2")
    encoder = build_encoder(tok, format="sharegpt", on_error="skip")
    outcomes = [encoder(row, index=i) for i, row in enumerate(glaive_rows)]
    skipped = [o for o in outcomes if isinstance(o, SkippedRow)]
    assert {o.reason for o in skipped} == {"template_error"}
    assert len(skipped) == 153 and all("roles must alternate" in o.message for o in skipped)
    kept = [(i, o) for i, o in enumerate(outcomes) if not isinstance(o, SkippedRow)]
    i, out = kept[-1]
    messages = [
        {"role": "user" if t["from"] == "human" else "assistant", "content": t["value"]}
        for t in glaive_rows[i]["conversations"]
    ]
    assert out["input_ids"] == list(tok.apply_chat_template(messages)["input_ids"])


@pytest.mark.parametrize("name", list(TRAINING_TEMPLATES))
def test_labels_agree_with_generation_markers_on_every_row(tokenizers, hh_rows, shared_data, name):
    """All 2300 hh rows: offset labels vs `return_assistant_tokens_mask` of the TRL training templates.

    Llama-3: identical. Qwen2.5: the training template also marks the "\\n" that ends `<|im_start|>assistant\\n`, the
    generation prompt; the offset rule leaves it to the prompt (inference starts after it). That token is the only
    difference, once per reply, except where the reply itself begins with "\\n" and the two merge into "ĊĊ".
    """
    tok = tokenizers(name)
    template = (shared_data / "chat_templates" / TRAINING_TEMPLATES[name]).read_text()
    renderer = ChatRenderer(tok, chat_template=template)
    newline = tok.convert_tokens_to_ids("Ċ")
    for i, row in enumerate(hh_rows):
        ids, mask = renderer.encode(row["messages"])
        marked_ids, marked = renderer.generation_mask(row["messages"])
        assert ids == marked_ids, i
        extra = np.flatnonzero(marked & ~mask)
        assert not (mask & ~marked).any(), i
        if name == "llama-3.2-instruct":
            assert extra.size == 0, i
        else:
            n_replies = sum(m["role"] == "assistant" for m in row["messages"])
            assert extra.size == n_replies and all(ids[t] == newline and mask[t + 1] for t in extra), i


def test_shipped_and_training_templates_give_the_same_labels(tokenizers, hh_rows, shared_data):
    """The Qwen2.5 shipped template and its training variant render the same text, so labels agree (300 rows)."""
    tok = tokenizers("qwen2.5-instruct")
    template = (shared_data / "chat_templates" / "qwen2_5_training.jinja").read_text()
    shipped = build_encoder(tok, format="messages")
    training = build_encoder(tok, format="messages", chat_template=template)
    for i, row in enumerate(hh_rows[:100]):
        assert shipped(row, index=i) == training(row, index=i)


def test_label_rule_matches_the_slow_reference(tokenizers):
    """Awkward replies: leading/trailing whitespace, empty, a reply that also occurs inside the header text."""
    tok = tokenizers("qwen2.5-instruct")
    renderer = ChatRenderer(tok)
    messages = [
        {"role": "user", "content": "assistant"},
        {"role": "assistant", "content": "a"},
        {"role": "user", "content": ""},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": " x "},
        {"role": "assistant", "content": "  spaced \n"},
    ]
    ids, mask = renderer.encode(messages)
    text = renderer.render(messages)
    offsets = tok(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    spans, pos = [], 0
    for reply in ("a", "", "  spaced \n"):
        start = text.index("<|im_start|>assistant\n" + reply + "<|im_end|>", pos) + len("<|im_start|>assistant\n")
        spans.append((start, start + len(reply) + len("<|im_end|>\n")))
        pos = spans[-1][1]
    assert mask.tolist() == reference_mask(offsets, spans)
    assert [tok.decode(r) for r in trained_runs(np.where(mask, ids, -100))] == [
        "a<|im_end|>\n",
        "<|im_end|>\n",
        "  spaced \n<|im_end|>\n",
    ]
