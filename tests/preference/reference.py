"""Slow references for the preference collators: TRL's padded rows without their padding, and a flattened row's
sequences read one by one (checking positions, labels and boundaries on the way)."""

import itertools

import torch


def unpadded(padded: dict, prefix: str) -> list[tuple[list[int], list[int]]]:
    """Reference: each row of TRL's padded batch without its padding, `(ids, completion_mask)`."""
    rows = []
    for ids, attention, completion in zip(
        padded[f"{prefix}input_ids"], padded[f"{prefix}attention_mask"], padded[f"{prefix}completion_mask"], strict=True
    ):
        keep = attention.bool()
        rows.append((ids[keep].tolist(), completion[keep].tolist()))
    return rows


def flattened(batch: dict, prefix: str) -> list[tuple[list[int], list[int]]]:
    """Each sequence of a flattened row, `(ids, completion_mask)`, checking positions, labels and boundaries."""
    bounds = batch[f"{prefix}cu_seq_lens_q"].tolist()
    assert batch[f"{prefix}cu_seq_lens_q"].dtype == torch.int32
    assert torch.equal(batch[f"{prefix}cu_seq_lens_q"], batch[f"{prefix}cu_seq_lens_k"])
    lengths = [end - start for start, end in itertools.pairwise(bounds)]
    assert batch[f"{prefix}max_length_q"] == batch[f"{prefix}max_length_k"] == max(lengths)
    rows = []
    for start, end in itertools.pairwise(bounds):
        ids = batch[f"{prefix}input_ids"][0, start:end].tolist()
        completion = batch[f"{prefix}completion_mask"][0, start:end].tolist()
        assert batch[f"{prefix}position_ids"][0, start:end].tolist() == list(range(end - start))
        labels = [-100] + [t if c else -100 for t, c in zip(ids[1:], completion[1:], strict=True)]
        assert batch[f"{prefix}labels"][0, start:end].tolist() == labels
        rows.append((ids, completion))
    return rows
