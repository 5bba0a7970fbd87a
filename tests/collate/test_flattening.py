import itertools

import numpy as np
import pytest
import torch
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st

from flatcollate import DataCollatorWithFlattening

from .reference import reference_flatten

KEYS = {"input_ids", "labels", "position_ids", "seq_idx", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q",
        "max_length_k"}  # fmt: skip
DTYPES = {"input_ids": torch.int64, "labels": torch.int64, "position_ids": torch.int64, "seq_idx": torch.int32,
          "cu_seq_lens_q": torch.int32, "cu_seq_lens_k": torch.int32}  # fmt: skip


def assert_matches_reference(batch, expected):
    assert set(batch) == set(expected)
    for key, value in expected.items():
        if key.startswith("max_length"):
            assert type(batch[key]) is int and batch[key] == value, key
        else:
            torch.testing.assert_close(batch[key], torch.tensor(value, dtype=DTYPES[key]), rtol=0, atol=0, msg=key)


def random_batch(rng, n, *, low=1, high=50, labels=False, kind="list"):
    features = []
    for _ in range(n):
        ids = rng.integers(0, 1000, int(rng.integers(low, high + 1)))
        feature = {"input_ids": {"list": ids.tolist(), "np": ids, "pt": torch.from_numpy(ids)}[kind]}
        if labels:
            lab = ids.copy()
            lab[rng.random(len(ids)) < 0.3] = -100
            feature["labels"] = {"list": lab.tolist(), "np": lab, "pt": torch.from_numpy(lab)}[kind]
        features.append(feature)
    return features


def test_literal_batch_exact_keys_and_values():
    batch = DataCollatorWithFlattening()([{"input_ids": [11, 12, 13]}, {"input_ids": [21]}, {"input_ids": [31, 32]}])
    assert set(batch) == KEYS
    torch.testing.assert_close(batch["input_ids"], torch.tensor([[11, 12, 13, 21, 31, 32]]))
    torch.testing.assert_close(batch["labels"], torch.tensor([[-100, 12, 13, -100, -100, 32]]))
    torch.testing.assert_close(batch["position_ids"], torch.tensor([[0, 1, 2, 0, 0, 1]]))
    torch.testing.assert_close(batch["seq_idx"], torch.tensor([[0, 0, 0, 1, 2, 2]], dtype=torch.int32))
    torch.testing.assert_close(batch["cu_seq_lens_q"], torch.tensor([0, 3, 4, 6], dtype=torch.int32))
    torch.testing.assert_close(batch["cu_seq_lens_k"], torch.tensor([0, 3, 4, 6], dtype=torch.int32))
    assert batch["max_length_q"] == batch["max_length_k"] == 3
    assert "attention_mask" not in batch


def test_literal_options_off_match_transformers_defaults():
    features = [{"input_ids": [1, 2], "labels": [7, 8]}]
    batch = DataCollatorWithFlattening(return_flash_attn_kwargs=False, return_seq_idx=False)(features)
    assert set(batch) == {"input_ids", "labels", "position_ids"}
    torch.testing.assert_close(batch["labels"], torch.tensor([[-100, 8]]))


@pytest.mark.parametrize("kind", ["list", "np", "pt"])
@pytest.mark.parametrize("labels", [False, True])
@pytest.mark.parametrize("return_tensors", ["pt", "np"])
def test_same_output_as_transformers(kind, labels, return_tensors):
    rng = np.random.default_rng(0)
    options = {"return_flash_attn_kwargs": True, "return_seq_idx": True, "return_tensors": return_tensors}
    theirs = transformers.DataCollatorWithFlattening(**options)
    ours = DataCollatorWithFlattening(**options)
    for _ in range(5):
        features = random_batch(rng, int(rng.integers(1, 20)), labels=labels, kind=kind)
        expected, got = theirs(features), ours(features)
        assert set(got) == set(expected)
        for key in expected:
            if key.startswith("max_length"):
                assert type(got[key]) is int and got[key] == expected[key]
            else:
                assert type(got[key]) is type(expected[key]), key
                assert got[key].dtype == expected[key].dtype and got[key].shape == expected[key].shape, key
                np.testing.assert_array_equal(np.asarray(got[key]), np.asarray(expected[key]), err_msg=key)


