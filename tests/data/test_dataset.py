"""`pack_dataset` / `PackedDataset`: every sequence lands in exactly one packed row, unchanged, with its length."""

import itertools
import logging

import datasets
import numpy as np
import pytest
import torch
import transformers

from flatcollate import DataCollatorWithFlattening
from flatcollate.data import dart
from flatcollate.data.dataset import PackedDataset, pack_dataset


def make_rows(lengths, seed=0):
    rng = np.random.default_rng(seed)
    ids = [rng.integers(0, 1000, n).tolist() for n in lengths]
    labels = [[-100 if t % 3 == 0 else t for t in row] for row in ids]
    return datasets.Dataset.from_dict({"input_ids": ids, "labels": labels, "id": list(range(len(lengths)))})


def unpack(packed, columns=("input_ids", "labels")):
    """Slow reference: split every packed row by its `seq_lengths` into tuples of `columns`; positions restart."""
    out = []
    for row in packed:
        assert sum(row["seq_lengths"]) == len(row["input_ids"]) == len(row["labels"]) == len(row["position_ids"])
        cut = np.cumsum([0, *row["seq_lengths"]])
        for a, b in itertools.pairwise(cut):
            assert row["position_ids"][a:b] == list(range(b - a))
            out.append(tuple(tuple(row[name][a:b]) for name in columns))
    return out


@pytest.mark.parametrize("strategy", ["bfd", "first_fit", "next_fit"])
@pytest.mark.parametrize("seed", range(4))
def test_every_sequence_once_and_unchanged(strategy, seed):
    pack_len = [16, 33, 64, 7][seed]
    lengths = np.random.default_rng(seed).integers(1, pack_len + 1, 60 + seed * 13)
    ds = make_rows(lengths, seed)
    packed, stats = pack_dataset(ds, pack_len, strategy=strategy, shuffle_seed=seed, return_stats=True)
    assert packed.column_names == ["input_ids", "labels", "position_ids", "seq_lengths"]
    assert max(len(r) for r in packed["input_ids"]) <= pack_len
    expected = [(tuple(r["input_ids"]), tuple(r["labels"])) for r in ds]
    assert sorted(unpack(packed)) == sorted(expected)
    assert stats.num_packs == len(packed) and stats.num_sequences == len(ds)
    assert stats.num_tokens == lengths.sum()
    assert stats.fill == pytest.approx(lengths.sum() / (len(packed) * pack_len))
    assert stats.dropped_columns == ("id",)
    assert stats.padding_saved == stats.padding_tokens_unpacked - stats.padding_tokens_packed
    assert stats.padding_tokens_unpacked == padded_batch_padding(lengths, stats.padded_batch_size)
    row_tokens = [len(r) for r in packed["input_ids"]]
    assert (stats.min_pack_tokens, stats.max_pack_tokens) == (min(row_tokens), max(row_tokens))


def padded_batch_padding(lengths, batch_size: int) -> int:
    """Slow reference: padding of the sequences batched `batch_size` at a time in data order, each batch padded to its
    longest sequence."""
    batches = [lengths[i : i + batch_size] for i in range(0, len(lengths), batch_size)]
    return sum(len(batch) * max(batch) - sum(batch) for batch in batches)


@pytest.mark.parametrize(
    ("lengths", "pack_len", "batch_size", "unpacked", "packed"),
    [
        ([5, 2, 3, 6, 4], 8, 2, 6, 4),  # packs [2 6] [5 3] [4]; batches [5 2] [3 6] [4]: 3 + 3 padding tokens
        ([5], 8, 1, 0, 3),  # one sequence: its own batch has no padding, its pack 3
        ([1] * 50, 7, 6, 0, 6),  # many tiny: 8 packs, 6.25 sequences each
        ([8, 8], 8, 1, 0, 0),  # exactly the limit
    ],
)
def test_padding_saved_is_against_padded_batches_of_a_packs_size(lengths, pack_len, batch_size, unpacked, packed):
    """The baseline is what runs without packing: mini-batches of as many sequences as a pack holds on average, in
    data order, each padded to its longest; not every sequence padded to `pack_len`, which inflates the saving."""
    stats = pack_dataset(make_rows(lengths), pack_len, return_stats=True)[1]
    assert stats.padded_batch_size == batch_size == max(1, round(len(lengths) / stats.num_packs))
    assert stats.padding_tokens_unpacked == unpacked == padded_batch_padding(lengths, batch_size)
    assert (stats.padding_tokens_packed, stats.padding_saved) == (packed, unpacked - packed)
    baseline = f"{unpacked:,} in padded mini-batches of {batch_size} sequence{'s' * (batch_size > 1)}"
    assert baseline in str(stats) and "one sequence per row" not in str(stats)
    saving = f"{unpacked - packed:,} saved" if unpacked >= packed else f"{packed - unpacked:,} more when packed"
    assert str(stats).splitlines()[2].endswith(saving)


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


