"""TRL's `pack_dataset` tests, ported to flatcollate's `pack_dataset`, compared without regard to placement.

Upstream: huggingface/trl `tests/test_data_utils.py`, classes `TestPackDatasetBfd` and `TestPackDatasetWrapped`, at
`f2cd57710ae345ea6428ae95363267fcf38a3dc8` (the main branch after v1.9.0, version 1.10.0.dev0: the newest revision
stored here; trl 1.16.0, the installed version, is not tagged in that copy). The installed trl 1.16.0 `pack_dataset`
is also run on random length mixes and compared.

flatcollate's best-fit decreasing places sequences differently from TRL's (and repacks the least-full packs), so the
upstream expectations are compared as: the multiset of sequences of the whole dataset, the validity of every pack
(`seq_lengths` summing to the row, positions restarting, at most `pack_len` tokens), and a fill at least TRL's (no
more packs than upstream expects). Names: TRL's `"bfd"` truncates over-long sequences, flatcollate's
`overlong="truncate"`; TRL's `"bfd_split"` is `overlong="split"`. Deliberate differences (docs/peers.md, D12-D15):
over-long sequences raise by default; `input_ids` is required and padded `attention_mask` rows raise; no `"wrapped"`
strategy (it cuts sequences at pack boundaries with nothing to mark them); other placements and a fill at least TRL's.
"""

import itertools

import datasets
import numpy as np
import pytest
import trl

from flatcollate.data.dataset import pack_dataset


def sequences(rows, columns=("input_ids",), pack_len=None):
    """Every packed sequence as a tuple of `columns`, after checking each pack; sorted, so placement does not count."""
    out = []
    for row in rows:
        lengths = list(row["seq_lengths"])
        assert all(n > 0 for n in lengths) and sum(lengths) == len(row[columns[0]])
        assert pack_len is None or len(row[columns[0]]) <= pack_len
        cut = np.cumsum([0, *lengths]).tolist()
        for a, b in itertools.pairwise(cut):
            if "position_ids" in row:
                assert list(row["position_ids"][a:b]) == list(range(b - a))
            out.append(tuple(tuple(np.asarray(row[c][a:b]).tolist()) for c in columns))
    return sorted(out)


def assert_same_packing(packed, expected, pack_len, columns=("input_ids",)):
    """Same sequences as TRL's expected output, valid packs, and no more packs than TRL."""
    rows = list(packed)
    expected_rows = [dict(zip(expected, values, strict=True)) for values in zip(*expected.values(), strict=True)]
    assert sequences(rows, columns, pack_len) == sequences(expected_rows, columns)
    assert len(rows) <= len(expected_rows)


UPSTREAM_BFD = {"input_ids": [[4, 5, 6, 7], [1, 2, 3, 8]], "seq_lengths": [[4], [3, 1]]}


# Upstream: TestPackDatasetBfd.test_with_dataset
def test_bfd_with_dataset():
    dataset = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3], [4, 5, 6, 7], [8]]})
    dataset = dataset.with_format("numpy", dtype="float32")
    packed = pack_dataset(dataset, 4, overlong="truncate")
    assert_same_packing(packed.with_format(None), UPSTREAM_BFD, 4)
    assert packed.format["type"] == "numpy" and packed.format["format_kwargs"] == {"dtype": "float32"}
    assert packed.format["columns"] == ["input_ids", "position_ids", "seq_lengths"]  # upstream: + "seq_lengths"


# Upstream: TestPackDatasetBfd.test_with_iterable_dataset
def test_bfd_with_iterable_dataset():
    dataset = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3], [4, 5, 6, 7], [8]]}).to_iterable_dataset()
    dataset = dataset.with_format("numpy")
    packed = pack_dataset(dataset, 4, overlong="truncate")
    assert isinstance(packed, datasets.IterableDataset)
    assert packed._formatting == dataset._formatting
    assert_same_packing(packed.with_format(None), UPSTREAM_BFD, 4)


# Upstream: TestPackDatasetBfd.test_with_overlong_0
def test_bfd_split_with_overlong():
    dataset = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3, 4, 5], [6, 7], [8, 9, 10, 11], [12]]})
    expected = {"input_ids": [[1, 2, 3, 4], [8, 9, 10, 11], [6, 7, 5, 12]], "seq_lengths": [[4], [4], [2, 1, 1]]}
    assert_same_packing(pack_dataset(dataset, 4, overlong="split"), expected, 4)


