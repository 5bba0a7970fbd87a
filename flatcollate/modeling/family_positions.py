"""Positions as each family numbers them, and boundaries for attention layers that never see positions.

Most families number a sequence's tokens from 0, as the collators do. RoBERTa and the families built on its
embeddings (xlm-roberta, camembert, data2vec-text, ...) number them from `padding_idx + 1`, the rule of fairseq's
`make_positions`: run alone, `RobertaForCausalLM` gives a three-token sequence positions `[2, 3, 4]` (`padding_idx`
1). The guard renumbers a flattened batch's positions the same way::

    collator      position_ids  [0 1 2 | 0 | 0 1]
    roberta       position_ids  [2 3 4 | 2 | 2 3]      (padding_idx + 1 added to every position)

Those families consume `position_ids` in their embeddings and never hand them to the attention layers, which then see
no boundary at all. A flattened batch without `cu_seq_lens` (positions or `seq_idx` only) gets them from its positions
(`segment_kwargs`), so every layer keeps the sequences apart.
"""

import torch

from .._conventions import CU_SEQLENS_DTYPE, FLASH_KWARG_KEYS
from ..attention import ATTN_IMPLEMENTATION
from ..attention.packed_segments import segments_from_position_ids


def position_start(model: torch.nn.Module) -> tuple[int, int] | None:
    """`(first position, padding_idx)` for a family whose embeddings number positions from `padding_idx + 1`
    (those defining `create_position_ids_from_input_ids`, RoBERTa's rule); None for families numbering from 0."""
    for module in model.modules():
        padding_idx = getattr(module, "padding_idx", None)
        if hasattr(type(module), "create_position_ids_from_input_ids") and isinstance(padding_idx, int):
            return padding_idx + 1, padding_idx
    return None


def family_positions(
    model: torch.nn.Module, arguments: dict, positions: torch.Tensor, starts: torch.Tensor, *, derived: bool
) -> torch.Tensor | None:
    """Restarting positions `(B, T)` renumbered from the family's first position, or None to keep them.

    Args:
        model: the prepared top-level model (reads `_flatcollate_position_start`).
        arguments (`dict`): the forward's arguments (reads `input_ids`).
        positions (`torch.Tensor` of shape `(B, T)`, integer): the batch's positions, checked against its boundaries.
        starts (`torch.Tensor` of shape `(B * T,)`, bool): where sequences start.
        derived (`bool`): the positions were derived from the boundaries (numbered from 0), not given.

    Raises:
        `ValueError` for given positions numbered from neither 0 nor the family's first position, and for a pad token
        inside a sequence (the family numbers positions around padding, which a flattened row has none of).
    """
    numbering = model._flatcollate_position_start
    if numbering is None:
        return None
    first, padding_idx = numbering
    name = type(model).__name__
    input_ids = arguments.get("input_ids")
    if isinstance(input_ids, torch.Tensor) and (pads := torch.nonzero(input_ids.reshape(-1) == padding_idx)).numel():
        raise ValueError(
            f"{name} numbers positions around its padding token, and a flattened row has none: `input_ids` holds "
            f"`pad_token_id`={padding_idx} inside a sequence (first at token {int(pads[0, 0])}). Remove padding from "
            "the examples before collating (the flattening collators need none)."
        )
    if derived:
        return positions + first
    at_starts = positions.reshape(-1)[starts]
    if bool((at_starts == first).all()):
        return None
    if bool((at_starts == 0).all()):  # the collators' numbering
        return positions + first
    wrong = int(at_starts[(at_starts != 0) & (at_starts != first)][0])
    raise ValueError(
        f"{name} numbers each sequence's positions from padding_idx + 1 = {first}, as the model does alone; the "
        f"flattened batch's `position_ids` start a sequence at neither 0 nor {first} (got {wrong}). Leave "
        "`position_ids` out or number them from 0 (`DataCollatorWithFlattening()` does) and flatcollate renumbers them."
    )


def segment_kwargs(positions: torch.Tensor) -> dict:
    """`cu_seq_lens_q/k` `(N + 1,)` int32 and `max_length_q/k` (Python ints) of restarting `positions` `(B, T)`."""
    segments = segments_from_position_ids(positions)
    cu_seqlens = segments.cu_seqlens.to(CU_SEQLENS_DTYPE)
    values = (cu_seqlens, cu_seqlens, segments.max_length, segments.max_length)
    return dict(zip(FLASH_KWARG_KEYS, values, strict=True))


def text_changes(model, arguments: dict, positions: torch.Tensor, starts: torch.Tensor, *, derived: bool) -> dict:
    """What a flattened text batch runs with besides checked positions: positions numbered as the family numbers
    them (`family_positions`), and `cu_seq_lens` for attention layers that never see positions (`segment_kwargs`).

    Args:
        model: the prepared top-level model.
        arguments (`dict`): the forward's arguments.
        positions (`torch.Tensor` of shape `(B, T)`, integer): the batch's text positions, checked.
        starts (`torch.Tensor` of shape `(B * T,)`, bool): where sequences start (`position_starts(positions)`).
        derived (`bool`): the guard derived them from the boundaries (numbered from 0).
    """
    changes = {}
    renumbered = family_positions(model, arguments, positions, starts, derived=derived)
    if renumbered is not None:
        changes["position_ids"] = renumbered
    packed = model.config.get_text_config()._attn_implementation == ATTN_IMPLEMENTATION
    no_cu = arguments.get("cu_seq_lens_q") is None and arguments.get("cu_seq_lens_k") is None
    if packed and no_cu and model._flatcollate_takes_kwargs:
        changes.update(segment_kwargs(positions))
    return changes
