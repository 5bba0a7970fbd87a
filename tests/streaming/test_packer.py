"""StreamingPacker: packs keep every sequence intact, sharding loses and duplicates nothing, bad rows fail loudly."""

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from flatcollate import DataCollatorWithFlattening
from flatcollate.streaming import StreamingPacker, interleave


def make_rows(lengths, *, offset=0):
    """Row i holds tokens that encode its own index, so any mix-up is visible."""
    return [{"input_ids": [offset + i] * n, "labels": list(range(n))} for i, n in enumerate(lengths)]


def unpack(packs):
    """(row index, tokens, labels) of every sequence, split back by `seq_lengths`."""
    out = []
    for pack in packs:
        assert pack["input_ids"].dtype == torch.int64 and pack["labels"].dtype == torch.int64
        assert sum(pack["seq_lengths"]) == pack["input_ids"].numel() == pack["labels"].numel()
        cuts = np.cumsum(pack["seq_lengths"])[:-1]
        pieces = zip(np.split(pack["input_ids"].numpy(), cuts), np.split(pack["labels"].numpy(), cuts), strict=True)
        for ids, labels in pieces:
            out.append((int(ids[0]), ids.tolist(), labels.tolist()))
    return out


@pytest.mark.parametrize("strategy", ["greedy", "best_fit"])
def test_every_sequence_arrives_intact_within_pack_len(strategy):
    lengths = [*np.random.default_rng(0).integers(1, 33, size=120).tolist(), 32, 1]
    packs = list(StreamingPacker(make_rows(lengths), pack_len=32, buffer_size=10, strategy=strategy))
    assert all(p["input_ids"].numel() <= 32 for p in packs)
    assert set(packs[0]) == {"input_ids", "labels", "position_ids", "seq_lengths"}
    seen = sorted(unpack(packs))
    assert seen == [(i, [i] * n, list(range(n))) for i, n in enumerate(lengths)]


def test_labels_default_to_input_ids_and_encode_fn_is_applied():
    rows = [{"text": "ab"}, {"text": "xyz"}]
    packer = StreamingPacker(rows, pack_len=8, encode_fn=lambda r: {"input_ids": [ord(c) for c in r["text"]]})
    (pack,) = list(packer)
    assert pack["input_ids"].tolist() == [97, 98, 120, 121, 122]
    assert pack["labels"].tolist() == pack["input_ids"].tolist()
    assert pack["seq_lengths"] == [2, 3]


def test_overlong_split_truncate_and_error():
    rows = [{"input_ids": list(range(10))}, {"input_ids": [7]}]
    split = list(StreamingPacker(rows, pack_len=4, overlong="split", return_example_ids=True))
    assert [p["input_ids"].tolist() for p in split] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 7]]
    assert split[-1]["example_ids"] == [0, 1] and split[-1]["seq_lengths"] == [2, 1]
    truncated = list(StreamingPacker(rows, pack_len=4, overlong="truncate"))
    assert [p["input_ids"].tolist() for p in truncated] == [[0, 1, 2, 3], [7]]
    with pytest.raises(ValueError, match=r"row 0: sequence of 10 tokens is longer than pack_len=4.*overlong='split'"):
        list(StreamingPacker(rows, pack_len=4))


@pytest.mark.parametrize(
    ("row", "error", "message"),
    [
        ({"text": "hi"}, ValueError, r"row 2: field `input_ids` is missing"),
        ({"input_ids": []}, ValueError, r"row 2: field `input_ids` is empty"),
        ({"input_ids": [1, 2], "labels": [1]}, ValueError, r"row 2: field `labels` has 1 entries but"),
        ({"input_ids": [1.5, 2.0]}, TypeError, r"row 2: field `input_ids` must hold ints, got dtype float64"),
        ({"input_ids": [[1], [2]]}, TypeError, r"row 2: field `input_ids` must be 1-D"),
        ({"input_ids": [1, -3]}, ValueError, r"row 2: field `input_ids` holds a negative id \(-3\)"),
        ("not a dict", TypeError, r"row 2: expected a mapping"),
    ],
)
def test_malformed_rows_name_row_and_field(row, error, message):
    rows = [*make_rows([2, 3]), row]
    with pytest.raises(error, match=message):
        list(StreamingPacker(rows, pack_len=8))


