"""`build_encoder` on real tokenizers and datasets: labels checked token by token against references."""

import itertools
import json
import pickle

import numpy as np
import pytest
from transformers import AutoTokenizer

from flatcollate.data.encoders import build_encoder
from flatcollate.data.prompt_templates import load_template, render_prompt

from .label_runs import trained_runs

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


@pytest.mark.parametrize("name", list(CHAT))
def test_chat_labels_are_each_reply_and_its_end_of_turn(tokenizers, shared_data, name):
    tok = tokenizers(name)
    kwargs, end_of_turn = CHAT[name]
    encoder = pickle.loads(pickle.dumps(build_encoder(tok, format="messages", chat_template_kwargs=kwargs)))
    rows = read_jsonl(shared_data / "datasets" / "hh_rlhf_harmless_base_test_messages.jsonl", 15)
    for i, row in enumerate(rows):
        out = encoder(row, index=i)
        reference = tok.apply_chat_template(row["messages"], tokenize=True, **kwargs)["input_ids"]
        assert out["input_ids"] == list(reference)
        assert all(lab in (-100, t) for lab, t in zip(out["labels"], out["input_ids"], strict=True))
        replies = [m["content"] for m in row["messages"] if m["role"] == "assistant"]
        spans = trained_runs(out["labels"])
        assert len(spans) == len(replies)
        for span, reply in zip(spans, replies, strict=True):
            assert tok.decode(span).lstrip() == reply.strip() + end_of_turn


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
        spans = trained_runs(out["labels"])
        assert [tok.decode(s) for s in spans] == [r + "<|im_end|>\n" for r in replies]


def reference_labels(tok, prompt, answer):
    """Slow reference: tokenize the whole text, train each token whose characters overlap the answer, then EOS."""
    text = prompt + answer
    enc = tok(text, return_offsets_mapping=True)
    pairs = zip(enc["input_ids"], enc["offset_mapping"], strict=True)
    labels = [t if a < len(text) and len(prompt) < b else -100 for t, (a, b) in pairs]
    return [*enc["input_ids"], tok.eos_token_id], [*labels, tok.eos_token_id]


@pytest.mark.parametrize("tokenizer_name", ["gpt2", "qwen2.5-instruct", "mistral-7b-instruct-v0.2"])
def test_instruction_rows_train_on_answer_and_eos(tokenizers, shared_data, tokenizer_name):
    """100 GSM8K rows through the alpaca template: the whole text is tokenized once."""
    tok = tokenizers(tokenizer_name)
    encoder = build_encoder(tok, format="instruction", query_field="question", resp_field="answer")
    template = load_template("alpaca")
    for i, row in enumerate(read_jsonl(shared_data / "datasets" / "gsm8k_train.jsonl", 100)):
        out = encoder(row, index=i)
        assert (out["input_ids"], out["labels"]) == reference_labels(
            tok, render_prompt(template, row["question"]), row["answer"]
        )
        assert tok.decode([t for t in out["labels"] if t != -100]).strip().startswith(row["answer"][:20].strip())


def test_alpaca_input_field_and_prompt_completion(tokenizers, shared_data):
    """100 CodeAlpaca rows (with and without `input`) and 50 T0 prompt/completion rows, GPT-2."""
    tok = tokenizers("gpt2")
    rows = json.loads((shared_data / "datasets" / "code_alpaca_2k.json").read_text())[:100]
    encoder = build_encoder(tok, query_field="instruction", resp_field="output")
    template = load_template("alpaca")
    for i, row in enumerate(rows):
        out = encoder(row, index=i)
        prompt = render_prompt(template, row["instruction"], row["input"])
        assert (out["input_ids"], out["labels"]) == reference_labels(tok, prompt, row["output"])
    encoder = build_encoder(tok, format="prompt_completion")
    for i, row in enumerate(read_jsonl(shared_data / "datasets" / "t0_mix_7k.jsonl", 50)):
        out = encoder(row, index=i)
        assert (out["input_ids"], out["labels"]) == reference_labels(tok, row["prompt"], row["completion"])


def test_prompt_completion_is_tokenized_as_one_text(tokenizers):
    """SentencePiece adds "▁" to a completion tokenized on its own: "->" + "cat" must stay "->cat"."""
    tok = tokenizers("mistral-7b-instruct-v0.2")
    out = build_encoder(tok, format="prompt_completion")({"prompt": "Translate: chat ->", "completion": "cat"})
    assert out["input_ids"] == [*tok("Translate: chat ->cat")["input_ids"], tok.eos_token_id]
    assert tok.convert_ids_to_tokens([t for t in out["labels"] if t != -100]) == ["cat", "</s>"]
    # After the alpaca prompt's final "\n" the whole text has "The"; the answer on its own would be "▁The".
    out = build_encoder(tok, format="instruction")({"query": "2 + 2?", "response": "The answer is 4."})
    prompt = render_prompt(load_template("alpaca"), "2 + 2?")
    assert out["input_ids"] == [*tok(prompt + "The answer is 4.")["input_ids"], tok.eos_token_id]
    assert tok.convert_ids_to_tokens([t for t in out["labels"] if t != -100])[:2] == ["The", "▁answer"]


def test_a_token_across_the_seam_is_trained(tokenizers, shared_data):
    """Random cut points inside 200 GSM8K texts (GPT-2): labels equal the slow reference, and a token that straddles
    the cut (it carries answer characters) is trained."""
    tok = tokenizers("gpt2")
    encoder = build_encoder(tok, format="prompt_completion")
    rng = np.random.default_rng(0)
    straddled = 0
    for i, row in enumerate(read_jsonl(shared_data / "datasets" / "gsm8k_train.jsonl", 200)):
        text = row["question"] + " " + row["answer"]
        cut = int(rng.integers(1, len(text) - 1))
        out = encoder({"prompt": text[:cut], "completion": text[cut:]}, index=i)
        assert (out["input_ids"], out["labels"]) == reference_labels(tok, text[:cut], text[cut:])
        offsets = tok(text, return_offsets_mapping=True)["offset_mapping"]
        straddled += any(a < cut < b for a, b in offsets)
    assert straddled > 50


def test_a_header_that_depends_on_the_whole_conversation(tokenizers):
    """The template writes the message count first, so no partial rendering is a prefix of the whole; one
    rendering does not need it to be."""
    tok = tokenizers("qwen2.5-instruct")
    template = "{{ messages|length }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    encoder = build_encoder(tok, format="messages", chat_template=template)
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    out = encoder({"messages": messages}, index=3)
    assert out["input_ids"] == tok("2<user>hi<assistant>hello", add_special_tokens=False)["input_ids"]
    assert tok.decode([t for t in out["labels"] if t != -100]) == "hello"


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
            {"messages": [{"role": "user", "content": None}, {"role": "assistant", "content": "a"}]},
            r"message 0: 'content' is missing",
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
