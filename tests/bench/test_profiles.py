"""Length profiles: shipped histograms reproduce the real datasets' padding, and user data loads with clear errors; the
pair profile of the preference tasks ships apart, is what its script writes and matches a per-pair tokenization."""

import gzip
import json

import numpy as np
import pytest
from transformers import AutoTokenizer

from flatcollate.profiles import load_profile, padded_fill
from flatcollate.profiles.length_profile import LengthProfile
from flatcollate.profiles.load import padded_batches
from flatcollate.profiles.make import SOURCES, make_pair_profiles, make_profiles
from flatcollate.profiles.names import available_pair_profiles, available_profiles
from flatcollate.profiles.pair_profile import load_pair_profile, split_pair

STATS_KEY = {"flan": "t0", "gsm8k": "gsm8k", "code_alpaca": "code_alpaca", "hh_rlhf": "hh"}


def test_named_profiles_ship_with_the_package():
    assert available_profiles() == sorted(SOURCES)
    for name in available_profiles():
        profile = load_profile(name)
        assert profile.name == name
        assert profile.num_rows > 1000


@pytest.mark.parametrize("name", ["flan", "gsm8k", "code_alpaca", "hh_rlhf"])
def test_sampled_fill_matches_the_real_dataset(shared_data, name):
    expected = json.loads((shared_data / "length_stats.json").read_text())["stats"][STATS_KEY[name]]["raw"]
    prompt, completion = load_profile(name).sample(8 * 2000, seed=3)
    assert padded_fill(prompt + completion, batch_size=8) == pytest.approx(expected["fill_bs8"], abs=0.02)
    assert np.mean(prompt + completion) == pytest.approx(expected["mean"], rel=0.05)
    assert np.median(prompt + completion) == pytest.approx(expected["median"], rel=0.1)


def test_committed_profiles_are_what_the_script_writes(shared_data, tmp_path):
    for path in make_profiles(shared_data, tmp_path):
        assert json.loads(path.read_text()) == load_profile(path.stem).to_dict()


def test_padded_batches_and_padded_fill_against_a_per_batch_loop():
    rng = np.random.default_rng(0)
    for size in (1, 7, 8, 9, 100):
        lengths = rng.integers(1, 50, size=size)
        real, padded = [], []
        for start in range(0, size, 8):
            batch = lengths[start : start + 8]
            real.append(batch.sum())
            padded.append(len(batch) * batch.max())
        got_real, got_padded = padded_batches(lengths, batch_size=8)
        assert got_real.tolist() == real and got_padded.tolist() == padded
        assert padded_fill(lengths, batch_size=8) == pytest.approx(sum(real) / sum(padded))
    assert padded_fill([5] * 8, batch_size=8) == 1.0
    with pytest.raises(ValueError, match="batch_size >= 1 and at least one row"):
        padded_batches([], batch_size=8)


def test_sample_is_seeded_and_inside_the_histogram():
    profile = LengthProfile.from_lengths([1, 1, 300, 1000], [0, 5, 20, 2], name="toy")
    a = profile.sample(500, seed=1)
    b = profile.sample(500, seed=1)
    np.testing.assert_array_equal(a[0], b[0])
    assert (a[0] + a[1] >= 1).all()
    assert a[0].max() <= 1000 and a[1].max() <= 20
    # Exact one-token bins below 10: a length-1 prompt is drawn as exactly 1.
    assert set(np.unique(a[0][a[0] < 10]).tolist()) == {1}


def test_user_length_files(tmp_path):
    pairs = tmp_path / "pairs.json"
    pairs.write_text(json.dumps({"rows": [[3, 4], [10, 1]]}))
    assert load_profile(pairs).num_rows == 2
    totals = tmp_path / "totals.txt"
    totals.write_text("3\n9\n\n7\n")
    prompt, completion = load_profile(totals).sample(50, seed=0)
    assert (prompt == 0).all() and set(completion.tolist()) == {3, 7, 9}
    saved = tmp_path / "saved.json"
    load_profile("gsm8k").save(saved)
    assert load_profile(saved).to_dict() == load_profile("gsm8k").to_dict()


