"""Row sources: what identifies a source for resume, and sources that cannot be resumed exactly are refused."""

import pytest

from flatcollate.streaming import StreamingPacker, interleave

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
