"""A guard in front of a model's forward that refuses the arguments which make a flattened batch attend across
sequences.

Which arguments a batch carries decide what it is (`is_flattened`): boundaries (`cu_seq_lens_*`, `seq_idx`) make it
flattened; otherwise an attention mask or a cache makes it ordinary, let through unchecked (padded batches,
`generate()` with any cache); otherwise `position_ids` that restart make it flattened. transformers keeps the
sequences of a flattened row apart only when no `attention_mask` and no cache are present, so boundaries together
with either one are refused. A flattened batch has its boundaries cross-checked against its `position_ids`, and gets
restarting positions when it has none (`boundary_check`). An ordinary call costs nothing: the guard looks at tensor
data only when one of those arguments is present, on the top-level model, never per layer.
"""

import functools
import inspect
from collections.abc import Callable

import torch
from transformers import PreTrainedModel

from ..attention import ATTN_IMPLEMENTATION
from ..boundaries import position_starts
from .boundary_check import BOUNDARY_KEYS, check_boundaries
from .prepared_state import STATE_ATTRIBUTE, FlatBatch, PreparedState, check_in_force, state_of
from .support import row_length_limit

_ORDINARY_KEYS = ("attention_mask", "past_key_values", "cache_position")
"""Arguments that make a batch without boundaries an ordinary one: a mask, a cache, or positions in a cache."""

DATA_COLUMNS = ("seq_lengths", "completion_mask", "assistant_masks")
"""Per-example fields a flattening collator consumes. A prepared model declares them in its forward signature so that
`Trainer(remove_unused_columns=True)`, the default, keeps them for the collator; they never reach the model itself."""


def is_flattened(arguments: dict) -> bool:
    """Whether a forward's arguments describe a flattened batch, read from which arguments the batch carries.

    A flattened batch carries boundaries (`cu_seq_lens_*`, `max_length_*`, `seq_idx`), or, with no attention mask
    and no cache, `position_ids` `(B, T)` that restart inside a row (transformers' own padding-free collator). A batch
    with an `attention_mask` of any form (2-D, 4-D, a dict of masks per layer type), `past_key_values` or
    `cache_position` and no boundaries is an ordinary batch, whatever its positions: the mask or the cache says which
    tokens see which (static-cache `generate()` numbers a left-padded row `[0 0 0 1 2 ...]`), and the guard lets it
    through unchecked, as the unprepared model would take it.

    >>> is_flattened({"position_ids": torch.tensor([[0, 1, 2, 0, 1]])})
    True
    >>> is_flattened({"position_ids": torch.tensor([[0, 1, 2, 3, 4]])})
    False
    >>> mask = torch.ones(1, 1, 5, 5, dtype=torch.bool).tril()  # a 4-D mask says which tokens see which
    >>> is_flattened({"position_ids": torch.tensor([[0, 0, 0, 1, 2]]), "attention_mask": mask})
    False
    """
    if any(arguments.get(key) is not None for key in BOUNDARY_KEYS):
        return True
    if any(arguments.get(key) is not None for key in _ORDINARY_KEYS):
        return False
    position_ids = arguments.get("position_ids")
    if not isinstance(position_ids, torch.Tensor) or position_ids.dim() != 2 or position_ids.shape[-1] < 2:
        return False
    return bool(position_starts(position_ids).reshape(position_ids.shape)[:, 1:].any())  # a restart inside a row


def _offending(arguments: dict) -> list[str]:
    """Arguments that make sequences of a flattened row see each other; checked without touching tensor data."""
    found = []
    if arguments.get("attention_mask") is not None:
        found.append("an `attention_mask` is passed (it turns off packed-sequence detection)")
    if arguments.get("use_cache"):
        found.append("`use_cache=True` (the cache turns off packed-sequence detection)")
    if arguments.get("past_key_values") is not None:
        found.append("`past_key_values` is given (a cache mixes the sequences' keys)")
    return found


def _check_row_length(model, limit: tuple | None, arguments: dict) -> None:
    """Raise for a row longer than a buffer the family sizes by its config (`Family.row_length_limit`)."""
    if limit is None:
        return
    key, tokens, what = limit
    for name in ("input_ids", "inputs_embeds"):
        value = arguments.get(name)
        if isinstance(value, torch.Tensor) and value.dim() >= 2 and value.shape[1] > tokens:
            raise ValueError(
                f"{type(model).__name__} sizes {what} by `config.{key}`={tokens} tokens per row, and this row has "
                f"{value.shape[1]} tokens; restarting positions do not lift that limit. Flatten at most {tokens} "
                f"tokens per batch (e.g. `TokenBudgetBatchSampler(..., max_tokens={tokens})` or "
                f"`pack_dataset(..., pack_len={tokens})`), or raise `config.{key}` where the family allows it."
            )


