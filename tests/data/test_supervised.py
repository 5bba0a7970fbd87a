"""`make_supervised_dataset` / DART-Math names: loading, shuffling, caching, errors, and packed training losses."""

import copy
import gzip
import itertools
import json

import datasets
import pytest
import torch
from transformers import AutoTokenizer

from flatcollate.data import PackedDataset, build_encoder, dart, make_supervised_dataset

from .chat_rows import MIXED
from .label_runs import trained_runs

LLAMA_KWARGS = {"date_string": "26 Jul 2024"}


@pytest.fixture(scope="module")
def gpt2(tokenizer_dir):
    return AutoTokenizer.from_pretrained(tokenizer_dir("gpt2"))


@pytest.fixture
def gsm8k_rows(shared_data):
    with open(shared_data / "datasets" / "gsm8k_train.jsonl") as f:
        return [json.loads(next(f)) for _ in range(60)]


def test_sources_concatenate_shuffle_and_match_the_encoder(gpt2, gsm8k_rows, tmp_path):
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps(r) for r in gsm8k_rows[:20]))
    with gzip.open(tmp_path / "b.jsonl.gz", "wt") as f:
        f.write("\n".join(json.dumps(r) for r in gsm8k_rows[20:40]))
    (tmp_path / "c.json").write_text(json.dumps(gsm8k_rows[40:50]))
    datasets.Dataset.from_list(gsm8k_rows[50:]).to_parquet(tmp_path / "d.parquet")
    sources = [tmp_path / "a.jsonl", tmp_path / "b.jsonl.gz", tmp_path / "c.json", tmp_path / "d.parquet"]
    options = {"query_field": "question", "resp_field": "answer"}
    out = make_supervised_dataset(gpt2, sources, seed=0, cache_dir=tmp_path / "cache", **options)
    assert out.column_names == ["input_ids", "labels"] and len(out) == 60
    encoder = build_encoder(gpt2, **options)
    expected = sorted(tuple(encoder(r)["input_ids"]) for r in gsm8k_rows)
    assert sorted(tuple(r) for r in out["input_ids"]) == expected
    assert [tuple(r) for r in out["input_ids"]] != [tuple(encoder(r)["input_ids"]) for r in gsm8k_rows]
    again = make_supervised_dataset(gpt2, sources, seed=0, cache_dir=tmp_path / "cache", **options)
    assert again["input_ids"] == out["input_ids"]
    assert len(list((tmp_path / "cache").glob("supervised-*.arrow"))) == 1


def test_errors_name_file_row_and_field(gpt2, tmp_path):
    (tmp_path / "bad.jsonl").write_text('{"query": "a", "response": "b"}\n{"query": "a", \n')
    with pytest.raises(ValueError, match=r"bad.jsonl line 2: invalid JSON"):
        make_supervised_dataset(gpt2, tmp_path / "bad.jsonl")
    (tmp_path / "bad.json").write_text("[1, 2")
    with pytest.raises(ValueError, match=r"bad.json: invalid JSON"):
        make_supervised_dataset(gpt2, tmp_path / "bad.json")
    with pytest.raises(ValueError, match="does not exist"):
        make_supervised_dataset(gpt2, tmp_path / "missing.jsonl")
    rows = datasets.Dataset.from_list([{"query": "a", "response": "b"}, {"query": "a", "response": ""}])
    with pytest.raises(ValueError, match=r"row 1: field 'response' is empty"):
        make_supervised_dataset(gpt2, rows)


def test_dart_names(gpt2, gsm8k_rows, capsys):
    """DART-Math's names, all in its one compatibility module."""
    rows = datasets.Dataset.from_list(gsm8k_rows)
    dset = dart.make_supervised_dset(gpt2, rows, query_field="question", resp_field="answer")
    packed = dart.PackedDataset(dset, gpt2, 1024, 0)
    stats = packed.stat()
    assert "60 sequences" in capsys.readouterr().out
    assert stats.num_tokens == sum(len(r) for r in dset["input_ids"])
    assert all(len(packed[i]["input_ids"]) <= 1024 for i in range(len(packed)))


