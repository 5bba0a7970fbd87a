"""Run token-mixing layers that carry state from one token to the next once per sequence of a flattened row.

State-space layers (Mamba), linear attention (gated delta rule, lightning attention), RWKV and short convolutions
pass a state or a window along the row. On CPU and without their optional CUDA kernels (mamba-ssm, fla) they take no
sequence boundaries, so in a flattened row the state of one sequence flows into the next. `segment_mixers` wraps
those layers so that, for a flattened batch, each one runs on every sequence of the row on its own (fresh state,
as if the sequence were alone) and the outputs are concatenated back. Everything else in the model (attention
through the packed backend, MLPs, norms) still runs once over the whole row.

The cost is one call of the layer per sequence per layer: exact, and the way to train these families on CPU or
without their kernels; the attention layers of hybrid models keep the packed kernels.
"""

import functools
import itertools
from collections.abc import Callable
from typing import Any

import torch
from transformers import PreTrainedModel
from transformers.modeling_layers import GradientCheckpointingLayer

from .._conventions import FLASH_KWARG_KEYS
from ..families import family_of
from .prepared_state import STATE_ATTRIBUTE, Feature, FlatBatch, add_feature, state_of

_ROW_ONLY_KEYS = frozenset({*FLASH_KWARG_KEYS, "seq_idx"})
"""Keyword arguments that describe the whole row; a layer running on one sequence gets none of them."""


def _slice(value: Any, start: int, end: int, length: int) -> Any:
    """The part of a per-token argument (`(1, T, ...)` tensors, tuples of them) that belongs to tokens start..end."""
    if isinstance(value, torch.Tensor) and value.dim() >= 2 and value.shape[0] == 1 and value.shape[1] == length:
        return value[:, start:end]
    if isinstance(value, tuple) and value and all(isinstance(part, torch.Tensor) for part in value):
        return tuple(_slice(part, start, end, length) for part in value)
    return value


def _concat(outputs: list[Any], lengths: list[int], name: str, *, extra: bool = False) -> Any:
    """Concatenate per-sequence outputs along the token axis (tuples element-wise; `None` stays `None`).

    A tensor that is not per token (attention weights, a final state) cannot be joined: as the main output that is an
    error, as an extra element of a tuple it becomes `None` (layers discard those when the cache is off).
    """
    first = outputs[0]
    if first is None:
        return None
    if isinstance(first, torch.Tensor):
        if any(out.dim() < 2 or out.shape[1] != n for out, n in zip(outputs, lengths, strict=True)):
            if extra:
                return None
            raise ValueError(
                f"{name} returned a tensor that is not per token (shape {tuple(first.shape)}); it cannot be run once "
                "per sequence. Train this model on padded batches."
            )
        return torch.cat(outputs, dim=1)
    if isinstance(first, tuple):
        return tuple(
            _concat(list(parts), lengths, name, extra=extra or position > 0)
            for position, parts in enumerate(zip(*outputs, strict=True))
        )
    raise ValueError(f"{name} returned a {type(first).__name__}; it cannot be run once per sequence.")


class RowBounds:
    """Boundaries of the flattened row the model is running now (`[0, ..., T]`), or None for an ordinary batch.

    One object per prepared model: the guard sets it at every forward (`record`, a `Feature`'s changes) from the
    batch's `Boundaries`, and its wrapped layers read it; `copy.deepcopy` of the model copies it once, so a copy never
    reads the original's row.
    """

    __slots__ = ("bounds", "checkpointed")

    def __init__(self, checkpointed: list[torch.nn.Module]):
        self.bounds: list[int] | None = None
        self.checkpointed = checkpointed

    def record(self, model: torch.nn.Module, arguments: dict, flat: FlatBatch | None) -> dict:
        """Keep the boundaries of this forward's row (None unless it holds several sequences)."""
        bounds = None if flat is None or flat.sliced else flat.boundaries.host
        self.bounds = bounds if bounds is not None and len(bounds) > 2 else None
        if model.training:  # checkpointing may be switched on after prepare (Trainer does so in `train()`)
            for layer in self.checkpointed:
                checkpoint = getattr(layer, "_gradient_checkpointing_func", None)
                if layer.gradient_checkpointing and checkpoint is not None and not hasattr(checkpoint, STATE_ATTRIBUTE):
                    wrapped = functools.partial(_checkpoint_with_bounds, checkpoint, self)
                    setattr(wrapped, STATE_ATTRIBUTE, self)
                    layer._gradient_checkpointing_func = wrapped
        return {}


