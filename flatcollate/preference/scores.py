"""Reward models on flattened rows: a sequence-classification head read once per sequence.

transformers' decoder `*ForSequenceClassification` pools each row at its last token that is not `pad_token_id`. A
flattened row holds N sequences, so the model's own forward would give one score for all of them, and
`prepare_model_for_flattening` refuses such a model. `sequence_scores` runs the model's backbone on the flattened row
instead and applies the head (`score`) where each sequence alone would be pooled::

    input_ids      [c0 c1 c2 | d0 d1 | r0 r1 r2 r3 | s0]     (1, T) int64
    cu_seq_lens_q  [0 3 5 9 10]                             (N + 1,) int32
    pooled at            2      4             8    9         -> scores (N, num_labels)

`prepare_reward_model` prepares the backbone for flattened rows and keeps the model's own forward refusing them (it
still runs padded batches, as before).
"""

from collections.abc import Mapping
from typing import Any

import torch
from transformers import PreTrainedModel

from .._conventions import FLASH_KWARG_KEYS
from ..boundaries import Boundaries
from ..modeling import prepare_model_for_flattening
from ..modeling.guard import install_guard
from ..modeling.heads import head_reason
from ..modeling.prepared_state import state_of

HEAD = "score"
"""Attribute of transformers' decoder `*ForSequenceClassification` models that holds the classification head."""

BACKBONE_KEYS = ("input_ids", "position_ids", "seq_idx", *FLASH_KWARG_KEYS, "attention_mask")
"""Batch keys passed to the backbone (an `attention_mask` only so that its guard refuses it, naming the fix)."""


def classifier_parts(model: torch.nn.Module) -> tuple[PreTrainedModel, PreTrainedModel]:
    """`(classifier, backbone)` of a decoder sequence classifier, or of the one a PEFT model wraps.

    The backbone is `getattr(classifier, classifier.base_model_prefix)` (`model.model` for Llama, Qwen2, ...); the head
    is `classifier.score` (under LoRA with `modules_to_save=["score"]`, PEFT's wrapper of it).
    """
    classifier = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
    prefix = getattr(classifier, "base_model_prefix", "")
    backbone = getattr(classifier, prefix, None) if prefix else None
    if not isinstance(getattr(classifier, HEAD, None), torch.nn.Module) or not isinstance(backbone, PreTrainedModel):
        raise TypeError(
            f"{type(classifier).__name__} has no sequence-classification head `{HEAD}` over a backbone: reward scores "
            "are read from transformers' decoder `*ForSequenceClassification` models (e.g. "
            "`AutoModelForSequenceClassification.from_pretrained(name, num_labels=1)`), or a PEFT model wrapping one."
        )
    return classifier, backbone


def prepare_reward_model(model: torch.nn.Module, *, attn_implementation: str | None = "flatcollate") -> torch.nn.Module:
    """Prepare a sequence classifier for `sequence_scores`: its backbone takes flattened rows, its own forward does not.

    The backbone goes through `prepare_model_for_flattening` (packed attention, guard, per-sequence stateful layers),
    on a copy of the config it shared with the classifier: the classifier's own `config._attn_implementation` keeps
    its old name, but its forward runs through the backbone, so on the same backend. That forward gets a guard that
    refuses flattened rows (it would pool N sequences once) and lets padded batches through, which give what they
    gave before.

    Args:
        model: a decoder `*ForSequenceClassification`, or a PEFT model wrapping one (LoRA with
            `modules_to_save=["score"]`), before or after `get_peft_model`; modified in place.
        attn_implementation (`str`, *optional*, defaults to `"flatcollate"`): passed to `prepare_model_for_flattening`;
            `None` keeps the model's backend (e.g. `flash_attention_2`).

    Returns:
        The same model (the PEFT wrapper where one was given).
    """
    classifier, backbone = classifier_parts(model)
    prepare_model_for_flattening(backbone, attn_implementation=attn_implementation)
    reason = head_reason(classifier) or f"its head ({type(classifier).__name__}) reads one position per row"
    install_guard(
        classifier,
        unsupported=f"{reason}, or score each sequence of a flattened row with "
        "`flatcollate.preference.sequence_scores(model, batch)`",
    )
    return model