def test_tiny_model_sees_the_same_per_sequence_losses_packed_and_unpacked(gpt2, gsm8k_rows):
    from flatcollate import DataCollatorWithFlattening
    from flatcollate.testing import tiny_causal_lm

    torch.manual_seed(0)
    model = tiny_causal_lm("llama", vocab_size=len(gpt2), attn_implementation="sdpa").eval()
    dset = make_supervised_dataset(
        gpt2, datasets.Dataset.from_list(gsm8k_rows[:6]), seed=None, query_field="question", resp_field="answer"
    )
    packed = PackedDataset(dset, gpt2, 512, None)
    assert len(packed) < len(dset)

    def per_sequence_losses(batch):
        logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False).logits[0]
        labels = batch["labels"][0]
        cu = batch["cu_seq_lens_q"].tolist()
        # Loop over sequences: each loss is its own mean over its own trained tokens.
        return [
            torch.nn.functional.cross_entropy(logits[a : b - 1], labels[a + 1 : b], ignore_index=-100).item()
            for a, b in itertools.pairwise(cu)
        ]

    collator = DataCollatorWithFlattening()
    unpacked = {}
    for row in dset:
        batch = collator([row])
        unpacked[tuple(row["input_ids"])] = per_sequence_losses(batch)[0]
    seen = 0
    for i in range(len(packed)):
        row = packed[i]
        batch = collator([row])
        cut = [0, *torch.tensor(row["seq_lengths"]).cumsum(0).tolist()]
        for (a, b), loss in zip(itertools.pairwise(cut), per_sequence_losses(batch), strict=True):
            assert loss == pytest.approx(unpacked[tuple(row["input_ids"][a:b])], abs=1e-5)
            seen += 1
    assert seen == len(dset)


def test_skipped_rows_are_counted_logged_and_dropped(gpt2, gsm8k_rows, caplog):
    rows = [dict(r) for r in gsm8k_rows[:20]]
    rows[3]["answer"] = "  "
    rows[11]["answer"] = ""
    rows[15]["question"] = "   "
    with pytest.raises(ValueError, match=r"row 3: field 'answer' is empty"):
        make_supervised_dataset(gpt2, datasets.Dataset.from_list(rows), query_field="question", resp_field="answer")
    with caplog.at_level("WARNING", logger="flatcollate.data.supervised"):
        out, stats = make_supervised_dataset(
            gpt2,
            datasets.Dataset.from_list(rows),
            seed=None,
            on_error="skip",
            return_stats=True,
            query_field="question",
            resp_field="answer",
        )
    assert (stats.num_rows, stats.num_encoded, len(out)) == (20, 17, 17)
    assert stats.skipped == {"empty_field": 3}
    assert stats.first_skipped == {"empty_field": [3, 11, 15]}
    assert stats.first_messages["empty_field"].startswith("row 3: field 'answer' is empty.")
    assert "skipped 3 (empty_field): rows 3, 11, 15" in caplog.text
    encoder = build_encoder(gpt2, query_field="question", resp_field="answer")
    kept = [r for i, r in enumerate(rows) if i not in (3, 11, 15)]
    assert out["input_ids"] == [encoder(r)["input_ids"] for r in kept]
    assert out.column_names == ["input_ids", "labels"]


def test_a_batch_of_only_skipped_rows_keeps_the_column_types(gpt2, gsm8k_rows):
    rows = [{"question": "q", "answer": ""}] * 4 + gsm8k_rows[:4]
    out, stats = make_supervised_dataset(
        gpt2,
        datasets.Dataset.from_list(rows),
        batch_size=4,
        on_error="skip",
        return_stats=True,
        query_field="question",
        resp_field="answer",
    )
    assert stats.skipped == {"empty_field": 4} and len(out) == 4
    assert out.features["input_ids"].feature.dtype == "int64"