def _segmented_forward(module: torch.nn.Module, inner: Callable | None, hidden_states: torch.Tensor, *args, **kwargs):
    """`module`'s forward, once per sequence of the current row (`inner` is a forward set on the instance before)."""
    forward = functools.partial(type(module).forward, module) if inner is None else inner
    bounds = getattr(module, STATE_ATTRIBUTE).bounds
    if bounds is None or hidden_states.dim() < 2 or hidden_states.shape[:2] != (1, bounds[-1]):
        return forward(hidden_states, *args, **kwargs)
    length = bounds[-1]
    kwargs = {key: value for key, value in kwargs.items() if key not in _ROW_ONLY_KEYS}
    outputs, lengths = [], []
    for start, end in itertools.pairwise(bounds):  # one call per sequence: fresh state each
        part_args = [_slice(value, start, end, length) for value in args]
        part_kwargs = {key: _slice(value, start, end, length) for key, value in kwargs.items()}
        outputs.append(forward(hidden_states[:, start:end], *part_args, **part_kwargs))
        lengths.append(end - start)
    return _concat(outputs, lengths, type(module).__name__)


def _replay_with_bounds(row: RowBounds, bounds: list[int] | None, function: Callable, *args, **kwargs):
    """Run `function` (a checkpointed layer's forward) with the boundaries of the forward it belongs to."""
    current, row.bounds = row.bounds, bounds
    try:
        return function(*args, **kwargs)
    finally:
        row.bounds = current


def _checkpoint_with_bounds(checkpoint: Callable, row: RowBounds, function: Callable, *args, **kwargs):
    """A layer's `_gradient_checkpointing_func` that saves this forward's boundaries with the recomputed call.

    Gradient checkpointing calls `function` again during backward, possibly after later forwards have changed
    `row.bounds` (two forwards before one backward); the boundaries captured here travel with it.
    """
    return checkpoint(functools.partial(_replay_with_bounds, row, row.bounds, function), *args, **kwargs)


def segment_mixers(model: PreTrainedModel) -> int:
    """Make the stateful token mixers of `model` run once per sequence on flattened batches (in place, once).

    Each wrapped layer's `forward` becomes `functools.partial(_segmented_forward, layer, ...)`, so copies of the model
    run their own layers. Under gradient checkpointing, the boundaries of each forward are saved with the layer's
    recomputation (`_checkpoint_with_bounds`), so two forwards before one backward stay exact.

    Args:
        model (`PreTrainedModel`): a model whose family (or its language model's) has `mixers` (`flatcollate.families`).

    Returns:
        `int`: how many layers were wrapped (0 for other families, or when already done).

    >>> from flatcollate.testing import tiny_causal_lm
    >>> segment_mixers(tiny_causal_lm("mamba"))
    2
    """
    names = family_of(model.config).mixers
    state = state_of(model, create=True)
    if not names or any(feature.name == "state-carrying layers" for feature in state.features):
        return 0
    row = RowBounds([m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)])
    add_feature(model, Feature("state-carrying layers", changes=row.record))
    wrapped = 0
    for module in model.modules():
        if type(module).__name__ in names:
            inner = vars(module).get("forward")  # a forward already set on the instance keeps being called
            setattr(module, STATE_ATTRIBUTE, row)
            module.forward = functools.partial(_segmented_forward, module, inner)
            wrapped += 1
    return wrapped
