"""`make_supervised_dataset` / DART-Math names: loading, shuffling, caching, errors, and packed training losses."""

import gzip
import itertools
import json

import datasets
import pytest
import torch
from transformers import AutoTokenizer

from flatcollate.data import PackedDataset, build_encoder, make_supervised_dataset, make_supervised_dset


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
    rows = datasets.Dataset.from_list(gsm8k_rows)
    dset = make_supervised_dset(gpt2, rows, query_field="question", resp_field="answer")
    packed = PackedDataset(dset, gpt2, 1024, 0)
    stats = packed.stat()
    assert "60 sequences" in capsys.readouterr().out
    assert stats.num_tokens == sum(len(r) for r in dset["input_ids"])
    assert all(len(packed[i]["input_ids"]) <= 1024 for i in range(len(packed)))


def test_tiny_model_sees_the_same_per_sequence_losses_packed_and_unpacked(gpt2, gsm8k_rows):
    from flatcollate import DataCollatorWithFlattening
    from flatcollate.models import tiny_causal_lm

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