def _flat_batch(model, state: PreparedState, arguments: dict, positions: torch.Tensor | None) -> FlatBatch:
    """The batch's one `Boundaries` (checked, or a feature's), carried by the tensors the layers will read."""
    splitter = next((feature.boundaries for feature in state.features if feature.boundaries is not None), None)
    flat = splitter(model, arguments) if splitter is not None else check_boundaries(arguments, positions)
    if not flat.sliced:  # a slice's positions are its own; its `cu_seq_lens` (the whole row's) carry
        flat.boundaries.carry(flat.positions)
    flat.boundaries.carry(arguments.get("cu_seq_lens_q"), arguments.get("cu_seq_lens_k"))
    return flat


def _check_arguments(model, state: PreparedState, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
    """Raise for arguments that would mix sequences; the completed `(args, kwargs)`, or None to keep them."""
    # Arguments given by position (`model(ids, ...)`) are checked as if given by name.
    arguments = {**state.signature.bind_partial(*args).arguments, **kwargs} if args else kwargs
    reached = [key for key in DATA_COLUMNS if arguments.get(key) is not None]
    if reached:
        raise ValueError(
            f"{type(model).__name__} got {reached}: these per-example fields are for the collator, which folds them "
            "into `labels` and the batch's boundaries. Collate with `flatcollate.DataCollatorWithFlattening` (or "
            "`DataCollatorForCompletionOnlyLM`) instead of passing them to the model."
        )
    _check_row_length(model, state.row_limit, arguments)
    positions = arguments.get("position_ids")
    for feature in state.features:
        if feature.text_positions is not None:  # e.g. the text row of 3-D rotary positions
            positions = feature.text_positions(model, arguments)
    has_boundaries = any(arguments.get(key) is not None for key in BOUNDARY_KEYS)  # no tensor data read
    flattened = has_boundaries or is_flattened({**arguments, "position_ids": positions})
    if state.unsupported is not None and flattened:
        raise ValueError(
            f"{type(model).__name__} got a flattened batch, but family {model.config.model_type!r} cannot keep "
            f"sequences apart: {state.unsupported}. Use padded batches for this model."
        )
    found = _offending(arguments)
    if found and flattened:
        raise ValueError(
            f"{type(model).__name__} got a flattened batch (sequences back to back in one row) but "
            + "; ".join(found)
            + ". Sequences would attend to each other. Call the model with `use_cache=False`, no `attention_mask` and "
            "no `past_key_values` (the flattening collators emit none of them), e.g. `model(**batch, use_cache=False)`."
        )
    changes, flat = {}, None
    if flattened:
        check_in_force(model)
        flat = _flat_batch(model, state, arguments, positions)
        if flat.derived:
            changes["position_ids"] = flat.positions
        packed = model.config.get_text_config()._attn_implementation == ATTN_IMPLEMENTATION
        given = arguments.get("cu_seq_lens_q") is not None or arguments.get("cu_seq_lens_k") is not None
        if packed and not given and not flat.sliced and state.takes_kwargs:
            # Layers that never see positions (RoBERTa's) get the boundaries; every layer reads the same object.
            changes.update(flat.boundaries.kwargs())
    for feature in state.features:
        if feature.changes is not None:
            changes.update(feature.changes(model, arguments, flat))
    cache_by_default = arguments.get("use_cache") is None and getattr(model.config, "use_cache", False)
    if cache_by_default and not found and flattened:
        # The config's default would build a cache, which turns off packed-sequence detection: a training batch needs
        # none, so a flattened batch runs without one (the config itself stays as saved).
        if not state.takes_use_cache:
            raise ValueError(
                f"{type(model).__name__} got a flattened batch while `config.use_cache` is on, and its forward takes "
                "no `use_cache`; set `model.config.use_cache = False` for training."
            )
        changes["use_cache"] = False
    if not changes and not kwargs.keys() & set(DATA_COLUMNS):
        return None
    kwargs = {key: value for key, value in kwargs.items() if key not in DATA_COLUMNS}
    given_positionally = state.signature.bind_partial(*args).arguments.keys() & changes.keys()
    if given_positionally:  # passed as None by position: rebind so that nothing is given twice
        bound = state.signature.bind_partial(*args, **kwargs)
        bound.arguments.update(changes)
        return bound.args, bound.kwargs
    return args, {**kwargs, **changes}


class GuardHandle:
    """What `install_guard` returns: `remove()` gives `model` back its forward, unguarded."""

    def __init__(self, model: torch.nn.Module, previous: Callable | None, hooks: list):
        self._model, self._previous, self._hooks = model, previous, hooks

    def remove(self) -> None:
        for hook in self._hooks:
            hook.remove()
        vars(self._model).pop("forward", None)
        if self._previous is not None:
            self._model.forward = self._previous
        state_of(self._model).guard = None


@torch.compiler.disable  # under `torch.compile`: checked eagerly, once per forward, never traced into the graph
def _run_before_forward(model, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    changed = _check_arguments(model, vars(model)[STATE_ATTRIBUTE], args, kwargs)
    return (args, kwargs) if changed is None else changed


def _guard_pre_hook(model, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The guard on `model(...)`: runs even when another library replaces `model.forward` later."""
    args, kwargs = _run_before_forward(model, args, kwargs)
    vars(model)[STATE_ATTRIBUTE].checked = True  # `_guarded_forward` need not check this call again
    return args, kwargs


def _clear_checked(model, args: tuple, output):
    vars(model)[STATE_ATTRIBUTE].checked = False  # the call is over, whichever forward ran


def _guarded_forward(model: torch.nn.Module, inner: Callable | None, *args, **kwargs):
    """`model`'s forward behind the guard, for wrappers that call `model.forward(...)` directly (PEFT's LoRA model
    does), which skips forward pre-hooks; a call that came through `model(...)` was checked by the pre-hook."""
    state = vars(model)[STATE_ATTRIBUTE]
    if state.checked:
        state.checked = False
    else:
        args, kwargs = _run_before_forward(model, args, kwargs)
    if inner is None:
        return type(model).forward(model, *args, **kwargs)
    return inner(*args, **kwargs)


def install_guard(model: torch.nn.Module, *, unsupported: str | None = None) -> GuardHandle:
    """Put the flattened-batch guard in front of `model.forward` (once; a second call returns the first handle).

    The guard runs as a forward pre-hook (so it stays when a library such as TRL replaces `model.forward` afterwards)
    and inside the guarded `forward`, `functools.partial(_guarded_forward, model, ...)`, for wrappers that call
    `model.forward(...)` directly (PEFT); each call is checked once. The partial rebinds to the copy under
    `copy.deepcopy` and pickling. Its `__signature__` is the model's, plus the collator's per-example fields
    (`DATA_COLUMNS`) as keyword-only arguments: `transformers.Trainer` keeps only the dataset columns that
    `inspect.signature(model.forward)` names, so without them its default `remove_unused_columns=True` would drop
    `seq_lengths` and the masks before the collator sees them, and packed sequences or prompts would be trained
    silently. The fields never reach the model: the guard refuses them.

    Args:
        model (`torch.nn.Module`): the top-level model.
        unsupported (`str`, *optional*): why the family cannot be exact; then every flattened batch is refused
            (one check of `position_ids` per forward).

    Returns:
        `GuardHandle`: `handle.remove()` uninstalls the guard.
    """
    state = state_of(model, create=True)
    state.unsupported = unsupported
    state.row_limit = row_length_limit(model) if isinstance(model, PreTrainedModel) else None
    if state.guard is not None:
        return state.guard
    signature = inspect.signature(model.forward)
    parameters = signature.parameters
    state.signature = signature
    state.takes_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    state.takes_use_cache = "use_cache" in parameters or state.takes_kwargs
    previous = vars(model).get("forward")
    inner = previous  # a forward another library set on the instance (TRL's fused loss) keeps being called
    if inspect.ismethod(previous) and previous.__self__ is model and previous.__func__ is type(model).forward:
        inner = None
    variadic = [p for p in parameters.values() if p.kind is inspect.Parameter.VAR_KEYWORD]
    fixed = [p for p in parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    keyword = inspect.Parameter.KEYWORD_ONLY
    extra = [inspect.Parameter(n, keyword, default=None) for n in DATA_COLUMNS if n not in parameters]
    forward = functools.partial(_guarded_forward, model, inner)
    forward.__signature__ = signature.replace(parameters=fixed + extra + variadic)
    model.forward = forward
    hooks = [
        model.register_forward_pre_hook(_guard_pre_hook, with_kwargs=True),
        model.register_forward_hook(_clear_checked),
    ]
    state.guard = GuardHandle(model, previous, hooks)
    return state.guard
