"""Streaming real GSM8K rows through real tokenizers: a small local encoder, and `flatcollate.data.build_encoder`."""

import itertools
import json

import numpy as np
import pytest
from torchdata.stateful_dataloader import StatefulDataLoader

from flatcollate import DataCollatorWithFlattening
from flatcollate.streaming import StreamingPacker

pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")


@pytest.fixture(scope="module")
def gsm8k_rows(shared_data):
    with open(shared_data / "datasets" / "gsm8k_train.jsonl") as handle:
        return [json.loads(line) for line in itertools.islice(handle, 120)]


@pytest.fixture(scope="module")
def encode(tokenizer_dir):
    transformers = pytest.importorskip("transformers")
    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_dir("qwen2.5-instruct"))

    def encode_fn(row):
        prompt = tokenizer(row["question"] + "\n")["input_ids"]
        answer = tokenizer(row["answer"])["input_ids"] + [tokenizer.eos_token_id]
        return {"input_ids": prompt + answer, "labels": [-100] * len(prompt) + answer}

    return encode_fn


def test_real_rows_pack_intact_and_resume_exactly(gsm8k_rows, encode):
    packer_args = {"pack_len": 512, "encode_fn": encode, "buffer_size": 16, "return_example_ids": True}
    packs = list(StreamingPacker(gsm8k_rows, **packer_args))
    assert all(p["input_ids"].numel() <= 512 for p in packs)
    fill = sum(p["input_ids"].numel() for p in packs) / (512 * len(packs))
    assert fill > 0.85
    pieces = {}
    for pack in packs:
        cuts = np.cumsum(pack["seq_lengths"])[:-1]
        for example_id, ids in zip(pack["example_ids"], np.split(pack["input_ids"].numpy(), cuts), strict=True):
            pieces[example_id] = ids.tolist()
    assert pieces == {i: encode(row)["input_ids"] for i, row in enumerate(gsm8k_rows)}

    def loader():
        packer = StreamingPacker(gsm8k_rows, pack_len=512, encode_fn=encode, buffer_size=16)
        return StatefulDataLoader(packer, batch_size=2, collate_fn=DataCollatorWithFlattening())

    full = [b["input_ids"].tolist() for b in loader()]
    first = loader()
    head = [b["input_ids"].tolist() for b in itertools.islice(first, 5)]
    resumed = loader()
    resumed.load_state_dict(first.state_dict())
    assert head + [b["input_ids"].tolist() for b in resumed] == full


def test_build_encoder_streams_with_workers_and_resumes(gsm8k_rows, tokenizer_dir):
    """The data pipeline's picklable encoder, run inside two DataLoader workers."""
    transformers = pytest.importorskip("transformers")
    from flatcollate.data.encoders import build_encoder

    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_dir("gpt2"))
    encoder = build_encoder(tokenizer, format="instruction", query_field="question", resp_field="answer")
    rows = gsm8k_rows[:60]

    def loader():
        packer = StreamingPacker(rows, pack_len=1024, encode_fn=encoder, buffer_size=8)
        return StatefulDataLoader(packer, batch_size=2, num_workers=2, collate_fn=DataCollatorWithFlattening())

    full = [b["input_ids"].tolist() for b in loader()]
    tokens = sorted(t for b in full for t in b[0])
    expected = sorted(t for row in rows for t in encoder(row)["input_ids"])
    assert tokens == expected
    first = loader()
    head = [b["input_ids"].tolist() for b in itertools.islice(first, 3)]
    resumed = loader()
    resumed.load_state_dict(first.state_dict())
    assert head + [b["input_ids"].tolist() for b in resumed] == full
