"""`pack_dataset` / `PackedDataset`: every sequence lands in exactly one packed row, unchanged, with its length."""

import itertools

import datasets
import numpy as np
import pytest

from flatcollate.data.dataset import PackedDataset, pack_dataset


def make_rows(lengths, seed=0):
    rng = np.random.default_rng(seed)
    ids = [rng.integers(0, 1000, n).tolist() for n in lengths]
    labels = [[-100 if t % 3 == 0 else t for t in row] for row in ids]
    return datasets.Dataset.from_dict({"input_ids": ids, "labels": labels, "id": list(range(len(lengths)))})


def unpack(packed):
    """Slow reference: split every packed row by its `seq_lengths` into (input_ids, labels) tuples."""
    out = []
    for row in packed:
        assert sum(row["seq_lengths"]) == len(row["input_ids"]) == len(row["labels"])
        cut = np.cumsum([0, *row["seq_lengths"]])
        for a, b in itertools.pairwise(cut):
            out.append((tuple(row["input_ids"][a:b]), tuple(row["labels"][a:b])))
    return out


@pytest.mark.parametrize("strategy", ["bfd", "first_fit", "next_fit"])
@pytest.mark.parametrize("seed", range(4))
def test_every_sequence_once_and_unchanged(strategy, seed):
    pack_len = [16, 33, 64, 7][seed]
    lengths = np.random.default_rng(seed).integers(1, pack_len + 1, 60 + seed * 13)
    ds = make_rows(lengths, seed)
    packed, stats = pack_dataset(ds, pack_len, strategy=strategy, shuffle_seed=seed, return_stats=True)
    assert set(packed.column_names) == {"input_ids", "labels", "seq_lengths"}
    assert max(len(r) for r in packed["input_ids"]) <= pack_len
    expected = [(tuple(r["input_ids"]), tuple(r["labels"])) for r in ds]
    assert sorted(unpack(packed)) == sorted(expected)
    assert stats.num_packs == len(packed) and stats.num_sequences == len(ds)
    assert stats.num_tokens == lengths.sum()
    assert stats.fill == pytest.approx(lengths.sum() / (len(packed) * pack_len))
    assert stats.dropped_columns == ("id",)
    assert stats.padding_saved == (len(ds) - len(packed)) * pack_len


@pytest.mark.parametrize(
    ("name", "lengths", "pack_len"),
    [
        ("one sequence", [5], 8),
        ("length 1", [1, 1, 1], 1),
        ("exactly the limit", [8, 8], 8),
        ("many tiny", [1] * 50, 7),
    ],
)
def test_edge_cases(name, lengths, pack_len):
    ds = make_rows(lengths)
    packed = pack_dataset(ds, pack_len)
    assert sorted(unpack(packed)) == sorted((tuple(r["input_ids"]), tuple(r["labels"])) for r in ds), name
    assert len(packed) == -(-sum(lengths) // pack_len)


def test_respects_indices_mapping_of_shuffled_and_selected_datasets():
    ds = make_rows(np.arange(1, 30)).shuffle(seed=3).select(range(0, 29, 2))
    packed = pack_dataset(ds, 32)
    assert sorted(unpack(packed)) == sorted((tuple(r["input_ids"]), tuple(r["labels"])) for r in ds)


def test_overlong_error_names_row_and_fix():
    match = r"sequence 1 is 12 tokens > pack_len 8 \(1 sequences are over-long\); pass overlong='split'"
    with pytest.raises(ValueError, match=match):
        pack_dataset(make_rows([3, 12, 4]), 8)


def test_overlong_truncate_keeps_first_tokens_and_counts_them():
    ds = make_rows([3, 12, 4])
    packed, stats = pack_dataset(ds, 8, overlong="truncate", return_stats=True)
    expected = [(tuple(r["input_ids"][:8]), tuple(r["labels"][:8])) for r in ds]
    assert sorted(unpack(packed)) == sorted(expected)
    assert (stats.num_overlong, stats.num_truncated_tokens, stats.num_split_pieces) == (1, 4, 0)


def test_overlong_split_keeps_every_token_in_order():
    ds = make_rows([3, 20, 4])
    packed, stats = pack_dataset(ds, 8, overlong="split", return_stats=True)
    long = ds[1]
    pieces = [(tuple(long["input_ids"][a : a + 8]), tuple(long["labels"][a : a + 8])) for a in (0, 8, 16)]
    expected = [(tuple(ds[i]["input_ids"]), tuple(ds[i]["labels"])) for i in (0, 2)] + pieces
    assert sorted(unpack(packed)) == sorted(expected)
    assert (stats.num_overlong, stats.num_split_pieces, stats.num_truncated_tokens) == (1, 2, 0)


def test_misaligned_labels_name_row_and_field():
    ds = datasets.Dataset.from_dict({"input_ids": [[1, 2], [3, 4, 5]], "labels": [[1, 2], [3, 4]]})
    with pytest.raises(ValueError, match=r"row 1: field 'labels' has 2 values but 'input_ids' has 3 tokens"):
        pack_dataset(ds, 8)


def test_missing_input_ids_and_repacking_raise():
    with pytest.raises(ValueError, match="no 'input_ids' column"):
        pack_dataset(datasets.Dataset.from_dict({"text": ["a"]}), 8)
    with pytest.raises(ValueError, match="already packed"):
        pack_dataset(pack_dataset(make_rows([2, 3]), 8), 8)


def test_packed_dataset_dart_signature_and_stat(capsys):
    ds = make_rows([5, 3, 8, 2, 6])
    packed = PackedDataset(ds, None, 8, 0)
    stats = packed.stat()
    assert "5 sequences (24 tokens) -> 3 packs" in capsys.readouterr().out
    assert len(packed) == stats.num_packs == 3
    assert sorted(len(packed[i]["input_ids"]) for i in range(len(packed))) == [8, 8, 8]


def test_packed_rows_flatten_with_restarting_positions():
    from flatcollate import DataCollatorWithFlattening

    packed = pack_dataset(make_rows([5, 3, 8, 2, 6]), 8)
    batch = DataCollatorWithFlattening()([packed[i] for i in range(len(packed))])
    lengths = [n for row in packed["seq_lengths"] for n in row]
    assert batch["cu_seq_lens_q"].tolist() == np.cumsum([0, *lengths]).tolist()
    assert batch["position_ids"][0].tolist() == [p for n in lengths for p in range(n)]