def test_labels_that_are_not_per_token_raise():
    ds = datasets.Dataset.from_dict({"input_ids": [[1, 2], [3]], "labels": [0, 1]})
    with pytest.raises(ValueError, match=r"field 'labels' must hold one value per token \(a list per row\), got int64"):
        pack_dataset(ds, 8)


def test_missing_input_ids_and_repacking_raise():
    with pytest.raises(ValueError, match="no 'input_ids' column"):
        pack_dataset(datasets.Dataset.from_dict({"text": ["a"]}), 8)
    with pytest.raises(ValueError, match="already packed"):
        pack_dataset(pack_dataset(make_rows([2, 3]), 8), 8)


def test_packed_dataset_dart_signature_and_stat(capsys):
    """DART-Math's signature is `PackedDataset`'s own; its `stat()` is in the compatibility module alone."""
    ds = make_rows([5, 3, 8, 2, 6])
    assert not hasattr(PackedDataset, "stat")
    packed = dart.PackedDataset(ds, None, 8, 0)
    stats = packed.stat()
    assert "5 sequences (24 tokens) -> 3 packs" in capsys.readouterr().out
    assert len(packed) == stats.num_packs == 3
    assert sorted(len(packed[i]["input_ids"]) for i in range(len(packed))) == [8, 8, 8]
    for i in range(len(packed)):
        assert packed[i]["position_ids"] == [p for n in packed[i]["seq_lengths"] for p in range(n)]


def test_packed_rows_flatten_with_restarting_positions():
    packed = pack_dataset(make_rows([5, 3, 8, 2, 6]), 8)
    batch = DataCollatorWithFlattening()([packed[i] for i in range(len(packed))])
    lengths = [n for row in packed["seq_lengths"] for n in row]
    assert batch["cu_seq_lens_q"].tolist() == np.cumsum([0, *lengths]).tolist()
    assert batch["position_ids"][0].tolist() == [p for n in lengths for p in range(n)]


def test_position_ids_restart_at_every_packed_sequence():
    ds = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3, 4], [5, 6, 7], [8, 9]]})
    packed = pack_dataset(ds, 9, strategy="next_fit")
    assert packed[0] == {
        "input_ids": [1, 2, 3, 4, 5, 6, 7, 8, 9],
        "position_ids": [0, 1, 2, 3, 0, 1, 2, 0, 1],
        "seq_lengths": [4, 3, 2],
    }
    split = pack_dataset(datasets.Dataset.from_dict({"input_ids": [list(range(1, 11))]}), 4, overlong="split")
    assert split["position_ids"] == [[0, 1, 2, 3], [0, 1, 2, 3], [0, 1]]


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    """A `transformers.Trainer` with its defaults (`remove_unused_columns=True`) around a tiny Llama."""
    from flatcollate.testing import tiny_causal_lm

    args = transformers.TrainingArguments(output_dir=str(tmp_path_factory.mktemp("trainer")), report_to=[])
    return transformers.Trainer(model=tiny_causal_lm("llama"), args=args)


def assert_same_batches(actual, expected):
    assert sorted(actual) == sorted(expected)
    for key, value in expected.items():
        if isinstance(value, torch.Tensor):
            torch.testing.assert_close(actual[key], value, rtol=0, atol=0)
        else:
            assert actual[key] == value, key