def test_the_cache_is_keyed_on_everything_that_changes_the_encoding(gpt2, gsm8k_rows, tmp_path):
    cache = tmp_path / "cache"
    rows = datasets.Dataset.from_list(
        [
            {"messages": [{"role": "user", "content": r["question"]}, {"role": "assistant", "content": r["answer"]}]}
            for r in gsm8k_rows[:10]
        ]
    )
    tok = copy.deepcopy(gpt2)
    tok.chat_template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{{ eos_token }}{% endfor %}"

    def build(tokenizer, **options):
        return make_supervised_dataset(tokenizer, rows, seed=None, cache_dir=cache, **options)

    def cache_files():
        return len(list(cache.glob("supervised-*.arrow")))

    first = build(tok)
    assert cache_files() == 1
    assert build(tok)["input_ids"] == first["input_ids"] and cache_files() == 1  # same settings: reused
    other_template = copy.deepcopy(tok)
    other_template.chat_template = "{% for m in messages %}[{{ m.role }}] {{ m.content }}{{ eos_token }}{% endfor %}"
    assert build(other_template)["input_ids"] != first["input_ids"] and cache_files() == 2
    assert build(tok, chat_template_kwargs={"unused": 1})["input_ids"] == first["input_ids"] and cache_files() == 3
    assert build(tok, on_error="skip")["input_ids"] == first["input_ids"] and cache_files() == 4
    other_eos = copy.deepcopy(tok)
    other_eos.eos_token = "!"
    changed = build(other_eos)
    assert changed["input_ids"] != first["input_ids"] and cache_files() == 5
    assert changed["input_ids"][0][-1] == gpt2.convert_tokens_to_ids("!")
    text_rows = datasets.Dataset.from_list(gsm8k_rows[:10])
    options = {"query_field": "question", "resp_field": "answer"}
    with_eos = make_supervised_dataset(tok, text_rows, seed=None, cache_dir=cache, **options)
    without = make_supervised_dataset(tok, text_rows, seed=None, cache_dir=cache, add_eos=False, **options)
    assert [r[:-1] for r in with_eos["input_ids"]] == without["input_ids"] and cache_files() == 7


def test_mixed_chat_rows_from_a_list_or_parquet(tokenizer_dir, tmp_path):
    """Plain and tool-calling conversations in one `Dataset.from_list` (or Parquet file) give every message every key,
    None where it has none. Llama-3.2's template takes `'tool_calls' in message` for a tool call, yet every row is
    encoded as `apply_chat_template` renders the row written with its own keys only."""
    tok = AutoTokenizer.from_pretrained(tokenizer_dir("llama-3.2-instruct"))
    rows = datasets.Dataset.from_list(MIXED)
    plain = {"role": "user", "content": "Hi.", "tool_calls": None, "name": None, "tool_call_id": None}
    assert rows[0]["messages"][0] == plain
    rows.to_parquet(tmp_path / "chats.parquet")
    expected = [list(tok.apply_chat_template(row["messages"], **LLAMA_KWARGS)["input_ids"]) for row in MIXED]
    for source in (rows, tmp_path / "chats.parquet"):
        out, stats = make_supervised_dataset(
            tok, source, seed=None, on_error="skip", return_stats=True, chat_template_kwargs=LLAMA_KWARGS
        )
        assert (stats.num_encoded, stats.skipped) == (2, {})
        assert out["input_ids"] == expected
        assert [len(trained_runs(labels)) for labels in out["labels"]] == [1, 2]


@pytest.mark.parametrize("name", ["llama-3.2-instruct", "mistral-7b-instruct-v0.2", "qwen2.5-instruct"])
def test_a_prompt_rendered_with_its_bos_keeps_one_bos(tokenizer_dir, name):
    """A prompt rendered beforehand with `apply_chat_template(tokenize=False)` holds the BOS text already: the
    tokenizer's own BOS is not added before it. A prompt without it gets the tokenizer's BOS as before."""
    tok = AutoTokenizer.from_pretrained(tokenizer_dir(name))
    kwargs = LLAMA_KWARGS if name == "llama-3.2-instruct" else {}
    question = [{"role": "user", "content": "Name a colour."}]
    prompt = tok.apply_chat_template(question, tokenize=False, add_generation_prompt=True, **kwargs)
    rows = [{"prompt": prompt, "completion": "Blue."}, {"prompt": "Name a colour.\n", "completion": "Blue."}]
    out = make_supervised_dataset(tok, datasets.Dataset.from_list(rows), format="prompt_completion", seed=None)
    eos = [tok.eos_token_id]
    assert out[0]["input_ids"] == tok(prompt + "Blue.", add_special_tokens=False)["input_ids"] + eos
    assert out[1]["input_ids"] == tok("Name a colour.\nBlue.")["input_ids"] + eos
    bos = tok.bos_token_id
    assert [ids.count(bos) for ids in out["input_ids"]] == ([1, 1] if bos is not None else [0, 0])
    assert [tok.decode(run) for run in trained_runs(out[0]["labels"])] == ["Blue." + tok.eos_token]
    # The control: the tokenizer adds its BOS before the rendered one (Llama-3.2, Mistral; Qwen2.5 has none).
    doubled = tok(prompt + "Blue.")["input_ids"]
    if bos is not None:
        assert doubled[:2] == [bos, bos] and doubled[1:] + eos == out[0]["input_ids"]
    else:
        assert doubled + eos == out[0]["input_ids"]
