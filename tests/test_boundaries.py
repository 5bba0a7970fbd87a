"""`flatcollate.boundaries.Boundaries`: every constructor and view against a per-sequence loop, and the object a
forward carries to its layers."""

import itertools

import numpy as np
import pytest
import torch

from flatcollate._conventions import BOUNDARIES_KEY
from flatcollate.boundaries import Boundaries, cu_seqlens_to_position_ids, next_token_labels
from flatcollate.forward_slot import enter_forward, forward_slot, leave_forward, run_with_slot, saved_slot

generator = np.random.default_rng(7)
MIXES = [[1], [5], [1, 1, 1, 1], [3, 1, 4], [97, 1, 33, 2], generator.integers(1, 40, 25).tolist()]


def reference(lengths: list[int]) -> dict:
    """Slow and obvious: walk the sequences one by one."""
    cu, positions, seq_idx, starts = [0], [], [], []
    for index, length in enumerate(lengths):
        cu.append(cu[-1] + length)
        positions += list(range(length))
        seq_idx += [index] * length
        starts += [True] + [False] * (length - 1)
    return {"cu": cu, "positions": positions, "seq_idx": seq_idx, "starts": starts, "longest": max(lengths)}


def constructions(lengths: list[int]) -> dict[str, Boundaries]:
    expected = reference(lengths)
    cu = torch.tensor(expected["cu"], dtype=torch.int32)
    positions = torch.tensor(expected["positions"])[None]
    seq_idx = torch.tensor(expected["seq_idx"], dtype=torch.int32)[None]
    rows, length = 1, len(expected["positions"])
    return {
        "lengths": Boundaries.from_lengths(lengths),
        "position_ids": Boundaries.from_position_ids(positions),
        "seq_idx": Boundaries.from_seq_idx(seq_idx),
        "kwargs cu_seq_lens": Boundaries.from_kwargs({"cu_seq_lens_q": cu}, rows=rows, length=length),
        "kwargs position_ids": Boundaries.from_kwargs({"position_ids": positions}, rows=rows, length=length),
        "kwargs seq_idx": Boundaries.from_kwargs({"seq_idx": seq_idx}, rows=rows, length=length),
        "given": Boundaries(cu, max(lengths)),
    }


@pytest.mark.parametrize("lengths", MIXES, ids=lambda lengths: f"{len(lengths)}-sequences")
def test_every_constructor_and_view_matches_a_loop_over_sequences(lengths):
    expected = reference(lengths)
    for name, boundaries in constructions(lengths).items():
        assert boundaries.cu_seqlens.dtype == torch.int32, name
        assert boundaries.host == expected["cu"], name
        assert (boundaries.max_length, boundaries.total) == (expected["longest"], expected["cu"][-1]), name
        assert boundaries.position_ids().tolist() == expected["positions"], name
        assert boundaries.position_ids(start=2).tolist() == [p + 2 for p in expected["positions"]], name
        assert boundaries.seq_idx.tolist() == expected["seq_idx"], name
        assert boundaries.starts.tolist() == expected["starts"], name


@pytest.mark.parametrize("lengths", MIXES, ids=lambda lengths: f"{len(lengths)}-sequences")
def test_padded_layout_and_next_token_labels_match_a_loop(lengths):
    boundaries = Boundaries.from_lengths(lengths)
    index, valid = boundaries.padded()
    labels = torch.arange(100, 100 + boundaries.total)[None]
    shifted = next_token_labels(labels, boundaries.cu_seqlens)
    for sequence, (start, end) in enumerate(itertools.pairwise(boundaries.host)):
        length = end - start
        assert index[sequence, :length].tolist() == list(range(start, end))
        assert valid[sequence].tolist() == [True] * length + [False] * (boundaries.max_length - length)
        assert shifted[0, start:end].tolist() == [*range(101 + start, 100 + end), -100]  # never the next one's


def test_the_collators_numpy_positions_are_the_same_rule():
    for lengths in MIXES:
        cu = np.array(reference(lengths)["cu"])
        assert cu_seqlens_to_position_ids(cu).tolist() == Boundaries.from_lengths(lengths).position_ids().tolist()


def test_views_are_computed_once_per_object():
    boundaries = Boundaries.from_lengths([3, 1, 4])
    assert boundaries.host is boundaries.host and boundaries.seq_idx is boundaries.seq_idx
    assert boundaries.chunked(2) is boundaries.chunked(2)
    builds = []
    assert boundaries.view("plan", lambda b: builds.append(1) or len(b.host)) == 4
    assert boundaries.view("plan", lambda b: builds.append(1) or len(b.host)) == 4
    assert builds == [1]


def test_the_forwards_own_object_is_handed_on_beside_its_cu_seq_lens():
    own = Boundaries.from_lengths([3, 2])
    assert Boundaries.from_kwargs({**own.kwargs(), BOUNDARIES_KEY: own}, rows=1, length=5) is own
    assert Boundaries.from_kwargs({BOUNDARIES_KEY: own, "position_ids": torch.arange(5)[None]}, rows=1, length=5) is own


def test_explicit_cu_seq_lens_other_than_the_forwards_own_win():
    own = Boundaries.from_lengths([3, 2])
    explicit = torch.tensor([0, 1, 5], dtype=torch.int32)
    got = Boundaries.from_kwargs({BOUNDARIES_KEY: own, "cu_seq_lens_q": explicit}, rows=1, length=5)
    assert got is not own and got.host == [0, 1, 5]
    other_tokens = Boundaries.from_kwargs({BOUNDARIES_KEY: own}, rows=2, length=5)  # not this forward's tokens
    assert other_tokens.host == [0, 5, 10]


def test_a_row_of_positions_shared_by_two_rows():
    shared = Boundaries.from_kwargs({"position_ids": torch.tensor([[0, 1, 2]])}, rows=2, length=3)
    assert shared.host == [0, 3, 6]


def test_the_forward_slot_is_scoped_and_restored():
    model, other = object(), object()
    own = Boundaries.from_lengths([2, 2])
    assert forward_slot() is None
    token = enter_forward(model, own)
    saved = saved_slot()
    assert forward_slot() is own and forward_slot(model) is own and forward_slot(other) is None
    leave_forward(token)
    assert forward_slot() is None
    assert run_with_slot(saved, forward_slot, model) is own  # a recompute sees its forward's value
    assert forward_slot() is None


def test_ordinary_rows_and_arguments_that_disagree():
    assert Boundaries.from_kwargs({}, rows=2, length=4).host == [0, 4, 8]
    cu, other = torch.tensor([0, 3, 5], dtype=torch.int32), torch.tensor([0, 5], dtype=torch.int32)
    with pytest.raises(ValueError, match="`cu_seq_lens_q` \\(3,\\) and `cu_seq_lens_k` \\(2,\\) differ"):
        Boundaries.from_kwargs({"cu_seq_lens_q": cu, "cu_seq_lens_k": other}, rows=1, length=5)
    with pytest.raises(ValueError, match="`position_ids` has 4 entries but the attention inputs hold 5 tokens"):
        Boundaries.from_kwargs({"position_ids": torch.arange(4)[None]}, rows=1, length=5)