def test_boundaries_survive_trainer_column_removal(trainer):
    packed = pack_dataset(make_rows([5, 3, 8, 2, 6, 1, 7]), 8)
    kept = trainer._remove_unused_columns(packed)
    assert sorted(kept.column_names) == ["input_ids", "labels", "position_ids"], "Trainer drops seq_lengths"
    collator = DataCollatorWithFlattening()
    with_lengths = collator([packed[i] for i in range(len(packed))])
    without = collator([kept[i] for i in range(len(kept))])
    lengths = [n for row in packed["seq_lengths"] for n in row]
    assert without["cu_seq_lens_q"].tolist() == np.cumsum([0, *lengths]).tolist()
    assert_same_batches(without, with_lengths)


def keyed_rows(lengths, seed=0):
    """Rows whose first token (1000 + row) tells them apart, so packed sequences can be matched to their rows."""
    rng = np.random.default_rng(seed)
    return [[1000 + i, *rng.integers(0, 1000, n - 1).tolist()] for i, n in enumerate(lengths)]


def labels_by_sequence(batch):
    """`{first token: labels}` of every sequence of a collated batch."""
    ids, labels, cu = batch["input_ids"][0].tolist(), batch["labels"][0].tolist(), batch["cu_seq_lens_q"].tolist()
    return {ids[a]: labels[a:b] for a, b in itertools.pairwise(cu)}


@pytest.mark.parametrize("with_labels", [True, False])
@pytest.mark.parametrize("masks", [("completion_mask",), ("assistant_masks",), ("completion_mask", "assistant_masks")])
def test_masks_are_folded_into_labels_and_survive_trainer_column_removal(trainer, with_labels, masks):
    lengths = [5, 3, 8, 2, 6, 1, 7, 4]
    rng = np.random.default_rng(len(masks))
    ids = keyed_rows(lengths)
    columns = {"input_ids": ids}
    if with_labels:
        columns["labels"] = [[-100 if t % 4 == 0 else t for t in row] for row in ids]
    for name in masks:
        columns[name] = [rng.integers(0, 2, n).tolist() for n in lengths]
    ds = datasets.Dataset.from_dict(columns)
    packed, stats = pack_dataset(ds, 8, return_stats=True)
    assert packed.column_names == ["input_ids", "labels", "position_ids", "seq_lengths"]
    assert stats.folded_masks == masks
    assert f"labels: {', '.join(masks)} folded in (-100 where 0)" in str(stats)
    assert stats.dropped_columns == ()
    collator = DataCollatorWithFlattening()
    expected = labels_by_sequence(collator([ds[i] for i in range(len(ds))]))
    kept = trainer._remove_unused_columns(packed)
    assert labels_by_sequence(collator([kept[i] for i in range(len(kept))])) == expected
    assert any(-100 in labels[1:] for labels in expected.values()), "some trained-looking tokens are masked"


def test_bad_mask_values_name_row_and_column():
    ds = datasets.Dataset.from_dict({"input_ids": [[1, 2], [3, 4, 5]], "completion_mask": [[0, 1], [1, 2, 1]]})
    with pytest.raises(ValueError, match=r"row 1: column 'completion_mask' must hold only 0 and 1, found 2"):
        pack_dataset(ds, 8)
    ds = datasets.Dataset.from_dict({"input_ids": [[1, 2], [3, 4, 5]], "assistant_masks": [[0, 1], [1, 1]]})
    with pytest.raises(ValueError, match=r"row 1: field 'assistant_masks' has 2 values but 'input_ids' has 3"):
        pack_dataset(ds, 8)


