"""The guard's boundary check on sequence-parallel slices: local positions against the whole row's boundaries."""

import pytest
import torch

from flatcollate import DataCollatorWithFlattening
from flatcollate.modeling.boundary_check import check_boundaries
from flatcollate.parallel import split_for_sequence_parallel
from flatcollate.parallel.prepare import rank_slice

LENGTHS = [5, 2, 7, 1]  # 15 tokens: padded to 16 over 2 or 4 ranks


def parts(world_size):
    rows = [{"input_ids": list(range(1, n + 1))} for n in LENGTHS]
    batch = DataCollatorWithFlattening()(rows)
    return [split_for_sequence_parallel(batch, rank=r, world_size=world_size) for r in range(world_size)]


def model_arguments(part):
    return {key: value for key, value in part.items() if key != "shift_labels"}


@pytest.mark.parametrize("world_size", [2, 4])
def test_slices_of_a_correct_row_pass(world_size):
    for rank, part in enumerate(parts(world_size)):
        flat = rank_slice((rank, world_size), None, model_arguments(part))
        assert flat.sliced and not flat.derived and flat.positions is part["position_ids"]


@pytest.mark.parametrize("world_size", [2, 4])
def test_missing_positions_are_derived_from_the_whole_row(world_size):
    for rank, part in enumerate(parts(world_size)):
        arguments = {k: v for k, v in model_arguments(part).items() if k != "position_ids"}
        flat = rank_slice((rank, world_size), None, arguments)
        assert flat.derived
        torch.testing.assert_close(flat.positions, part["position_ids"], rtol=0, atol=0)


def test_positions_restarting_at_a_slice_edge_inside_a_sequence_are_refused():
    part = model_arguments(parts(4)[1])  # tokens 4-7: the last token of the first sequence starts the slice
    restarted = part["position_ids"] - part["position_ids"][0, 0]  # positions made per slice, from 0
    with pytest.raises(ValueError, match="token 0"):
        rank_slice((1, 4), None, {**part, "position_ids": restarted})


def test_positions_going_on_where_the_row_starts_a_sequence_are_refused():
    part = model_arguments(parts(2)[0])
    wrong = torch.arange(part["input_ids"].shape[1])[None]  # one count over the slice: no restart at token 5
    with pytest.raises(ValueError, match="first at token 5"):
        rank_slice((0, 2), None, {**part, "position_ids": wrong})


def test_local_boundaries_instead_of_the_whole_row_are_refused():
    part = model_arguments(parts(2)[0])
    with pytest.raises(ValueError, match="ends at 16, but the batch holds 8 tokens on each of 4 ranks"):
        rank_slice((0, 4), None, part)
    without = {k: v for k, v in part.items() if not k.startswith(("cu_", "max_"))}
    with pytest.raises(ValueError, match="the whole row's `cu_seq_lens_q/k`"):  # local positions cannot tell
        rank_slice((0, 2), None, without)


def test_one_process_check_is_unchanged():
    rows = [{"input_ids": list(range(1, n + 1))} for n in LENGTHS]
    batch = DataCollatorWithFlattening()(rows)
    arguments = {k: v for k, v in batch.items() if k != "labels"}
    assert not check_boundaries(arguments, arguments["position_ids"]).derived
    with pytest.raises(ValueError, match="ends at 15, but the batch holds 8 tokens"):
        check_boundaries({**arguments, "input_ids": arguments["input_ids"][:, :8]}, None)
