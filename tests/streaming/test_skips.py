"""Rows `encode_fn` skips: left out of every pack, counted by reason, logged, and carried through an exact resume."""

import copy
import io
import itertools
import json
import logging

import numpy as np
import pytest
import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from flatcollate import DataCollatorWithFlattening
from flatcollate.data import SkippedRow
from flatcollate.streaming import StreamingPacker, StreamStats, interleave

pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")

LOGGER = "flatcollate.streaming"


def make_rows(n, *, seed=0):
    """Row i holds tokens equal to its index; a `skip` field names the reason it must be skipped, or is empty."""
    rng = np.random.default_rng(seed)
    reasons = rng.choice(["", "", "", "", "too_short", "no_assistant"], size=n)
    lengths = rng.integers(1, 20, size=n)
    return [{"input_ids": [i] * int(k), "skip": str(r)} for i, (k, r) in enumerate(zip(lengths, reasons, strict=True))]


def encode(row):
    """A plain callable in the style of `build_encoder(..., on_error="skip")`."""
    if row["skip"]:
        return SkippedRow(None, row["skip"], f"example: refused ({row['skip']})")
    return {"input_ids": row["input_ids"]}


def expected_counts(rows):
    counts = {}
    for row in rows:
        if row["skip"]:
            counts[row["skip"]] = counts.get(row["skip"], 0) + 1
    return counts


def packed_rows(packs):
    """Row indices of every sequence in the packs (each sequence's tokens all equal its row index)."""
    out = []
    for pack in packs:
        ids = pack["input_ids"].tolist()
        cuts = np.cumsum([0, *pack["seq_lengths"]])
        for start, end in itertools.pairwise(cuts):
            assert len(set(ids[start:end])) == 1
            out.append(ids[start])
    return out


def test_skipped_rows_are_left_out_and_counted_by_reason():
    rows = make_rows(80)
    packer = StreamingPacker(rows, pack_len=24, encode_fn=encode, buffer_size=4)
    packs = list(packer)
    kept = [i for i, row in enumerate(rows) if not row["skip"]]
    assert sorted(packed_rows(packs)) == kept
    stats = packer.stats()
    assert isinstance(stats, StreamStats)
    assert stats.num_rows == 80 and stats.num_encoded == len(kept)
    assert stats.skipped == expected_counts(rows) and set(stats.skipped) == {"too_short", "no_assistant"}
    for reason in stats.skipped:
        rows_with_reason = [f"row {i}" for i, row in enumerate(rows) if row["skip"] == reason]
        assert stats.first_skipped[reason] == rows_with_reason[:5]
        assert stats.first_messages[reason] == f"example: refused ({reason})"
    text = str(stats)
    assert text.startswith(f"encoded {len(kept)} of 80 rows")
    assert f"skipped {stats.skipped['too_short']} (too_short): rows row " in text


def test_no_skips_reports_zero():
    rows = [{"input_ids": [1, 2]}, {"input_ids": [3]}]
    packer = StreamingPacker(rows, pack_len=8)
    assert packer.stats() == StreamStats(num_rows=0, num_encoded=0)
    list(packer)
    assert packer.stats() == StreamStats(num_rows=2, num_encoded=2)


def test_first_skip_of_each_reason_is_logged_with_origin_and_message(caplog):
    rows = make_rows(60)
    caplog.set_level(logging.WARNING, logger=LOGGER)
    list(StreamingPacker(rows, pack_len=24, encode_fn=encode, buffer_size=4))
    messages = [record.getMessage() for record in caplog.records if record.name.startswith(LOGGER)]
    for reason in ("too_short", "no_assistant"):
        first = next(i for i, row in enumerate(rows) if row["skip"] == reason)
        per_row = [m for m in messages if f"({reason})" in m and "refused" in m and m.startswith("row ")]
        assert len(per_row) == 1, messages  # once per reason, not once per row
        assert per_row[0].startswith(f"row {first}: ") and f"example: refused ({reason})" in per_row[0]
    summary = [m for m in messages if "skipped" in m and "of 60 rows" in m]
    assert len(summary) == 1, messages  # a reader that skipped rows sums them up at the end of its pass


def test_interleaved_skip_names_the_source_row():
    good = [{"input_ids": [1], "skip": ""}] * 10
    bad = [{"input_ids": [2], "skip": "no_assistant"}] * 10
    packer = StreamingPacker(interleave([good, bad], [0.5, 0.5], seed=0), pack_len=8, encode_fn=encode)
    list(packer)
    assert packer.stats().first_skipped["no_assistant"][0].startswith("source 1 row 0 (stream row ")


