"""The sequence-parallel split against a slow per-sequence reference (no processes needed)."""

import numpy as np
import pytest
import torch

from flatcollate import DataCollatorWithFlattening
from flatcollate.parallel import DataCollatorForSequenceParallel, split_for_sequence_parallel

IGNORE = -100
KEYS = ["cu_seq_lens_k", "cu_seq_lens_q", "input_ids", "max_length_k", "max_length_q", "position_ids", "shift_labels"]


def features(lengths, seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for length in lengths:
        ids = rng.integers(1, 256, size=length)
        rows.append({"input_ids": ids.tolist(), "labels": np.where(rng.random(length) < 0.3, IGNORE, ids).tolist()})
    return rows


def reference(rows, rank, world_size, pad_token_id=0):
    """Per sequence: each token's next-token label inside its own sequence; then a padding sequence; then a slice."""
    ids, positions, shift, lengths = [], [], [], []
    for row in rows:
        labels = [IGNORE, *row["labels"][1:]]  # the collator's separator on the first token
        ids += row["input_ids"]
        positions += list(range(len(labels)))
        shift += [*labels[1:], IGNORE]  # the last token of a sequence predicts nothing
        lengths.append(len(labels))
    pad = -len(ids) % world_size
    if pad:
        ids += [pad_token_id] * pad
        positions += list(range(pad))
        shift += [IGNORE] * pad
        lengths.append(pad)
    local = len(ids) // world_size
    part = slice(rank * local, (rank + 1) * local)
    return {
        "input_ids": ids[part],
        "position_ids": positions[part],
        "shift_labels": shift[part],
        "cu_seq_lens": np.cumsum([0, *lengths]).tolist(),
        "max_length": max(lengths),
    }


CASES = {
    "straddling": [13, 5, 23, 1, 9],
    "one_sequence": [17],
    "length_one": [1, 1, 1],
    "exact_multiple": [8, 4],
    "many_tiny": [1, 2, 1, 3, 1, 1, 2, 1],
}


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("lengths", CASES.values(), ids=CASES.keys())
def test_split_matches_per_sequence_reference(lengths, world_size):
    rows = features(lengths)
    batch = DataCollatorWithFlattening()(rows)
    pieces = [split_for_sequence_parallel(batch, rank=r, world_size=world_size) for r in range(world_size)]
    for rank, piece in enumerate(pieces):
        expected = reference(rows, rank, world_size)
        assert sorted(piece) == KEYS
        for key in ("input_ids", "position_ids", "shift_labels"):
            assert piece[key].dtype == torch.int64 and piece[key].shape == (1, len(expected[key])), key
            assert piece[key][0].tolist() == expected[key], f"rank {rank} {key}"
        for key in ("cu_seq_lens_q", "cu_seq_lens_k"):
            assert piece[key].dtype == torch.int32
            assert piece[key].tolist() == expected["cu_seq_lens"], f"rank {rank} {key}: the whole row's"
        assert piece["max_length_q"] == piece["max_length_k"] == expected["max_length"]
    labelled = sum(int((p["shift_labels"] != IGNORE).sum()) for p in pieces)
    assert labelled == int((batch["labels"][:, 1:] != IGNORE).sum()), "same label tokens as the unsplit row"


def test_sequence_straddling_a_slice_edge_keeps_its_next_token_label():
    rows = [{"input_ids": [11, 12, 13, 14, 15, 16]}]  # one sequence over two slices of 3
    first, second = (
        split_for_sequence_parallel(DataCollatorWithFlattening()(rows), rank=r, world_size=2) for r in (0, 1)
    )
    assert first["shift_labels"].tolist() == [[12, 13, 14]], "the last token of slice 0 predicts slice 1's first"
    assert second["shift_labels"].tolist() == [[15, 16, IGNORE]]
    assert second["position_ids"].tolist() == [[3, 4, 5]], "positions go on across the edge"


def test_collator_wrapper_chains_the_flattening_collator_and_the_split():
    rows = features([5, 4])
    collator = DataCollatorForSequenceParallel(DataCollatorWithFlattening(pad_token_id=7), rank=1, world_size=2)
    out = collator(rows)
    expected = split_for_sequence_parallel(DataCollatorWithFlattening()(rows), rank=1, world_size=2, pad_token_id=7)
    assert sorted(out) == KEYS
    for key in KEYS:
        torch.testing.assert_close(out[key], expected[key], rtol=0, atol=0)
    assert out["input_ids"][0, -1].item() == 7, "padding uses the collator's pad_token_id"


def test_bad_input_is_refused_with_the_fix():
    batch = DataCollatorWithFlattening()(features([3, 2]))
    with pytest.raises(ValueError, match=r"rank 2 .* world_size=2"):
        split_for_sequence_parallel(batch, rank=2, world_size=2)
    with pytest.raises(ValueError, match="world_size"):
        split_for_sequence_parallel(batch, rank=0, world_size=0)
    with pytest.raises(ValueError, match="cu_seq_lens_q"):
        split_for_sequence_parallel({k: v for k, v in batch.items() if not k.startswith("cu_")}, rank=0, world_size=2)
    with pytest.raises(ValueError, match="labels"):
        split_for_sequence_parallel({k: v for k, v in batch.items() if k != "labels"}, rank=0, world_size=2)
    with pytest.raises(ValueError, match="one row"):
        split_for_sequence_parallel({**batch, "input_ids": batch["input_ids"].repeat(2, 1)}, rank=0, world_size=2)
    with pytest.raises(ValueError, match="attention_mask"):
        mask = torch.ones_like(batch["input_ids"])
        split_for_sequence_parallel({**batch, "attention_mask": mask}, rank=0, world_size=2)