def pooled_indices(input_ids: torch.Tensor, cu_seqlens: torch.Tensor, pad_token_id: int | None) -> torch.Tensor:
    """Where each sequence of a flattened row is pooled, by the rule transformers applies to one sequence.

    That rule reads the last token that is not `pad_token_id` (the first token when every token is; the last token
    when `pad_token_id` is None). It matters when the pad token is also the end-of-sequence token that ends every
    text (tokenizers without a pad token, which TRL pads with eos): the score is read at the token before it.

    Args:
        input_ids (`torch.Tensor` of shape `(T,)`, int64): the flattened row.
        cu_seqlens (`torch.Tensor` of shape `(N + 1,)`, int32): where the sequences start, then the row's length.
        pad_token_id (`int`, *optional*): the model's `config.pad_token_id`.

    Returns:
        `torch.Tensor` of shape `(N,)`, int64: positions in the row, on `input_ids`' device.

    >>> pooled_indices(torch.tensor([5, 6, 0, 7, 0]), torch.tensor([0, 3, 4, 5]), pad_token_id=0).tolist()
    [1, 3, 4]
    >>> pooled_indices(torch.tensor([5, 6, 0, 7, 0]), torch.tensor([0, 3, 4, 5]), pad_token_id=None).tolist()
    [2, 3, 4]
    """
    # The forward's boundaries when `cu_seqlens` carries them (no host sync), else read from `cu_seqlens`.
    boundaries = Boundaries.from_kwargs({"cu_seq_lens_q": cu_seqlens}, rows=1, length=input_ids.numel())
    bounds = boundaries.cu_seqlens.to(input_ids.device).long()
    starts, ends = bounds[:-1], bounds[1:] - 1
    if pad_token_id is None:
        return ends
    sequence = boundaries.seq_idx.to(bounds.device).long()
    kept = torch.where(input_ids != pad_token_id, torch.arange(boundaries.total, device=bounds.device), -1)
    last = torch.full_like(ends, -1).scatter_reduce(0, sequence, kept, reduce="amax")
    return torch.where(last >= 0, last, starts)


def sequence_scores(model: torch.nn.Module, batch: Mapping[str, Any]) -> torch.Tensor:
    """One score per sequence of a flattened batch, in row order: what the model gives each sequence run alone.

    The backbone runs once on the whole row (`use_cache=False`); the head reads each sequence's pooled token
    (`pooled_indices`: the last one, or the last that is not `pad_token_id`). The scores are computed from the
    backbone and head directly, not through the model's forward (which refuses flattened rows).

    Args:
        model: a decoder `*ForSequenceClassification` (or a PEFT model wrapping one) prepared with
            `prepare_reward_model`.
        batch: a flattened batch as `DataCollatorWithFlattening` or `DataCollatorForRewardPairs` emits it:
            `input_ids` `(1, T)` int64, `position_ids` `(1, T)` int64, `cu_seq_lens_q/k` `(N + 1,)` int32,
            `max_length_q/k` Python ints, optionally `seq_idx` `(1, T)` int32. Other keys (`labels`, `margin`) are
            not read. Every `cu_seq_lens_q` segment is scored: a row padded to a multiple (`pad_to_multiple_of`) ends
            with a padding sequence, which gets the last score.

    Returns:
        `torch.Tensor` of shape `(N, num_labels)`, the head's dtype: row `i` equals `model(input_ids=seq_i).logits`.

    >>> from transformers import AutoModelForSequenceClassification
    >>> from flatcollate import DataCollatorWithFlattening
    >>> from flatcollate.testing import tiny_config
    >>> config = tiny_config("llama", num_labels=1, pad_token_id=0)
    >>> model = prepare_reward_model(AutoModelForSequenceClassification.from_config(config))
    >>> batch = DataCollatorWithFlattening()([{"input_ids": [5, 6, 7]}, {"input_ids": [8, 9]}])
    >>> sequence_scores(model, batch).shape
    torch.Size([2, 1])
    """
    classifier, backbone = classifier_parts(model)
    if getattr(state_of(backbone), "guard", None) is None:
        raise ValueError(
            f"The backbone of {type(classifier).__name__} is not prepared for flattened rows, so its sequences could "
            "attend to each other; call `flatcollate.preference.prepare_reward_model(model)` first."
        )
    input_ids, cu_seqlens = batch.get("input_ids"), batch.get("cu_seq_lens_q")
    if cu_seqlens is None:
        raise ValueError(
            f"The batch has no `cu_seq_lens_q` (keys: {sorted(batch)}); sequence scores are read where each sequence "
            "ends. Collate with `flatcollate.DataCollatorWithFlattening` (`return_flash_attn_kwargs=True`, the "
            "default) or `flatcollate.preference.DataCollatorForRewardPairs`."
        )
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.shape[0] != 1:
        shape = tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
        raise ValueError(
            f"`input_ids` must be one flattened row of shape (1, T), got {shape}; a padded batch goes through the "
            "model's own forward (`model(input_ids=..., attention_mask=...).logits`)."
        )
    inputs = {key: batch[key] for key in BACKBONE_KEYS if batch.get(key) is not None}
    hidden = backbone(**inputs, use_cache=False).last_hidden_state[0]  # (T, hidden_size)
    index = pooled_indices(input_ids[0], cu_seqlens, classifier.config.get_text_config().pad_token_id)
    return getattr(classifier, HEAD)(hidden[index])
