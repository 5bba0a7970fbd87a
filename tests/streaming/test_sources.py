"""Row sources: what identifies a source for resume, and sources that cannot be resumed exactly are refused."""

import numpy as np
import pytest

from flatcollate.streaming import StreamingPacker, interleave
from flatcollate.streaming.fingerprints import iterable_dataset_fingerprint, sequence_fingerprint

datasets = pytest.importorskip("datasets")


def make_table(n=200):
    return datasets.Dataset.from_dict({"input_ids": [[i % 50 + 1] * (i % 7 + 1) for i in range(n)]})


def shuffled_iterable():
    return make_table().to_iterable_dataset(num_shards=4).shuffle(seed=0, buffer_size=20)


@pytest.mark.parametrize(
    "make_source",
    [
        shuffled_iterable,
        lambda: shuffled_iterable().map(lambda row: row),
        lambda: interleave([make_table(), shuffled_iterable()], [0.5, 0.5], seed=0),
        lambda: datasets.interleave_datasets([make_table().to_iterable_dataset(), shuffled_iterable()]),
    ],
    ids=["shuffled", "shuffled_then_mapped", "inside_interleave", "inside_interleave_datasets"],
)
def test_buffer_shuffled_iterable_dataset_is_refused(make_source):
    with pytest.raises(ValueError, match=r"shuffle buffer.*cannot be resumed.*Dataset.shuffle\(seed="):
        StreamingPacker(make_source(), pack_len=16)


def test_unshuffled_iterable_dataset_and_shuffled_map_style_dataset_are_accepted():
    StreamingPacker(make_table().to_iterable_dataset(num_shards=4).map(lambda row: row), pack_len=16)
    StreamingPacker(make_table().shuffle(seed=0), pack_len=16)
    StreamingPacker(make_table().shuffle(seed=0).to_iterable_dataset(num_shards=4), pack_len=16)


class Opaque:
    """A field value whose `repr` holds its memory address, different in every run."""


def test_list_fingerprint_ignores_memory_addresses_and_sees_content():
    def rows(first):
        return [{"input_ids": [first, 2], "meta": Opaque(), "array": np.arange(3)}] * 3

    assert rows(1)[0]["meta"] is not rows(1)[0]["meta"]
    assert sequence_fingerprint(rows(1)) == sequence_fingerprint(rows(1))
    assert sequence_fingerprint(rows(1)) != sequence_fingerprint(rows(5))


def test_iterable_dataset_fingerprint_follows_its_data():
    def pipeline(table):
        return table.to_iterable_dataset(num_shards=2).map(lambda row: row)

    fingerprint = iterable_dataset_fingerprint(pipeline(make_table()))
    assert iterable_dataset_fingerprint(pipeline(make_table())) == fingerprint
    assert iterable_dataset_fingerprint(pipeline(make_table(199))) != fingerprint
    assert iterable_dataset_fingerprint(make_table().to_iterable_dataset(num_shards=2)) != fingerprint
