"""Which model heads a flattened row can train exactly, and the label rule each one needs.

A flattened row holds N sequences back to back. Heads that predict per token keep them apart once attention does:

    causal LM              logits (1, T, V), labels shifted inside the model: the collator sets each sequence's
                           first label to -100 (`separator_id`), so no prediction crosses a boundary
    token classification   logits (1, T, C), each token labelled in place: every label is kept (`separator_id=None`)

Heads that read one position per row (sequence classification pools at the row's last non-pad token; question
answering and multiple choice index the row) would give one answer for N sequences, so they are refused. Encoder-only
models attend both ways, which the packed kernels (causal) do not compute per sequence; they are refused too.
"""

import warnings

import torch

from .._conventions import IGNORE_INDEX
from .prepared_state import Feature, FlatBatch, add_feature, state_of

ROW_HEADS = ("ForSequenceClassification", "ForQuestionAnswering", "ForMultipleChoice")
"""Class-name endings of heads that read one position per row."""

IN_PLACE_HEADS = ("ForTokenClassification",)
"""Class-name endings of heads whose labels are not shifted: each token is labelled in place."""


def head_reason(model: torch.nn.Module) -> str | None:
    """Why `model`'s head or attention cannot train on flattened rows, or None when it can."""
    name = type(model).__name__
    if name.endswith(ROW_HEADS):
        return (
            f"its head ({name}) reads one position per row (a sequence-classification head pools at the row's last "
            "non-pad token), so a flattened row of N sequences would get one answer; train it on padded batches"
        )
    # Image-text models are judged by their language model (`families`): vision towers attend both ways, and a
    # prefix-LM (PaliGemma) may too.
    composite = model.config.get_text_config() is not model.config
    layers = [module for module in model.modules() if hasattr(module, "is_causal") and module is not model]
    if not composite and layers and not any(module.is_causal for module in layers):
        return (
            f"its attention layers attend both ways ({type(layers[0]).__name__}.is_causal is False: an encoder), and "
            "the packed kernels are causal; flattening applies to causal LMs (for BERT-style causal LMs, set "
            "`config.is_decoder=True`)"
        )
    if getattr(model.config, "is_decoder", None) is False:
        return "its config is an encoder's (`is_decoder=False`); flattening applies to causal LMs"
    return None


def labels_in_place(model: torch.nn.Module) -> bool:
    """Whether `model`'s head labels each token in place (no shift), so every label of a sequence counts."""
    return type(model).__name__.endswith(IN_PLACE_HEADS)


def warn_masked_first_labels(model: torch.nn.Module, arguments: dict, flat: FlatBatch | None) -> dict:
    """Warn (once per model) when a head that labels tokens in place gets a flattened batch whose every sequence
    starts with -100: the causal rule of the collator's default `separator_id` drops one real label per sequence.

    Args:
        model: the prepared top-level model.
        arguments (`dict`): the forward's arguments (reads `labels` `(B, T)`).
        flat (`FlatBatch`, *optional*): the batch's boundaries; None for an ordinary batch.

    Returns:
        `{}`: it changes nothing.
    """
    labels, state = arguments.get("labels"), state_of(model)
    if flat is None or flat.sliced or labels is None or state.warned_labels:
        return {}
    first = labels.reshape(-1)[flat.boundaries.starts.to(labels.device)]
    if first.numel() > 1 and bool((first == IGNORE_INDEX).all()):
        state.warned_labels = True
        warnings.warn(
            f"{type(model).__name__} labels each token in place, and the first label of every sequence of this "
            "flattened batch is -100, as the collator's default sets it for causal LMs (which shift labels). If they "
            "were real labels, they are lost: collate with `DataCollatorWithFlattening(separator_id=None)`.",
            stacklevel=4,
        )
    return {}


def labels_inside_sequences(model: torch.nn.Module, arguments: dict, flat: FlatBatch | None) -> dict:
    """Labels of a flattened batch that never predict across a boundary, whatever labels the batch brings.

    A causal LM shifts labels inside the model: token `t` predicts `labels[t + 1]`, so the label on a sequence's first
    token is what the previous sequence's last token would learn. It becomes -100 (in a new tensor; the batch is left
    as it is), which is what the collator's `separator_id` does, so a batch with `labels = input_ids.clone()` trains
    exactly as each sequence alone::

        labels      [a0 a1 a2 | b0 b1]   ->   [a0 a1 a2 | -100 b1]     a2 no longer learns b0

    Returns:
        `{"labels": ...}` for a flattened batch with integer labels `(B, T)`, else `{}`.
    """
    labels = arguments.get("labels")
    if flat is None or flat.sliced or not isinstance(labels, torch.Tensor) or labels.dtype.is_floating_point:
        return {}
    if labels.numel() != flat.boundaries.total:
        return {}
    starts = flat.boundaries.starts.to(labels.device).reshape(labels.shape)
    return {"labels": labels.masked_fill(starts, IGNORE_INDEX)}


def add_label_warning(model: torch.nn.Module) -> None:
    """Register the label rule of `model`'s head with its guard: labels kept inside their sequence for heads that
    shift them (`labels_inside_sequences`), `warn_masked_first_labels` for heads that label tokens in place."""
    if labels_in_place(model):
        add_feature(model, Feature("masked first labels", changes=warn_masked_first_labels))
    else:
        add_feature(model, Feature("labels inside sequences", changes=labels_inside_sequences))