@pytest.mark.parametrize(
    ("encode_fn", "row", "error", "message"),
    [
        (lambda row: [1, 2], {"input_ids": [1]}, TypeError, r"row 1: `encode_fn` must return a mapping"),
        (lambda row: None, {"input_ids": [1]}, TypeError, r"row 1: `encode_fn` must return a mapping"),
        (lambda row: {"input_ids": []}, {"input_ids": [1]}, ValueError, r"row 1: field `input_ids` is empty"),
        (lambda row: SkippedRow(None, "", "x"), {"input_ids": [1]}, TypeError, r"row 1: .*`reason`"),
        (lambda row: SkippedRow(None, 3, "x"), {"input_ids": [1]}, TypeError, r"row 1: .*`reason`"),
        (None, SkippedRow(None, "wrong_type", "x"), TypeError, r"row 1: expected a mapping"),
    ],
)
def test_rows_the_packer_finds_bad_still_raise(encode_fn, row, error, message):
    rows = [{"input_ids": [5, 6], "good": True}, row]
    wrapped = None if encode_fn is None else (lambda r: r if r.get("good") else encode_fn(r))
    packer = StreamingPacker(rows, pack_len=8, encode_fn=wrapped)
    with pytest.raises(error, match=message):
        list(packer)
    assert packer.stats().skipped == {}


def test_overlong_row_still_raises_after_skips():
    rows = [{"input_ids": [1], "skip": "no_assistant"}, {"input_ids": list(range(20)), "skip": ""}]
    with pytest.raises(ValueError, match=r"row 1: sequence of 20 tokens is longer than pack_len=8"):
        list(StreamingPacker(rows, pack_len=8, encode_fn=encode))


def save_and_load(state):
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def make_loader(rows, *, num_workers):
    packer = StreamingPacker(rows, pack_len=24, encode_fn=encode, buffer_size=5)
    return StatefulDataLoader(packer, batch_size=2, num_workers=num_workers, collate_fn=DataCollatorWithFlattening())


