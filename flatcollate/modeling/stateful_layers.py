"""Run token-mixing layers that carry state from one token to the next on each sequence of a flattened row alone.

State-space layers (Mamba), linear attention (gated delta rule, lightning attention) and short convolutions pass a
state or a window along the row. On CPU and without their optional CUDA kernels (mamba-ssm, fla) they take no
sequence boundaries, so in a flattened row the state of one sequence flows into the next. `segment_mixers` wraps
those layers so that, for a flattened batch, each sees every sequence on its own (fresh state, as if the sequence
were alone). Everything else in the model (attention through the packed backend, MLPs, norms) still runs once over
the whole row.

Where a family's layers hand the forward's boundaries to optional kernels that take them (`Family.mixer_kernels`:
fla's `chunk_gated_delta_rule(cu_seqlens=...)` and causal-conv1d's `causal_conv1d_fn(seq_idx=...)` for the gated
delta rule) and each is installed with that parameter, `"kernels"` calls the layer once on the whole row, its
boundaries in the keyword arguments; `"auto"` (the default) takes it there, and `"per_sequence"` elsewhere.
`"per_sequence"` calls the layer once per sequence. `"batched"` lays the row's sequences out as a right-padded batch
(`Boundaries.padded()`), calls the layer once and gathers the outputs back: these layers are causal, so the padding
after a sequence changes nothing before it. Both are exact; on a CPU, with transformers' own PyTorch paths of these
layers, the per-sequence calls are the faster (docs/attention.md gives the figures)::

    row       [a0 a1 a2 | b0 | c0 c1]          batched   [a0 a1 a2]   one call, outputs at the valid
                                                         [b0 .  . ]   tokens gathered back in row order
                                                         [c0 c1 . ]
"""

import functools
import itertools
from collections.abc import Callable
from typing import Any

import torch
from transformers import PreTrainedModel
from transformers.modeling_layers import GradientCheckpointingLayer

from .._conventions import BOUNDARIES_KEY, FLASH_KWARG_KEYS, HOST_BOUNDARIES_KEY
from ..attention.capabilities import exposed, parameters
from ..boundaries import Boundaries
from ..families import family_of, is_mixer
from ..forward_slot import forward_slot, run_with_slot, saved_slot
from .prepared_state import Feature, FlatBatch, add_feature, state_of

_ROW_ONLY_KEYS = frozenset({*FLASH_KWARG_KEYS, "seq_idx", BOUNDARIES_KEY, HOST_BOUNDARIES_KEY})
"""Keyword arguments that describe the whole row; a layer running on one sequence gets none of them."""


def _slice(value: Any, start: int, end: int, length: int) -> Any:
    """The part of a per-token argument (`(1, T, ...)` tensors, tuples of them) that belongs to tokens start..end."""
    if isinstance(value, torch.Tensor) and value.dim() >= 2 and value.shape[0] == 1 and value.shape[1] == length:
        return value[:, start:end]
    if isinstance(value, tuple) and value and all(isinstance(part, torch.Tensor) for part in value):
        return tuple(_slice(part, start, end, length) for part in value)
    return value


def _lay_out(value: Any, index: torch.Tensor, length: int) -> Any:
    """A per-token argument (`(1, T, ...)` tensors, tuples of them) laid out as the padded batch `(N, L, ...)`."""
    if isinstance(value, torch.Tensor) and value.dim() >= 2 and value.shape[0] == 1 and value.shape[1] == length:
        return value[0][index]
    if isinstance(value, tuple) and value and all(isinstance(part, torch.Tensor) for part in value):
        return tuple(_lay_out(part, index, length) for part in value)
    return value


