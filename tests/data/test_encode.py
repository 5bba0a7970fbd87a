"""`build_encoder` on real tokenizers and datasets: labels checked token by token against references."""

import itertools
import json
import pickle

import numpy as np
import pytest
from transformers import AutoTokenizer

from flatcollate.data.encode import build_encoder
from flatcollate.data.prompt_templates import load_template, render_prompt

CHAT = {
    "qwen2.5-instruct": ({}, "<|im_end|>\n"),
    "llama-3.2-instruct": ({"date_string": "26 Jul 2024"}, "<|eot_id|>"),
    "mistral-7b-instruct-v0.2": ({}, "</s>"),
}


@pytest.fixture(scope="module")
def tokenizers(tokenizer_dir):
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = AutoTokenizer.from_pretrained(tokenizer_dir(name))
        return cache[name]

    return get


def read_jsonl(path, n):
    with open(path) as f:
        return [json.loads(line) for line in itertools.islice(f, n)]


def labeled_spans(labels):
    """Contiguous runs of trained tokens, as lists of ids (slow reference: a plain loop)."""
    spans, current = [], []
    for t in labels:
        if t == -100:
            if current:
                spans.append(current)
            current = []
        else:
            current.append(t)
    return [*spans, current] if current else spans


@pytest.mark.parametrize("name", list(CHAT))
def test_chat_labels_are_each_reply_and_its_end_of_turn(tokenizers, shared_data, name):
    tok = tokenizers(name)
    kwargs, end_of_turn = CHAT[name]
    encoder = pickle.loads(pickle.dumps(build_encoder(tok, format="messages", chat_template_kwargs=kwargs)))
    rows = read_jsonl(shared_data / "datasets" / "hh_rlhf_harmless_base_test_messages.jsonl", 40)
    for i, row in enumerate(rows):
        out = encoder(row, index=i)
        reference = tok.apply_chat_template(row["messages"], tokenize=True, **kwargs)["input_ids"]
        assert out["input_ids"] == list(reference)
        assert all(lab in (-100, t) for lab, t in zip(out["labels"], out["input_ids"], strict=True))
        replies = [m["content"] for m in row["messages"] if m["role"] == "assistant"]
        spans = labeled_spans(out["labels"])
        assert len(spans) == len(replies)
        for span, reply in zip(spans, replies, strict=True):
            assert tok.decode(span).lstrip() == reply.strip() + end_of_turn


def test_generation_markers_give_the_mask(tokenizers, shared_data):
    tok = tokenizers("qwen2.5-instruct")
    template = (shared_data / "chat_templates" / "qwen2_5_training.jinja").read_text()
    encoder = build_encoder(tok, format="messages", chat_template=template)
    plain = build_encoder(tok, format="messages")
    for i, row in enumerate(read_jsonl(shared_data / "datasets" / "hh_rlhf_harmless_base_test_messages.jsonl", 20)):
        out, ref = encoder(row, index=i), plain(row, index=i)
        assert out["input_ids"] == ref["input_ids"]
        marked = tok.apply_chat_template(
            row["messages"], chat_template=template, return_dict=True, return_assistant_tokens_mask=True
        )["assistant_masks"]
        expected = np.where(np.array(marked) == 1, out["input_ids"], -100).tolist()
        assert out["labels"] == expected
        assert all(span[-2] == tok.convert_tokens_to_ids("<|im_end|>") for span in labeled_spans(out["labels"]))


def test_sharegpt_with_tools(tokenizers, shared_data):
    tok = tokenizers("qwen2.5-instruct")
    encoder = build_encoder(tok, format="sharegpt")
    rows = json.loads((shared_data / "datasets" / "glaive_toolcall_en_demo.json").read_text())[:30]
    roles = {"human": "user", "gpt": "assistant", "function_call": "assistant", "observation": "tool"}
    for i, row in enumerate(rows):
        out = encoder(row, index=i)
        messages = [{"role": roles[t["from"]], "content": t["value"]} for t in row["conversations"]]
        tools = json.loads(row["tools"]) if row["tools"] else None
        assert out["input_ids"] == list(tok.apply_chat_template(messages, tools=tools)["input_ids"])
        replies = [m["content"] for m in messages if m["role"] == "assistant"]
        spans = labeled_spans(out["labels"])
        assert [tok.decode(s) for s in spans] == [r + "<|im_end|>\n" for r in replies]