@pytest.mark.parametrize("kind", ["list", "np", "pt"])
def test_plain_batches_match_general_path_and_reference(kind):
    """Batches of only `input_ids`/`labels` take a one-call concatenation; it must equal the per-example path."""
    rng = np.random.default_rng(7)
    collator = DataCollatorWithFlattening(return_tensors="np")
    for labels in (False, True):
        for _ in range(10):
            plain = random_batch(rng, int(rng.integers(1, 20)), labels=labels, kind=kind)
            general = [{**feature, "id": i} for i, feature in enumerate(plain)]  # a metadata key: per-example path
            got, expected = collator(plain), collator(general)
            assert set(got) == set(expected)
            for key in expected:
                np.testing.assert_array_equal(got[key], expected[key], err_msg=key)
            as_lists = [{k: np.asarray(v).tolist() for k, v in feature.items()} for feature in plain]
            assert_matches_reference(DataCollatorWithFlattening()(plain), reference_flatten(as_lists))


@pytest.mark.parametrize(
    "features",
    [
        [{"input_ids": [True, np.int64(7), 3], "labels": [np.int32(-100), 2, False]}],
        [{"input_ids": np.array([1, 2], dtype=np.int32)}, {"input_ids": np.array([3], dtype=np.uint8)}],
        [{"input_ids": torch.tensor([1, 0], dtype=torch.bool)}, {"input_ids": torch.tensor([5], dtype=torch.int32)}],
    ],
    ids=["int-guises-in-lists", "mixed-numpy-int-dtypes", "mixed-torch-int-dtypes"],
)
def test_plain_batches_take_integers_of_any_dtype(features):
    as_lists = [{k: [int(x) for x in v] for k, v in feature.items()} for feature in features]
    assert_matches_reference(DataCollatorWithFlattening()(features), reference_flatten(as_lists))


@pytest.mark.parametrize(
    "bad, pattern",
    [
        ([1, 2.5], r"example 1: field 'input_ids' must hold integers"),
        ([1, "2"], r"example 1: field 'input_ids' must hold integers"),
        ([[1, 2], [3, 4]], r"example 1: field 'input_ids' must be 1-D"),
        ([], r"example 1: 'input_ids' is empty"),
        (np.array([1.0, 2.0]), r"example 1: field 'input_ids' must hold integers"),
        (np.array([[1, 2]]), r"example 1: field 'input_ids' must be 1-D"),
        (np.array([], dtype=np.int64), r"example 1: 'input_ids' is empty"),
        (torch.tensor([0.5]), r"example 1: field 'input_ids' must hold integers"),
        (torch.zeros(1, 2, dtype=torch.long), r"example 1: field 'input_ids' must be 1-D"),
    ],
)
def test_plain_batches_with_bad_values_still_name_the_example(bad, pattern):
    good = {list: [1, 2], np.ndarray: np.array([1, 2]), torch.Tensor: torch.tensor([1, 2])}[type(bad)]
    with pytest.raises((TypeError, ValueError), match=pattern):
        DataCollatorWithFlattening()([{"input_ids": good}, {"input_ids": bad}])
    with pytest.raises(ValueError, match=r"example 1: field 'labels' has 1 entries but 'input_ids' has 2"):
        DataCollatorWithFlattening()([{"input_ids": good, "labels": good}, {"input_ids": good, "labels": good[:1]}])


@pytest.mark.parametrize(
    "lengths",
    [[1], [1, 1, 1, 1, 1, 1, 1, 1], [5], [1, 37, 1, 2], [200] * 3 + [1] * 40, [97, 1025]],
    ids=["one-token", "many-tiny", "one-seq", "mixed", "long-and-tiny", "awkward"],
)
def test_edge_lengths_match_reference(lengths):
    rng = np.random.default_rng(1)
    features = [{"input_ids": rng.integers(0, 50, n).tolist()} for n in lengths]
    assert_matches_reference(DataCollatorWithFlattening()(features), reference_flatten(features))


def test_masks_and_labels_match_reference():
    rng = np.random.default_rng(2)
    features = []
    for i in range(12):
        n = int(rng.integers(1, 30))
        feature = {"input_ids": rng.integers(0, 99, n), "labels": rng.integers(0, 99, n)}
        if i % 3 == 0:
            feature["completion_mask"] = (rng.random(n) < 0.5).astype(np.int64)
        if i % 4 == 0:
            feature["assistant_masks"] = (rng.random(n) < 0.5).tolist()
        features.append(feature)
    assert_matches_reference(DataCollatorWithFlattening()(features), reference_flatten(features))


def test_packed_examples_keep_inner_boundaries():
    features = [
        {"input_ids": list(range(10, 16)), "seq_lengths": [2, 3, 1]},
        {"input_ids": [50, 51, 52]},
        {"input_ids": [60, 61, 62, 63], "seq_lengths": [4]},
    ]
    batch = DataCollatorWithFlattening()(features)
    assert_matches_reference(batch, reference_flatten(features))
    assert batch["cu_seq_lens_q"].tolist() == [0, 2, 5, 6, 9, 13]