def test_every_per_token_column_is_carried(caplog):
    lengths = [5, 3, 8, 2, 6, 1, 7]
    rng = np.random.default_rng(0)
    ds = make_rows(lengths).add_column("loss_weights", [rng.random(n).tolist() for n in lengths])
    ds = ds.add_column("token_type_ids", [rng.integers(0, 2, n).tolist() for n in lengths])
    ds = ds.add_column("text", [f"row {i}" for i in range(len(lengths))])
    ds = ds.add_column("scores", [[0.5] * 9 for _ in lengths])
    columns = ("input_ids", "labels", "loss_weights", "token_type_ids")
    with caplog.at_level(logging.WARNING, logger="flatcollate"):
        packed, stats = pack_dataset(ds, 8, return_stats=True)
    assert packed.column_names == [*columns, "position_ids", "seq_lengths"]
    assert sorted(unpack(packed, columns)) == sorted(tuple(tuple(r[c]) for c in columns) for r in ds)
    assert stats.dropped_columns == ("id", "text", "scores")
    assert "columns left out (not per token: one value per row, or lists of another length): id, text, scores" in (
        str(stats)
    )
    assert "id, text, scores" in caplog.text and "not per token" in caplog.text


def test_column_per_token_in_some_rows_only_names_row_and_column():
    ds = make_rows([3, 2, 4]).add_column("loss_weights", [[1.0, 1.0, 1.0], [1.0, 1.0], [1.0, 1.0]])
    match = r"column 'loss_weights' has one value per token in 2 rows but not in row 2 \(2 values, 'input_ids' has 4"
    with pytest.raises(ValueError, match=match):
        pack_dataset(ds, 8)


def test_attention_mask_of_ones_is_left_out_and_padding_raises():
    ds = make_rows([3, 2, 4])
    ones = ds.add_column("attention_mask", [[1] * n for n in (3, 2, 4)])
    packed, stats = pack_dataset(ones, 8, return_stats=True)
    assert "attention_mask" not in packed.column_names and "attention_mask" in stats.dropped_columns
    padded = ds.add_column("attention_mask", [[1, 1, 1], [1, 0], [1, 1, 1, 1]])
    with pytest.raises(ValueError, match=r"row 1: 'attention_mask' has zeros, so the row is padded"):
        pack_dataset(padded, 8)


def test_incoming_position_ids_must_count_from_zero():
    ds = make_rows([3, 2, 4])
    plain = ds.add_column("position_ids", [list(range(n)) for n in (3, 2, 4)])
    assert unpack(pack_dataset(plain, 8)) == unpack(pack_dataset(ds, 8))
    restarting = ds.add_column("position_ids", [[0, 1, 2], [0, 1], [0, 1, 0, 1]])
    with pytest.raises(ValueError, match=r"row 2: 'position_ids' do not count 0, 1, 2, ..."):
        pack_dataset(restarting, 8)


@pytest.mark.parametrize(
    ("format_args", "item_type"),
    [
        ({"type": "numpy", "dtype": "float32"}, np.ndarray),
        ({"type": "torch"}, torch.Tensor),
        ({"type": "torch", "columns": ["input_ids"]}, torch.Tensor),
    ],
)
def test_format_of_the_dataset_is_kept(format_args, item_type):
    ds = make_rows([5, 3, 8, 2]).with_format(**format_args)
    packed = pack_dataset(ds, 8)
    assert packed.format["type"] == format_args["type"]
    assert packed.format["format_kwargs"] == ds.format["format_kwargs"]
    kept = format_args.get("columns", ["input_ids", "labels"])  # all columns by default; "id" is left out
    assert packed.format["columns"] == [*kept, "position_ids", "seq_lengths"]
    assert isinstance(packed[0]["input_ids"], item_type)
    assert sorted(unpack(packed.with_format(None))) == sorted(unpack(pack_dataset(make_rows([5, 3, 8, 2]), 8)))


def test_empty_sequences_are_dropped_counted_and_logged(caplog):
    ds = datasets.Dataset.from_dict({"input_ids": [[1, 2], [], [3, 4, 5], [], [6]]})
    with caplog.at_level(logging.WARNING, logger="flatcollate"):
        packed, stats = pack_dataset(ds, 4, return_stats=True)
    assert sorted(packed["input_ids"]) == [[1, 2], [3, 4, 5, 6]]
    assert (stats.num_sequences, stats.num_empty) == (3, 2)
    assert "2 empty sequences dropped" in str(stats)
    assert "2 empty sequences dropped (first: row 1)" in caplog.text
    with pytest.raises(ValueError, match=r"row 1 has no tokens \(2 empty rows\); pass empty='drop' to drop them"):
        pack_dataset(ds, 4, empty="error")
    with pytest.raises(ValueError, match=r"empty='keep' is not one of \('drop', 'error'\)"):
        pack_dataset(ds, 4, empty="keep")