@pytest.mark.parametrize("tokenizer_name", ["gpt2", "qwen2.5-instruct"])
def test_instruction_rows_train_on_answer_and_eos(tokenizers, shared_data, tokenizer_name):
    tok = tokenizers(tokenizer_name)
    encoder = build_encoder(tok, format="instruction", query_field="question", resp_field="answer")
    template = load_template("alpaca")
    for i, row in enumerate(read_jsonl(shared_data / "datasets" / "gsm8k_train.jsonl", 100)):
        out = encoder(row, index=i)
        prompt = tok(render_prompt(template, row["question"]))["input_ids"]
        answer = [*tok(row["answer"], add_special_tokens=False)["input_ids"], tok.eos_token_id]
        assert out["input_ids"] == prompt + answer
        assert out["labels"] == [-100] * len(prompt) + answer


def test_alpaca_input_field_and_prompt_completion(tokenizers, shared_data):
    tok = tokenizers("gpt2")
    rows = json.loads((shared_data / "datasets" / "code_alpaca_2k.json").read_text())[:100]
    encoder = build_encoder(tok, query_field="instruction", resp_field="output")
    template = load_template("alpaca")
    for i, row in enumerate(rows):
        out = encoder(row, index=i)
        prompt = tok(render_prompt(template, row["instruction"], row["input"]))["input_ids"]
        assert out["labels"][: len(prompt)] == [-100] * len(prompt)
        assert tok.decode(out["input_ids"][: len(prompt)]) == render_prompt(template, row["instruction"], row["input"])
    t0 = read_jsonl(shared_data / "datasets" / "t0_mix_7k.jsonl", 50)
    encoder = build_encoder(tok, format="prompt_completion")
    for i, row in enumerate(t0):
        out = encoder(row, index=i)
        n = len(tok(row["prompt"])["input_ids"])
        assert out["labels"] == [-100] * n + out["input_ids"][n:]
        assert out["input_ids"][-1] == tok.eos_token_id


def test_template_that_cannot_be_matched_raises(tokenizers):
    tok = tokenizers("qwen2.5-instruct")
    # The header counts every message, so a partial rendering is never a prefix of the whole.
    template = "{{ messages|length }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    encoder = build_encoder(tok, format="messages", chat_template=template)
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    with pytest.raises(ValueError, match=r"row 3: field 'messages'.*renders message .* differently.*generation"):
        encoder({"messages": messages}, index=3)


@pytest.mark.parametrize(
    ("example", "match"),
    [
        (
            {
                "messages": [
                    {"role": "system", "content": "s"},
                    {"role": "user", "content": "u"},
                    {"role": "assistant", "content": "a"},
                ]
            },
            r"row 5: field 'messages'.*chat template rejected",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": "u"},
                    {"role": "user", "content": "v"},
                    {"role": "assistant", "content": "a"},
                ]
            },
            r"row 5: field 'messages'.*chat template rejected",
        ),
        ({"messages": [{"role": "user", "content": "u"}]}, r"row 5: field 'messages': no assistant message"),
        ({"messages": [{"role": "bot", "content": "u"}]}, r"row 5: field 'messages', message 0: role 'bot'"),
        (
            {"messages": [{"role": "user", "content": ""}, {"role": "assistant", "content": "a"}]},
            r"message 0: content must be a non-empty string",
        ),
        ({"messages": []}, r"row 5: field 'messages' must be a non-empty list"),
    ],
)
def test_bad_conversations_name_row_and_field(tokenizers, example, match):
    encoder = build_encoder(tokenizers("mistral-7b-instruct-v0.2"), format="messages")
    with pytest.raises(ValueError, match=match):
        encoder(example, index=5)


def test_bad_text_rows_name_row_and_field(tokenizers):
    tok = tokenizers("gpt2")
    encoder = build_encoder(tok, query_field="question", resp_field="answer")
    with pytest.raises(ValueError, match=r"row 2: missing field 'question'"):
        encoder({"answer": "4"}, index=2)
    with pytest.raises(ValueError, match=r"row 2: field 'answer' is empty"):
        encoder({"question": "2+2?", "answer": "  "}, index=2)
    with pytest.raises(TypeError, match=r"row 2: field 'answer' must be a string, got int"):
        encoder({"question": "2+2?", "answer": 4}, index=2)
    with pytest.raises(ValueError, match=r"row 2: cannot tell the format"):
        encoder({"text": "x"}, index=2)
    with pytest.raises(ValueError, match=r"row 2: field 'messages' is a conversation but the tokenizer has no chat"):
        encoder({"messages": [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]}, index=2)
    with pytest.raises(ValueError, match="has no chat template"):
        build_encoder(tok, format="messages")
    with pytest.raises(ValueError, match=r"no \{query\} placeholder"):
        build_encoder(tok, template="Answer: ")