def test_restarting_position_ids_mark_inner_boundaries():
    features = [{"input_ids": [1, 2, 3, 4, 5], "position_ids": [0, 1, 0, 1, 2]}]
    batch = DataCollatorWithFlattening()(features)
    assert batch["cu_seq_lens_q"].tolist() == [0, 2, 5]
    assert batch["labels"].tolist() == [[-100, 2, -100, 4, 5]]


@pytest.mark.parametrize("multiple", [1, 4, 8, 64])
def test_pad_to_multiple_of_is_its_own_segment(multiple):
    rng = np.random.default_rng(3)
    features = random_batch(rng, 5, labels=True)
    batch = DataCollatorWithFlattening(pad_to_multiple_of=multiple, pad_token_id=3)(features)
    expected = reference_flatten(features, pad_to_multiple_of=multiple, pad_token_id=3)
    assert_matches_reference(batch, expected)
    assert batch["input_ids"].shape[1] % multiple == 0


def test_pad_segment_longer_than_every_sequence_sets_max_length():
    batch = DataCollatorWithFlattening(pad_to_multiple_of=16)([{"input_ids": [1, 2]}])
    assert batch["cu_seq_lens_q"].tolist() == [0, 2, 16]
    assert batch["max_length_q"] == 14


def test_position_ids_start_and_separator():
    batch = DataCollatorWithFlattening(position_ids_start=2, separator_id=-1)(
        [{"input_ids": [1, 2]}, {"input_ids": [3]}]
    )
    assert batch["position_ids"].tolist() == [[2, 3, 2]]
    assert batch["labels"].tolist() == [[-1, 2, -1]]
    assert batch["cu_seq_lens_q"].tolist() == [0, 2, 3]


@pytest.mark.parametrize("convert", [list, np.asarray, torch.from_numpy], ids=["list", "np", "pt"])
@pytest.mark.parametrize("extra", [{}, {"id": 0}], ids=["plain", "with-metadata"])
def test_inputs_are_not_modified(convert, extra):
    ids, labels = np.arange(5), np.arange(5)
    batch = DataCollatorWithFlattening()([{"input_ids": convert(ids), "labels": convert(labels), **extra}])
    batch["input_ids"] += 1
    np.testing.assert_array_equal(labels, np.arange(5))
    np.testing.assert_array_equal(ids, np.arange(5))


def test_metadata_keys_are_left_out_but_per_token_keys_refused():
    batch = DataCollatorWithFlattening()([{"input_ids": [1, 2, 3], "id": "a", "text": "xyz", "n": [1]}])
    assert "text" not in batch
    with pytest.raises(ValueError, match=r"example 1: per-token field\(s\) \['token_type_ids'\]"):
        DataCollatorWithFlattening()([{"input_ids": [1, 2]}, {"input_ids": [1, 2, 3], "token_type_ids": [0, 0, 1]}])


@st.composite
def batches(draw):
    n = draw(st.integers(1, 12))
    features = []
    for _ in range(n):
        length = draw(st.integers(1, 40))
        ids = draw(st.lists(st.integers(0, 500), min_size=length, max_size=length))
        feature = {"input_ids": ids}
        if draw(st.booleans()):
            feature["labels"] = draw(st.lists(st.sampled_from([-100, 1, 2, 3]), min_size=length, max_size=length))
        if draw(st.booleans()):
            cuts = sorted(draw(st.sets(st.integers(1, length - 1), max_size=4))) if length > 1 else []
            bounds = [0, *cuts, length]
            feature["seq_lengths"] = [b - a for a, b in itertools.pairwise(bounds)]
        features.append(feature)
    return features, draw(st.sampled_from([None, 1, 8, 32]))


@settings(max_examples=150, deadline=None)
@given(batches())
def test_property_matches_reference_and_invariants(drawn):
    features, multiple = drawn
    batch = DataCollatorWithFlattening(pad_to_multiple_of=multiple)(features)
    assert_matches_reference(batch, reference_flatten(features, pad_to_multiple_of=multiple))
    cu = batch["cu_seq_lens_q"]
    total = batch["input_ids"].shape[1]
    assert cu[0] == 0 and cu[-1] == total and bool((cu.diff() > 0).all())
    starts = cu[:-1].long()
    assert bool((batch["position_ids"][0, starts] == 0).all())
    assert bool((batch["labels"][0, starts] == -100).all())
    assert int(batch["seq_idx"][0, -1]) == len(cu) - 2