def as_lists(batches):
    return [{key: value.tolist() if torch.is_tensor(value) else value for key, value in b.items()} for b in batches]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_mid_stream_gives_same_packs_and_counts(num_workers):
    rows = make_rows(90, seed=1)
    loader = make_loader(rows, num_workers=num_workers)
    full = as_lists(loader)
    final = StreamStats.from_state(loader.state_dict())
    assert final.skipped == expected_counts(rows) and final.num_rows == 90
    assert final.num_encoded == sum(not row["skip"] for row in rows)
    assert len(full) >= 6
    for stop in (1, 3, len(full) // 2):
        first = make_loader(rows, num_workers=num_workers)
        head = as_lists(itertools.islice(first, stop))
        state = save_and_load(first.state_dict())
        partial = StreamStats.from_state(state)
        assert 0 < partial.num_rows < 90 and sum(partial.skipped.values()) <= sum(final.skipped.values())
        resumed = make_loader(rows, num_workers=num_workers)
        resumed.load_state_dict(state)
        assert head + as_lists(resumed) == full, f"stopped after {stop} batches"
        assert StreamStats.from_state(resumed.state_dict()) == final, f"stopped after {stop} batches"


def test_packer_resume_keeps_counts_and_does_not_warn_again(caplog):
    rows = make_rows(80, seed=2)
    full = StreamingPacker(rows, pack_len=24, encode_fn=encode, buffer_size=4)
    full_packs = [p["input_ids"].tolist() for p in full]
    first = StreamingPacker(rows, pack_len=24, encode_fn=encode, buffer_size=4)
    iterator = iter(first)
    head = [next(iterator)["input_ids"].tolist() for _ in range(len(full_packs) // 2)]
    state = save_and_load(first.state_dict())
    seen = set(state["skipped"]["counts"])
    assert seen  # the first half skipped something, so the counts travel in the state
    resumed = StreamingPacker(rows, pack_len=24, encode_fn=encode, buffer_size=4)
    resumed.load_state_dict(state)
    assert resumed.stats() == StreamStats.from_state(state)  # before the first item is drawn
    caplog.set_level(logging.WARNING, logger=LOGGER)
    caplog.clear()
    assert head + [p["input_ids"].tolist() for p in resumed] == full_packs
    assert resumed.stats() == full.stats()
    warned = [r.getMessage() for r in caplog.records if r.getMessage().startswith("row ")]
    assert not any(f"({reason})" in m for reason in seen for m in warned)


def skipping_state():
    rows = make_rows(60, seed=3)
    packer = StreamingPacker(rows, pack_len=24, encode_fn=encode, buffer_size=4, rank=0, world_size=2)
    iterator = iter(packer)
    for _ in range(4):
        next(iterator)
    state = save_and_load(packer.state_dict())
    assert state["skipped"]["counts"]
    return rows, state


def _set(path, value):
    def corrupt(state):
        target = state
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value(target[path[-1]]) if callable(value) else value

    return corrupt


def _first_reason(state):
    return next(iter(state["skipped"]["counts"]))


@pytest.mark.parametrize(
    ("corrupt", "message"),
    [
        (lambda s: s.pop("skipped"), r"the state has no `skipped`"),
        (_set(("skipped",), [1, 2]), r"`skipped`: expected a dict"),
        (lambda s: s["skipped"].pop("first_rows"), r"`skipped`: no `first_rows`"),
        (lambda s: s["skipped"]["counts"].update({_first_reason(s): -1}), r"`skipped`: .* count"),
        (lambda s: s["skipped"]["counts"].update({_first_reason(s): 1.5}), r"`skipped`: .* count"),
        (lambda s: s["skipped"]["counts"].update({_first_reason(s): 10_000}), r"`skipped`: .*more .* than"),
        (lambda s: s["skipped"]["counts"].update({7: 1}), r"`skipped`: .*reason"),
        (lambda s: s["skipped"]["first_rows"].update({_first_reason(s): []}), r"`skipped`: .*first_rows"),
        (lambda s: s["skipped"]["first_messages"].clear(), r"`skipped`: .*first_messages"),
    ],
)
def test_corrupted_skip_counts_are_refused(corrupt, message):
    rows, state = skipping_state()
    broken = copy.deepcopy(state)
    corrupt(broken)
    packer = StreamingPacker(rows, pack_len=24, encode_fn=encode, buffer_size=4, rank=0, world_size=2)
    with pytest.raises(ValueError, match=rf"Cannot resume: {message}"):
        packer.load_state_dict(broken)


def test_state_of_version_2_resumes_with_zero_skips():
    """A state saved before skipped rows were counted: no skip was possible then, so its counts are zero."""
    rows = [{"input_ids": [i] * (1 + i % 7)} for i in range(40)]
    full = [p["input_ids"].tolist() for p in StreamingPacker(rows, pack_len=16, buffer_size=4)]
    packer = StreamingPacker(rows, pack_len=16, buffer_size=4)
    iterator = iter(packer)
    head = [next(iterator)["input_ids"].tolist() for _ in range(3)]
    state = packer.state_dict()
    old = {key: value for key, value in state.items() if key != "skipped"}
    # Version 2 had neither skip counts nor a sharding mode.
    old["config"] = {**{k: v for k, v in state["config"].items() if k != "sharding"}, "version": 2}
    resumed = StreamingPacker(rows, pack_len=16, buffer_size=4)
    resumed.load_state_dict(old)
    assert head + [p["input_ids"].tolist() for p in resumed] == full
    assert resumed.stats().skipped == {} and resumed.stats().num_rows == 40


def test_stats_merge_sums_readers():
    rows = make_rows(50, seed=4)
    parts = []
    for rank in range(2):
        packer = StreamingPacker(rows, pack_len=24, encode_fn=encode, buffer_size=4, rank=rank, world_size=2)
        list(packer)
        parts.append(packer.stats())
    total = StreamStats.merge(parts)
    assert total.num_rows == 50 and total.skipped == expected_counts(rows)
    assert total.num_encoded == sum(not row["skip"] for row in rows)


@pytest.fixture(scope="module")
def conversations(shared_data):
    """Real conversations; every third one cut after a user turn, so it ends without a reply."""
    with open(shared_data / "datasets" / "hh_rlhf_harmless_base_test_messages.jsonl") as handle:
        rows = [json.loads(line) for line in itertools.islice(handle, 45)]
    for row in rows[::3]:
        last_user = max(i for i, message in enumerate(row["messages"]) if message["role"] == "user")
        row["messages"] = row["messages"][: last_user + 1]
    return rows


def test_build_encoder_skips_conversations_without_a_final_reply(conversations, tokenizer_dir, caplog):
    transformers = pytest.importorskip("transformers")
    from flatcollate.data import build_encoder

    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_dir("qwen2.5-instruct"))
    encoder = build_encoder(tokenizer, format="messages", on_error="skip")
    caplog.set_level(logging.WARNING, logger=LOGGER)
    packer = StreamingPacker(conversations, pack_len=2048, encode_fn=encoder, buffer_size=8, return_example_ids=True)
    packs = list(packer)
    pieces = {}
    for pack in packs:
        cuts = np.cumsum(pack["seq_lengths"])[:-1]
        for example_id, ids in zip(pack["example_ids"], np.split(pack["input_ids"].numpy(), cuts), strict=True):
            pieces[example_id] = ids.tolist()
    assert set(pieces) == set(range(45)) - set(range(0, 45, 3))
    assert all(pieces[i] == encoder(conversations[i])["input_ids"] for i in pieces)
    # A cut conversation that still holds a reply ends without one; a cut single-turn one has no reply at all.
    has_reply = {i: any(m["role"] == "assistant" for m in conversations[i]["messages"]) for i in range(0, 45, 3)}
    reasons = {i: "ends_without_reply" if reply else "no_assistant" for i, reply in has_reply.items()}
    stats = packer.stats()
    assert stats.num_rows == 45 and stats.num_encoded == 30
    assert stats.skipped == {reason: list(reasons.values()).count(reason) for reason in set(reasons.values())}
    assert stats.skipped["ends_without_reply"] > 0
    for reason in stats.skipped:
        rows = [i for i, r in reasons.items() if r == reason]
        assert stats.first_skipped[reason] == [f"row {i}" for i in rows[:5]]
        warned = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"row {rows[0]}: skipped")]
        assert len(warned) == 1 and f"({reason}): example: field 'messages'" in warned[0]