def test_malformed_row_in_interleaved_source_names_source_and_row():
    good, bad = make_rows([2] * 20), [{"input_ids": [1]}] * 3 + [{"ids": [1]}]
    with pytest.raises(ValueError, match=r"source 1 row 3 \(stream row \d+\): field `input_ids` is missing"):
        list(StreamingPacker(interleave([good, bad], [0.5, 0.5], seed=0), pack_len=8))


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_ranks_and_workers_share_rows_without_loss_or_duplication(world_size, num_workers):
    lengths = np.random.default_rng(world_size).integers(1, 17, size=47).tolist()  # 47 divides by neither
    rows = make_rows(lengths)
    seen = []
    for rank in range(world_size):
        packer = StreamingPacker(rows, pack_len=16, buffer_size=4, rank=rank, world_size=world_size)
        loader = DataLoader(packer, batch_size=None, num_workers=num_workers)
        mine = [index for index, _, _ in unpack(loader)]
        readers = world_size * max(num_workers, 1)
        assert {index % readers for index in mine} <= {rank * max(num_workers, 1) + w for w in range(readers)}
        seen += mine
    assert sorted(seen) == list(range(len(rows)))


def test_datasets_sources_map_style_and_iterable():
    datasets = pytest.importorskip("datasets")
    lengths = [3, 5, 2, 7, 1, 4, 6]
    table = datasets.Dataset.from_list(make_rows(lengths))
    for source in (table, table.to_iterable_dataset(num_shards=3)):
        packs = list(StreamingPacker(source, pack_len=8, buffer_size=3))
        assert sorted(unpack(packs)) == [(i, [i] * n, list(range(n))) for i, n in enumerate(lengths)]


def test_interleave_proportions_within_tolerance():
    sources = [make_rows([1] * 4000, offset=offset) for offset in (0, 10_000, 20_000)]
    mixed = interleave(sources, [0.6, 0.3, 0.1], seed=3)
    counts = np.bincount([row["input_ids"][0] // 10_000 for row in mixed], minlength=3)
    # Stops when the first source runs out (first_exhausted), so the 0.6 source is drained.
    assert counts[0] == 4000
    np.testing.assert_allclose(counts / counts.sum(), [0.6, 0.3, 0.1], atol=0.02)
    assert [row["input_ids"] for row in interleave(sources, [0.6, 0.3, 0.1], seed=3)][:50] == [
        row["input_ids"] for row in list(mixed)[:50]
    ]


def test_interleave_and_constructor_validation():
    with pytest.raises(ValueError, match="2 sources but 1 probabilities"):
        interleave([[], []], [1.0], seed=0)
    with pytest.raises(ValueError, match="non-negative"):
        interleave([[], []], [1.0, -1.0], seed=0)
    with pytest.raises(ValueError, match="`strategy` must be one of"):
        StreamingPacker([], pack_len=8, strategy="first_fit")
    with pytest.raises(ValueError, match=r"`rank` must be in \[0, 2\), got 2"):
        StreamingPacker([], pack_len=8, rank=2, world_size=2)
    with pytest.raises(TypeError, match="one-shot iterator"):
        StreamingPacker(iter([]), pack_len=8)


def test_packs_carry_restarting_position_ids():
    rows = make_rows([3, 2, 4, 1])
    for pack in StreamingPacker(rows, pack_len=8, buffer_size=4):
        assert pack["position_ids"].dtype == torch.int64 and pack["position_ids"].shape == pack["input_ids"].shape
        expected = [position for length in pack["seq_lengths"] for position in range(length)]  # per-sequence reference
        assert pack["position_ids"].tolist() == expected
    (first, *_) = StreamingPacker(make_rows([3, 2]), pack_len=8)
    assert first["position_ids"].tolist() == [0, 1, 2, 0, 1]


def test_boundaries_survive_when_seq_lengths_is_removed():
    """`Trainer(remove_unused_columns=True)` drops `seq_lengths`; the restarting `position_ids` keep the boundaries."""
    lengths = np.random.default_rng(4).integers(1, 12, size=40).tolist()
    packs = list(StreamingPacker(make_rows(lengths), pack_len=16, buffer_size=6))
    collator = DataCollatorWithFlattening()
    with_lengths = collator(packs)
    without = collator([{k: v for k, v in pack.items() if k != "seq_lengths"} for pack in packs])
    assert sorted(np.diff(with_lengths["cu_seq_lens_q"].numpy()).tolist()) == sorted(lengths)
    for key in ("cu_seq_lens_q", "position_ids", "labels", "seq_idx"):
        torch.testing.assert_close(without[key], with_lengths[key])
