"""Positions as each family numbers them, and boundaries for attention layers that never see positions.

Most families number a sequence's tokens from 0, as the collators do. RoBERTa and the families built on its
embeddings (xlm-roberta, camembert, data2vec-text, ...) number them from `padding_idx + 1`, the rule of fairseq's
`make_positions`: run alone, `RobertaForCausalLM` gives a three-token sequence positions `[2, 3, 4]` (`padding_idx`
1). The guard renumbers a flattened batch's positions the same way::

    collator      position_ids  [0 1 2 | 0 | 0 1]
    roberta       position_ids  [2 3 4 | 2 | 2 3]      (padding_idx + 1 added to every position)

Those families consume `position_ids` in their embeddings and never hand them to the attention layers: the guard
hands those layers the batch's `cu_seq_lens` instead. `add_family_positions` registers the renumbering with the guard
of a model of such a family.
"""

import functools

import torch

from .prepared_state import Feature, FlatBatch, add_feature


def position_start(model: torch.nn.Module) -> tuple[int, int] | None:
    """`(first position, padding_idx)` for a family whose embeddings number positions from `padding_idx + 1`
    (those defining `create_position_ids_from_input_ids`, RoBERTa's rule); None for families numbering from 0."""
    for module in model.modules():
        padding_idx = getattr(module, "padding_idx", None)
        if hasattr(type(module), "create_position_ids_from_input_ids") and isinstance(padding_idx, int):
            return padding_idx + 1, padding_idx
    return None


def family_positions(
    numbering: tuple[int, int], model: torch.nn.Module, arguments: dict, flat: FlatBatch | None
) -> dict:
    """`{"position_ids": ...}`: a flattened batch's restarting positions `(B, T)` renumbered from the family's first
    position; empty to keep them (or for an ordinary batch).

    Args:
        numbering (`tuple[int, int]`): `(first position, padding_idx)` of the family (`position_start`).
        model: the prepared top-level model.
        arguments (`dict`): the forward's arguments (reads `input_ids`).
        flat (`FlatBatch`, *optional*): the batch's boundaries and positions (checked, or `derived` from the
            boundaries and numbered from 0).

    Raises:
        `ValueError` for given positions numbered from neither 0 nor the family's first position, and for a pad token
        inside a sequence (the family numbers positions around padding, which a flattened row has none of).
    """
    if flat is None or flat.sliced or flat.positions is None or flat.positions.dim() != 2:
        return {}
    positions, starts = flat.positions, flat.boundaries.starts
    first, padding_idx = numbering
    name = type(model).__name__
    input_ids = arguments.get("input_ids")
    if isinstance(input_ids, torch.Tensor) and (pads := torch.nonzero(input_ids.reshape(-1) == padding_idx)).numel():
        raise ValueError(
            f"{name} numbers positions around its padding token, and a flattened row has none: `input_ids` holds "
            f"`pad_token_id`={padding_idx} inside a sequence (first at token {int(pads[0, 0])}). Remove padding from "
            "the examples before collating (the flattening collators need none)."
        )
    if flat.derived:
        return {"position_ids": positions + first}
    at_starts = positions.reshape(-1)[starts.to(positions.device)]
    if bool((at_starts == first).all()):
        return {}
    if bool((at_starts == 0).all()):  # the collators' numbering
        return {"position_ids": positions + first}
    wrong = int(at_starts[(at_starts != 0) & (at_starts != first)][0])
    raise ValueError(
        f"{name} numbers each sequence's positions from padding_idx + 1 = {first}, as the model does alone; the "
        f"flattened batch's `position_ids` start a sequence at neither 0 nor {first} (got {wrong}). Leave "
        "`position_ids` out or number them from 0 (`DataCollatorWithFlattening()` does) and flatcollate renumbers them."
    )


def add_family_positions(model: torch.nn.Module) -> bool:
    """Register the family's numbering with the guard of `model` where it numbers from `padding_idx + 1`; whether
    it does."""
    numbering = position_start(model)
    if numbering is not None:
        add_feature(model, Feature("family positions", changes=functools.partial(family_positions, numbering)))
    return numbering is not None