def test_user_tokenized_dataset(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = {
        "input_ids": [[1, 2, 3, 4], [5, 6], [7]],
        "labels": [[-100, -100, 3, 4], [-100, 6], [7]],
    }
    datasets.Dataset.from_dict(rows).save_to_disk(str(tmp_path / "ds"))
    profile = load_profile(tmp_path / "ds")
    prompt, completion = profile.sample(200, seed=0)
    pairs = set(zip(prompt.tolist(), completion.tolist(), strict=True))
    assert pairs == {(2, 2), (1, 1), (0, 1)}


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("not json", "not valid JSON"),
        ('{"other": 1}', "without `rows` or `cells`"),
        ('{"rows": [[1, 2], [3]]}', "all be a number or all a pair"),
        ('{"rows": [[1, 2.5]]}', "row 0 holds"),
        ('{"rows": [[1, 2], [0, 0]]}', "Row 1 .* has no tokens"),
        ('{"rows": [[1, -2]]}', "row 0 is -2"),
        (
            '{"format": "flatcollate.length_profile/1", "name": "x", "prompt_edges": [0, 0], '
            '"completion_edges": [0, 1], "cells": [[0, 0]], "counts": [1]}',
            "corrupt",
        ),
    ],
)
def test_bad_length_files(tmp_path, content, match):
    path = tmp_path / "lengths.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=match):
        load_profile(path)


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("train.jsonl", b'{"question": "2 + 2?", "answer": "4"}\n{"question": "3 + 3?", "answer": "6"}\n'),
        ("alpaca.json", b'[{"instruction": "Add.", "input": "2 2", "output": "4"}]'),
        ("words.txt", b"two words\nand three words\n"),
        ("rows.jsonl.gz", b"\x1f\x8b\x08\x00\xff\xfe binary"),
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_a_dataset_file_is_refused_saying_what_a_profile_is_and_how_to_make_one(tmp_path, name, content):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(ValueError) as error:
        load_profile(path)
    message = str(error.value)
    assert "\n" not in message and name in message and "is not a length profile" in message
    assert "save_to_disk" in message and "prompt completion" in message and "make_supervised_dataset" in message
    assert "array" not in message and "codec" not in message


def test_bad_names_and_datasets(tmp_path):
    with pytest.raises(ValueError, match=r"Unknown length profile 'flan2'.*flan, gsm8k"):
        load_profile("flan2")
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"input_ids": [[1, 2]]}).save_to_disk(str(tmp_path / "ds"))
    with pytest.raises(ValueError, match=r"lacks the column\(s\) \['labels'\]"):
        load_profile(tmp_path / "ds")
    with pytest.raises(ValueError, match="`n` must be a non-negative int"):
        load_profile("flan").sample(-1)


# ---- the pair profile of the preference tasks ------------------------------------------------------------------------


def test_the_hh_rlhf_pair_profile_ships_apart_from_the_sft_profiles():
    assert available_pair_profiles() == ["hh_rlhf"]
    assert "pairs" not in available_profiles()
    profile = load_pair_profile("hh_rlhf")
    assert profile.num_rows == 2307 and "qwen2.5-instruct" in profile.source and "2312 pairs" in profile.source
    assert profile.prompt.dtype == np.int64 and (profile.prompt > 0).all()
    assert (profile.chosen >= 0).all() and (profile.rejected >= 0).all()


def test_the_committed_pair_profile_is_what_the_script_writes(shared_data, tmp_path):
    (path,) = make_pair_profiles(shared_data, tmp_path)
    assert json.loads(path.read_text()) == load_pair_profile("hh_rlhf").to_dict()


def test_pair_lengths_against_a_per_pair_loop(shared_data, tokenizer_dir):
    """The first 40 usable pairs, split and tokenized one at a time, give the profile's first 40 rows."""
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir("qwen2.5-instruct"))
    expected = []
    with gzip.open(shared_data / "datasets" / "hh_rlhf_harmless_base_test.jsonl.gz", "rt") as lines:
        for line in lines:
            row = json.loads(line)
            head, _, chosen = row["chosen"].rpartition("\n\nAssistant:")
            other, _, rejected = row["rejected"].rpartition("\n\nAssistant:")
            if head != other:
                continue
            texts = (head + "\n\nAssistant:", chosen, rejected)
            expected.append([len(tokenizer(text, add_special_tokens=False)["input_ids"]) for text in texts])
            if len(expected) == 40:
                break
    profile = load_pair_profile("hh_rlhf")
    got = np.stack([profile.prompt, profile.chosen, profile.rejected], axis=1)[:40]
    assert got.tolist() == expected


def test_split_pair_needs_a_shared_head():
    assert split_pair("\n\nHuman: a\n\nAssistant: b", "\n\nHuman: a\n\nAssistant: c") == (
        "\n\nHuman: a\n\nAssistant:",
        " b",
        " c",
    )
    assert split_pair("\n\nHuman: a\n\nAssistant: b", "\n\nHuman: x\n\nAssistant: c") is None
    assert split_pair("\n\nHuman: a", "\n\nHuman: a\n\nAssistant: c") is None


def test_pair_profile_files_load_and_bad_ones_say_what_a_pair_profile_is(tmp_path):
    profile = load_pair_profile("hh_rlhf")
    profile.save(tmp_path / "mine.json")
    assert load_pair_profile(tmp_path / "mine.json").to_dict() == profile.to_dict()
    (tmp_path / "rows.json").write_text('{"rows": [[1, 2]]}')
    for bad in ("flan", tmp_path / "rows.json", tmp_path / "missing.json"):
        with pytest.raises(ValueError, match="pair profile"):
            load_pair_profile(bad)
