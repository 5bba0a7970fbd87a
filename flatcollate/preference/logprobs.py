"""Per-sequence log-probabilities of a flattened row: what DPO sums for each completion and GRPO keeps per token.

A causal LM scores token `t + 1` from the logits at `t`. Over a flattened row, shifting the labels by one would
score the first token of each sequence from the last token of the one before; here the shift stops at every
boundary, so the last token of a sequence scores nothing::

    row            a0 a1 a2 | b0 b1          labels  -  a1 a2 | -  b1      (first label of each sequence -100)
    next label     a1 a2 -  | b1 -           the shift never crosses `|`
    log-prob       lp(a1|a0) lp(a2|a0 a1) 0 | lp(b1|b0) 0
    summed         sequence a: lp(a1) + lp(a2);  sequence b: lp(b1)
"""

from collections.abc import Mapping

import torch

from .._conventions import IGNORE_INDEX
from ..boundaries import Boundaries, next_token_labels
from ..modeling.prepared_state import is_prepared

NOT_MODEL_INPUTS = ("labels", "completion_mask", "seq_lengths", "ref_chosen_logps", "ref_rejected_logps")
"""Fields of a flattened batch that describe the targets, not the model's inputs."""


def sequence_bounds(batch: Mapping) -> Boundaries:
    """The `Boundaries` of a flattened batch: its `cu_seq_lens_q`, or those its restarting `position_ids` imply.

    >>> sequence_bounds({"position_ids": torch.tensor([[0, 1, 2, 0, 1]])}).host
    [0, 3, 5]
    """
    positions = batch.get("position_ids")
    if batch.get("cu_seq_lens_q") is not None:
        length = int(batch["cu_seq_lens_q"][-1])
        return Boundaries.from_kwargs({"cu_seq_lens_q": batch["cu_seq_lens_q"]}, rows=1, length=length)
    if positions is None or positions.dim() != 2 or positions.shape[0] != 1:
        raise ValueError(
            "a flattened batch needs `cu_seq_lens_q` or `position_ids` of shape (1, T) to tell its sequences apart; "
            "collate it with `flatcollate.DataCollatorWithFlattening` or `flatcollate.preference."
            "DataCollatorForPreference`."
        )
    return Boundaries.from_position_ids(positions)


def sequence_logprobs(
    model: torch.nn.Module, batch: Mapping, *, per_token: bool = False, temperature: float = 1.0
) -> torch.Tensor | list[torch.Tensor]:
    """Each sequence's log-probability of its labelled tokens, from one forward of a flattened batch.

    Args:
        model (`torch.nn.Module`): a causal LM prepared with `flatcollate.prepare_model_for_flattening` (or a PEFT,
            DDP or compiled wrapper of one); an unprepared model is refused, since transformers' own backends let the
            row's sequences attend to each other.
        batch (`Mapping`): one flattened row as the flattening collators emit it: `input_ids` `(1, T)`, `labels`
            `(1, T)` (-100 where a token is not scored), and `cu_seq_lens_q` or restarting `position_ids`. An
            image-text row from `flatcollate.vision.VisionDataCollatorWithFlattening` works as it is: its vision
            fields and per-token types go to the model with the row (`tests/preference/test_vision_logprobs.py`).
        per_token (`bool`, defaults to `False`): return every sequence's per-token log-probabilities instead of
            their sums.
        temperature (`float`, defaults to 1.0): the logits are divided by it (as GRPO samples).

    Returns:
        `(N,)` summed log-probabilities in example order, with gradient; with `per_token`, a list of `N` tensors of
        length `len(sequence) - 1`: entry `t` scores token `t + 1` of the sequence, 0 where its label is -100.
    """
    if not is_prepared(model):
        raise ValueError(
            f"{type(model).__name__} is not prepared for flattened rows, so its sequences could attend to each other "
            "and their log-probabilities would be wrong; call `flatcollate.prepare_model_for_flattening(model)` first."
        )
    return flattened_logprobs(model, batch, per_token=per_token, temperature=temperature)


def flattened_logprobs(
    model: torch.nn.Module, batch: Mapping, *, per_token: bool = False, temperature: float = 1.0
) -> torch.Tensor | list[torch.Tensor]:
    """`sequence_logprobs` without the check that `model` is prepared: what `flatcollate check --task dpo` runs to
    measure transformers' own backends on flattened rows."""
    if not temperature > 0:
        raise ValueError(f"temperature must be positive, got {temperature}.")
    if batch.get("labels") is None:
        raise ValueError("the batch has no `labels`: they say which tokens are scored (-100 elsewhere).")
    boundaries = sequence_bounds(batch)
    labels = batch["labels"]
    if labels.shape != batch["input_ids"].shape or labels.shape[0] != 1 or boundaries.total != labels.shape[1]:
        raise ValueError(
            f"`labels` {tuple(labels.shape)}, `input_ids` {tuple(batch['input_ids'].shape)} and the boundaries (ending "
            f"at {boundaries.total}) must describe one flattened row of the same length."
        )
    inputs = {key: value for key, value in batch.items() if key not in NOT_MODEL_INPUTS}
    logits = model(**inputs, use_cache=False).logits.float() / temperature
    targets = next_token_labels(labels, boundaries.cu_seqlens.long())
    scored = targets != IGNORE_INDEX
    token_logps = torch.log_softmax(logits, dim=-1).gather(-1, targets.clamp(min=0)[..., None])[..., 0]
    token_logps = torch.where(scored, token_logps, torch.zeros_like(token_logps))[0]
    if per_token:
        return [sequence[:-1] for sequence in torch.split(token_logps, boundaries.lengths.tolist())]
    owner = boundaries.seq_idx.to(token_logps.device).long()
    sums = torch.zeros(len(boundaries.lengths), dtype=token_logps.dtype, device=token_logps.device)
    return sums.index_add(0, owner, token_logps)