def iterable_rows(lengths, seed=0, **format_args):
    return make_rows(lengths, seed).to_iterable_dataset().with_format(**format_args)


@pytest.mark.parametrize("batch_size", [1, 7, 1000])
def test_iterable_dataset_is_packed_chunk_by_chunk(batch_size):
    lengths = np.random.default_rng(1).integers(0, 17, 60)  # some empty rows
    ds = make_rows(lengths, 1)
    packed = pack_dataset(ds.to_iterable_dataset(), 16, batch_size=batch_size)
    assert isinstance(packed, datasets.IterableDataset)
    rows = list(packed)
    assert list(rows[0]) == ["input_ids", "labels", "position_ids", "seq_lengths"]
    expected = []  # the same packing, run on each chunk of `batch_size` rows as a map-style dataset
    for start in range(0, len(ds), batch_size):
        expected.extend(pack_dataset(ds.select(range(start, min(start + batch_size, len(ds)))), 16))
    assert rows == expected
    nonempty = [(tuple(r["input_ids"]), tuple(r["labels"])) for r in ds if r["input_ids"]]
    assert sorted(unpack(rows)) == sorted(nonempty)


def test_iterable_dataset_keeps_its_format_and_logs_what_it_leaves_out(caplog):
    ds = iterable_rows([5, 0, 3, 8, 2], type="numpy")
    with caplog.at_level(logging.WARNING, logger="flatcollate"):
        packed = pack_dataset(ds, 8, batch_size=2)
        rows = list(packed)
    assert packed._formatting == ds._formatting
    assert all(isinstance(row["input_ids"], np.ndarray) for row in rows)
    assert "1 empty sequences dropped (first: row 1)" in caplog.text and "id" in caplog.text
    with pytest.raises(ValueError, match="return_stats=True needs a map-style"):
        pack_dataset(ds, 8, return_stats=True)
    overlong = pack_dataset(iterable_rows([5, 3, 2, 12]), 8, batch_size=2)
    with pytest.raises(ValueError, match=r"rows 2-3 of the stream: sequence 1 is 12 tokens > pack_len 8"):
        list(overlong)


def test_dataset_dicts_are_packed_split_by_split():
    dd = datasets.DatasetDict({"train": make_rows([5, 3, 8]), "test": make_rows([2, 6], 1)})
    packed, stats = pack_dataset(dd, 8, return_stats=True)
    assert isinstance(packed, datasets.DatasetDict) and set(packed) == {"train", "test"}
    assert {k: s.num_sequences for k, s in stats.items()} == {"train": 3, "test": 2}
    assert unpack(packed["test"]) == unpack(pack_dataset(dd["test"], 8))
    streamed = pack_dataset(datasets.IterableDatasetDict({k: v.to_iterable_dataset() for k, v in dd.items()}), 8)
    assert isinstance(streamed, datasets.IterableDatasetDict)
    assert list(streamed["train"]) == list(packed["train"])


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"strategy": "wrapped"}, r"strategy='wrapped' is not one of \('bfd', 'first_fit', 'next_fit'\)"),
        ({"overlong": "drop"}, r"overlong='drop' is not one of \('error', 'truncate', 'split'\)"),
        ({"empty": "keep"}, r"empty='keep' is not one of \('drop', 'error'\)"),
        ({"batch_size": 0}, "batch_size must be a positive int, got 0"),
    ],
)
@pytest.mark.parametrize("iterable", [False, True], ids=["dataset", "iterable"])
def test_options_are_checked_before_any_row_is_read(options, match, iterable):
    ds = make_rows([3, 12, 0])  # an over-long and an empty row: the option must be named first
    if iterable:
        ds = ds.to_iterable_dataset()
    with pytest.raises(ValueError, match=match):
        pack_dataset(ds, 8, **options)