def _gather_back(output: Any, valid: torch.Tensor, name: str, *, extra: bool = False) -> Any:
    """The padded batch's outputs `(N, L, ...)` at its valid tokens, back in row order `(1, T, ...)` (tuples
    element-wise). A tensor that is not per token is an error as the main output, `None` as an extra one."""
    if output is None:
        return None
    if isinstance(output, torch.Tensor):
        if output.dim() < 2 or output.shape[:2] != valid.shape:
            if extra:
                return None
            raise ValueError(
                f"{name} returned a tensor that is not per token (shape {tuple(output.shape)}); it cannot run on the "
                "row's sequences alone. Train this model on padded batches."
            )
        return output[valid][None]
    if isinstance(output, tuple):
        return tuple(_gather_back(part, valid, name, extra=extra or i > 0) for i, part in enumerate(output))
    raise ValueError(f"{name} returned a {type(output).__name__}; it cannot run on the row's sequences alone.")


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


def keep_slot_for_recompute(model: torch.nn.Module, arguments: dict, flat: FlatBatch | None) -> dict:
    """A `Feature`'s changes: in training, give every checkpointed layer a `_gradient_checkpointing_func` that saves
    the forward's slot with the recomputed call (`_checkpoint_with_slot`). Checkpointing may be switched on after
    prepare (Trainer does so in `train()`), so this runs at every forward; a layer is wrapped once."""
    if model.training:
        for layer in model.modules():
            checkpoint = getattr(layer, "_gradient_checkpointing_func", None)
            if not isinstance(layer, GradientCheckpointingLayer) or not layer.gradient_checkpointing:
                continue
            done = isinstance(checkpoint, functools.partial) and checkpoint.func is _checkpoint_with_slot
            if checkpoint is None or done:
                continue
            layer._gradient_checkpointing_func = functools.partial(_checkpoint_with_slot, checkpoint)
    return {}


def _segmented_forward(
    module: torch.nn.Module,
    owner: torch.nn.Module,
    inner: Callable | None,
    mode: str,
    hidden_states: torch.Tensor,
    *args,
    **kwargs,
):
    """`module`'s forward on every sequence of the flattened row `owner` (the prepared model) is running now alone,
    as its forward's slot says (`inner` is a forward set on the instance before): one call on the row laid out as a
    padded batch (`mode="batched"`), or one call per sequence (`"per_sequence"`)."""
    forward = functools.partial(type(module).forward, module) if inner is None else inner
    boundaries = forward_slot(owner)
    if boundaries is None or hidden_states.dim() < 2 or hidden_states.shape[:2] != (1, boundaries.total):
        return forward(hidden_states, *args, **kwargs)
    if mode == "kernels":  # the layer hands the row's boundaries to kernels that take them: one call on the row
        row = {"cu_seq_lens_q": boundaries.cu_seqlens, "seq_idx": boundaries.seq_idx[None]}
        return forward(hidden_states, *args, **{**kwargs, **row})
    bounds = boundaries.host
    if len(bounds) <= 2:  # one sequence: nothing to keep apart
        return forward(hidden_states, *args, **kwargs)
    length = bounds[-1]
    kwargs = {key: value for key, value in kwargs.items() if key not in _ROW_ONLY_KEYS}
    if mode == "batched":
        index, valid = boundaries.view("padded", Boundaries.padded)
        laid_out = [_lay_out(value, index, length) for value in args]
        named = {key: _lay_out(value, index, length) for key, value in kwargs.items()}
        return _gather_back(forward(hidden_states[0][index], *laid_out, **named), valid, type(module).__name__)
    outputs, lengths = [], []
    for start, end in itertools.pairwise(bounds):  # one call per sequence: fresh state each
        part_args = [_slice(value, start, end, length) for value in args]
        part_kwargs = {key: _slice(value, start, end, length) for key, value in kwargs.items()}
        outputs.append(forward(hidden_states[:, start:end], *part_args, **part_kwargs))
        lengths.append(end - start)
    return _concat(outputs, lengths, type(module).__name__)