# Upstream: TestPackDatasetBfd.test_with_overlong_two_coluns. Deliberately different (D13): flatcollate packs by
# `input_ids`, so the first column is named so; the second is carried token by token.
def test_bfd_split_with_two_columns():
    col1 = [[1, -2, 3, -4, 5, -6], [7, -8, 9], [-10, 11, -12], [13, -14, 15, -16]]
    col2 = [[-1, 2, -3, 4, -5, 6], [-7, 8, -9], [10, -11, 12], [-13, 14, -15, 16]]
    with pytest.raises(ValueError, match="no 'input_ids' column"):
        pack_dataset(datasets.Dataset.from_dict({"col1": col1, "col2": col2}), 4, overlong="split")
    dataset = datasets.Dataset.from_dict({"input_ids": col1, "col2": col2})
    expected = {
        "input_ids": [[1, -2, 3, -4], [13, -14, 15, -16], [7, -8, 9], [-10, 11, -12], [5, -6]],
        "col2": [[-1, 2, -3, 4], [-13, 14, -15, 16], [-7, 8, -9], [10, -11, 12], [-5, 6]],
        "seq_lengths": [[4], [4], [3], [3], [2]],
    }
    packed = pack_dataset(dataset, 4, overlong="split")
    assert packed.column_names == ["input_ids", "col2", "position_ids", "seq_lengths"]
    assert_same_packing(packed, expected, 4, columns=("input_ids", "col2"))


# Upstream: TestPackDatasetBfd.test_with_non_power_of_2
def test_bfd_split_with_non_power_of_2():
    dataset = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3, 4, 5], [6], [7, 8, 9, 10], [11, 12, 13]]})
    expected = {"input_ids": [[1, 2, 3, 4, 5], [7, 8, 9, 10, 6], [11, 12, 13]], "seq_lengths": [[5], [4, 1], [3]]}
    assert_same_packing(pack_dataset(dataset, 5, overlong="split"), expected, 5)


# Upstream: TestPackDatasetBfd.test_default_no_split. Deliberately different (D12): truncation is asked for by name.
def test_bfd_default_truncates_only_when_asked():
    dataset = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3, 4, 5], [6, 7], [8, 9, 10, 11], [12]]})
    with pytest.raises(ValueError, match=r"sequence 0 is 5 tokens > pack_len 4 .* pass overlong='split' or 'truncate'"):
        pack_dataset(dataset, 4)
    expected = {"input_ids": [[1, 2, 3, 4], [8, 9, 10, 11], [6, 7, 12]], "seq_lengths": [[4], [4], [2, 1]]}
    packed, stats = pack_dataset(dataset, 4, overlong="truncate", return_stats=True)
    assert_same_packing(packed, expected, 4)
    assert stats.num_truncated_tokens == 1  # TRL drops the token without a count


# Upstream: TestPackDatasetBfd.test_with_empty_sequences
def test_bfd_split_with_empty_sequences():
    dataset = datasets.Dataset.from_dict({"input_ids": [[1, 2], [], [3, 4, 5], [], [6]]})
    expected = {"input_ids": [[3, 4, 5, 6], [1, 2]], "seq_lengths": [[3, 1], [2]]}
    packed, stats = pack_dataset(dataset, 4, overlong="split", return_stats=True)
    assert_same_packing(packed, expected, 4)
    assert stats.num_empty == 2  # dropped as upstream, and counted


# Upstream: TestPackDatasetWrapped.test_with_dataset, test_with_iterable_dataset. Deliberately different (D14): no
# "wrapped" strategy, and their padded attention_mask rows raise.
def test_wrapped_is_not_a_strategy():
    examples = {"input_ids": [[1, 2, 3], [4, 5, 6, 7], [8]], "attention_mask": [[0, 1, 1], [0, 0, 1, 1], [1]]}
    with pytest.raises(ValueError, match=r"strategy='wrapped' is not one of \('bfd', 'first_fit', 'next_fit'\)"):
        pack_dataset(datasets.Dataset.from_dict({"input_ids": examples["input_ids"]}), 3, strategy="wrapped")
    with pytest.raises(ValueError, match="'attention_mask' has zeros, so the row is padded"):
        pack_dataset(datasets.Dataset.from_dict(examples), 4)


def random_rows(seed, n, pack_len):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, pack_len + pack_len // 2, n)  # empty and over-long rows included
    return datasets.Dataset.from_dict({"input_ids": [rng.integers(0, 1000, k).tolist() for k in lengths]})


@pytest.mark.parametrize(("trl_strategy", "overlong"), [("bfd", "truncate"), ("bfd_split", "split")])
@pytest.mark.parametrize("iterable", [False, True], ids=["dataset", "iterable"])
@pytest.mark.parametrize("seed", range(2))
def test_same_sequences_and_at_least_trl_fill_on_random_rows(trl_strategy, overlong, iterable, seed):
    pack_len = [64, 100][seed]
    dataset = random_rows(seed, 2500, pack_len)  # TRL packs in map's batches of 1000 rows; so do streams here
    if iterable:
        dataset = dataset.to_iterable_dataset()
    theirs = list(trl.pack_dataset(dataset, pack_len, strategy=trl_strategy))
    ours = list(pack_dataset(dataset, pack_len, overlong=overlong))
    assert sequences(ours, pack_len=pack_len) == sequences(theirs)
    assert len(ours) <= len(theirs)