def test_packed_fingerprint_comes_from_the_source_and_options_not_the_tokens(monkeypatch):
    # Hashing the packed table pickles every token (about 2 s for 36M tokens); the fingerprint is derived instead.
    ds, other = make_rows([5, 3, 8, 2]), make_rows([5, 3, 8, 3])
    first = pack_dataset(ds, 8)
    monkeypatch.setattr(datasets.arrow_dataset, "generate_fingerprint", lambda *_: pytest.fail("hashed the table"))
    assert pack_dataset(ds, 8)._fingerprint == first._fingerprint
    assert pack_dataset(ds, 9)._fingerprint != first._fingerprint
    assert pack_dataset(ds, 8, shuffle_seed=0)._fingerprint != first._fingerprint
    assert pack_dataset(other, 8)._fingerprint != first._fingerprint


@pytest.mark.parametrize("lengths", [[1], [4096], [1, 1, 1], [3, 1, 7, 2, 2, 9], list(range(1, 40))])
def test_restarting_positions_match_the_reference(lengths):
    from flatcollate.boundaries import cu_seqlens_to_position_ids

    cu = np.concatenate([[0], np.cumsum(lengths)])
    expected = np.concatenate([np.arange(n) for n in lengths])  # reference: one count per sequence
    actual = cu_seqlens_to_position_ids(cu)
    assert actual.dtype == np.int64
    np.testing.assert_array_equal(actual, expected)
    assert cu_seqlens_to_position_ids(np.zeros(1, np.int64)).shape == (0,)


@pytest.mark.parametrize("shuffle_seed", [None, 5])
@pytest.mark.parametrize("overlong", ["error", "truncate", "split"])
def test_packed_rows_are_the_packs_in_order_over_chunked_tables(shuffle_seed, overlong):
    # Slow reference: each packed row is its pack's pieces in ascending order, packs in id order (or permuted).
    from flatcollate.data.packing import pack_lengths, split_lengths

    lengths = np.random.default_rng(1).integers(1, 20 if overlong == "error" else 45, 57)
    parts = [make_rows(lengths[:20], 0), make_rows(lengths[20:], 1)]
    ds = datasets.concatenate_datasets(parts).select(range(2, 57))  # two chunks, sliced
    rows = ds["input_ids"]
    if overlong == "split":
        pieces = [rows[i][a : a + n] for i, a, n in zip(*split_lengths(lengths[2:], 20), strict=True)]
    else:
        pieces = [row[:20] for row in rows]
    packs = pack_lengths(lengths[2:], 20, overlong=overlong)
    if shuffle_seed is not None:
        packs = [packs[i] for i in np.random.default_rng(shuffle_seed).permutation(len(packs))]
    packed = pack_dataset(ds, 20, overlong=overlong, shuffle_seed=shuffle_seed)
    assert packed["input_ids"] == [[t for i in pack for t in pieces[i]] for pack in packs]
    assert packed["seq_lengths"] == [[len(pieces[i]) for i in pack] for pack in packs]


def test_image_columns_are_kept_one_entry_per_example_not_left_out():
    """Image rows keep their images: each pack holds one entry per example in every vision field (None for an example
    without images), never a dropped column (their placeholders would train without the images)."""
    ds = datasets.Dataset.from_dict(
        {
            "input_ids": [[1, 9, 9], [2, 3]],
            "pixel_values": [[[0.0] * 6] * 4, None],
            "image_grid_thw": [[[1, 2, 2]], None],
        }
    )
    packed, stats = pack_dataset(ds, 8, return_stats=True)
    assert packed[:] == {
        "input_ids": [[1, 9, 9, 2, 3]],
        "position_ids": [[0, 1, 2, 0, 1]],
        "seq_lengths": [[3, 2]],
        "pixel_values": [[[[0.0] * 6] * 4, None]],
        "image_grid_thw": [[[[1, 2, 2]], None]],
    }
    assert stats.vision_columns == ("pixel_values", "image_grid_thw") and stats.dropped_columns == ()