def _checkpoint_with_slot(checkpoint: Callable, function: Callable, *args, **kwargs):
    """A layer's `_gradient_checkpointing_func` that saves this forward's slot with the recomputed call.

    Gradient checkpointing calls `function` again during backward, after the forward's slot was cleared, possibly
    after later forwards (two forwards before one backward); the slot saved here travels with it.
    """
    return checkpoint(functools.partial(run_with_slot, saved_slot(), function), *args, **kwargs)


MODES = ("auto", "kernels", "per_sequence", "batched")
"""How a wrapped layer runs a flattened row's sequences: once on the row through its own kernels, one call each, or
one call on them as a padded batch; `"auto"` is `"kernels"` where they are installed, else `"per_sequence"`."""


def missing_kernels(model: PreTrainedModel) -> list[str] | None:
    """What the mixers of `model` lack to run a row through their own kernels: each `module.function(parameter)` of
    `Family.mixer_kernels` that is not installed or takes no such parameter (`[]`: nothing lacks). `None` where the
    family's layers hand no boundaries to kernels. Read from what each installed function exposes, as
    transformers' kernel fallbacks resolve it (`use_kernel_func_from_hub_with_fallback`).

    >>> from flatcollate.testing import tiny_causal_lm
    >>> missing_kernels(tiny_causal_lm("mamba")) is None, missing_kernels(tiny_causal_lm("qwen3_next"))[-1]
    (True, 'fla.ops.gated_delta_rule.chunk_gated_delta_rule(cu_seqlens)')
    """
    kernels = family_of(model).mixer_kernels
    if not kernels:
        return None
    return [
        f"{module}.{function}({parameter})"
        for module, function, parameter in kernels
        if parameter not in parameters(exposed(module, function))
    ]


def segment_mixers(model: PreTrainedModel, *, mode: str = "auto") -> int:
    """Make the stateful token mixers of `model` run once per sequence on flattened batches (in place, once).

    The layers are found from the model's modules (`flatcollate.families.is_mixer`: a known mixer class or a subclass
    of one), not from its `model_type`. Each wrapped layer's `forward` becomes `functools.partial(_segmented_forward,
    layer, model, ...)`, which reads the boundaries of `model`'s forward in flight from the forward's slot; copies of
    the model run their own layers. Under gradient checkpointing, each forward's slot is saved with the layer's
    recomputation (`_checkpoint_with_slot`), so two forwards before one backward stay exact.

    Args:
        model (`PreTrainedModel`): the prepared top-level model.
        mode (`str`): `"auto"` (the layers' own kernels where installed, else one call per sequence), `"kernels"`
            (those kernels, or `ValueError` naming what is missing), `"per_sequence"` or `"batched"` (one call per
            layer on the sequences as a padded batch).

    Returns:
        `int`: how many layers were wrapped (0 for other families, or when already done).

    >>> from flatcollate.testing import tiny_causal_lm
    >>> segment_mixers(tiny_causal_lm("mamba"))
    2
    """
    state = state_of(model, create=True)
    mixers = [module for module in model.modules() if is_mixer(module)]
    if not mixers or any(feature.name == "state-carrying layers" for feature in state.features):
        return 0
    if mode not in MODES:
        raise ValueError(f"`mode` must be one of {MODES}, got {mode!r}.")
    if mode in ("auto", "kernels"):
        missing = missing_kernels(model)
        if mode == "kernels" and missing != []:
            lacking = f"it lacks {', '.join(missing)}" if missing else "its layers hand no boundaries to kernels"
            raise ValueError(
                f"mode='kernels' runs each state-carrying layer once on the row through its own kernels, but {lacking} "
                "(install flash-linear-attention and causal-conv1d on a GPU). Use mode='auto', 'per_sequence' or "
                "'batched'."
            )
        mode = "kernels" if missing == [] else "per_sequence"
    add_feature(model, Feature("state-carrying layers", changes=keep_slot_for_recompute))
    for module in mixers:
        inner = vars(module).get("forward")  # a forward already set on the instance keeps being called
        module.forward = functools.partial(_segmented_forward, module, model, inner, mode)
    return len(mixers)
