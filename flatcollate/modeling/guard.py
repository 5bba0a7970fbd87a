"""A guard in front of a model's forward that refuses the arguments which make a flattened batch attend across
sequences.

What a batch states decides what it is (`is_flattened`): boundaries (`cu_seq_lens_*`, `seq_idx`) make it flattened; a
cache or a 4-D mask makes it ordinary (`generate()`, a caller's own attention pattern); otherwise `position_ids` that
restart between two attended tokens of a row make it flattened whatever its 2-D mask (all ones, zeros on padding,
sequence ids): the guard checks that the mask agrees (`boundary_check.check_mask`) and runs the batch without it.
Boundaries together with a mask or a cache are refused. A flattened batch has its boundaries cross-checked against its
`position_ids` and gets restarting positions when it has none; features add the rest (labels that never predict
across a boundary, `heads`).

The guard builds the forward's one `Boundaries` and hands it on explicitly, in the forward's keyword arguments
(`BOUNDARIES_KEY`) and in the slot scoped to the forward (`flatcollate.forward_slot`). An ordinary call costs nothing:
the guard reads tensor data only when one of those arguments is present, on the top-level model, never per layer.
"""

import functools
import inspect
from collections.abc import Callable

import torch
from transformers import PreTrainedModel

from .._conventions import BOUNDARIES_KEY, CU_SEQLENS_DTYPE, HOST_BOUNDARIES_KEY
from ..attention import ATTN_IMPLEMENTATION
from ..boundaries import Boundaries, position_starts
from ..forward_slot import enter_forward, leave_forward
from .boundary_check import BOUNDARY_KEYS, check_boundaries, check_mask, packed_under_mask, token_count
from .prepared_state import STATE_ATTRIBUTE, FlatBatch, PreparedState, check_in_force, state_of
from .support import check_row_length, row_length_limit

_CACHE_KEYS = ("past_key_values", "cache_position")
"""Arguments that make a batch without boundaries an ordinary one: a cache, or positions in a cache."""

DATA_COLUMNS = ("seq_lengths", "completion_mask", "assistant_masks")
"""Per-example fields a flattening collator consumes. A prepared model declares them in its forward signature so that
`Trainer(remove_unused_columns=True)`, the default, keeps them for the collator; they never reach the model itself."""


def is_flattened(arguments: dict) -> bool:
    """Whether a forward's arguments describe a flattened batch, read from what the batch states.

    A flattened batch carries boundaries (`cu_seq_lens_*`, `max_length_*`, `seq_idx`), or `position_ids` `(B, T)`
    that restart between two attended tokens of a row (transformers' own padding-free collator, and packing
    collators that add a mask of ones, of zeros on padding, or of sequence ids). A batch with `past_key_values` or
    `cache_position`, or with a mask that is not 2-D (4-D, a dict per layer type), and no boundaries is an ordinary
    batch: the cache or the mask says which tokens see which, and the guard lets it through unchecked. Left padding
    (positions restarting only where a 2-D mask goes from 0 to 1) is ordinary too.

    >>> is_flattened({"position_ids": torch.tensor([[0, 1, 2, 0, 1]])})
    True
    >>> is_flattened({"position_ids": torch.tensor([[0, 1, 2, 0, 1]]), "attention_mask": torch.ones(1, 5)})
    True
    >>> left_padded = torch.tensor([[0, 0, 1, 1, 1]])
    >>> is_flattened({"position_ids": torch.tensor([[1, 1, 0, 1, 2]]), "attention_mask": left_padded})
    False
    >>> mask = torch.ones(1, 1, 5, 5, dtype=torch.bool).tril()  # a 4-D mask says which tokens see which
    >>> is_flattened({"position_ids": torch.tensor([[0, 0, 0, 1, 2]]), "attention_mask": mask})
    False
    """
    if any(arguments.get(key) is not None for key in BOUNDARY_KEYS):
        return True
    if any(arguments.get(key) is not None for key in _CACHE_KEYS):
        return False
    position_ids, mask = arguments.get("position_ids"), arguments.get("attention_mask")
    if not isinstance(position_ids, torch.Tensor) or position_ids.dim() != 2 or position_ids.shape[-1] < 2:
        return False
    if mask is None:
        return bool(position_starts(position_ids).reshape(position_ids.shape)[:, 1:].any())  # a restart in a row
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2:
        return False
    if position_ids.shape != mask.shape:
        position_ids = position_ids.expand(mask.shape)
    return packed_under_mask(position_ids.to(mask.device), mask)


def _offending(arguments: dict, *, mask_checked: bool) -> list[str]:
    """Arguments that make sequences of a flattened row see each other; checked without touching tensor data."""
    found = []
    if arguments.get("attention_mask") is not None and not mask_checked:
        found.append("an `attention_mask` is passed (it turns off packed-sequence detection)")
    if arguments.get("use_cache"):
        found.append("`use_cache=True` (the cache turns off packed-sequence detection)")
    if arguments.get("past_key_values") is not None:
        found.append("`past_key_values` is given (a cache mixes the sequences' keys)")
    return found


def _flat_batch(model, state: PreparedState, arguments: dict, positions, restarting) -> FlatBatch:
    """The batch's one `Boundaries`: checked (`restarting`, those of its positions when they alone say where its
    sequences start), or a feature's (a sequence-parallel slice)."""
    splitter = next((feature.boundaries for feature in state.features if feature.boundaries is not None), None)
    if splitter is not None:
        return splitter(model, arguments)
    return check_boundaries(arguments, positions, restarting=restarting)


def _check_arguments(model, state: PreparedState, args: tuple, kwargs: dict) -> tuple[tuple, dict, FlatBatch | None]:
    """Raise for arguments that would mix sequences; the completed `(args, kwargs)` and the batch's `FlatBatch` (None
    for an ordinary batch)."""
    # Arguments given by position (`model(ids, ...)`) are checked as if given by name.
    arguments = {**state.signature.bind_partial(*args).arguments, **kwargs} if args else kwargs
    reached = [key for key in DATA_COLUMNS if arguments.get(key) is not None]
    if reached:
        raise ValueError(
            f"{type(model).__name__} got {reached}: these per-example fields are for the collator, which folds them "
            "into `labels` and the batch's boundaries. Collate with `flatcollate.DataCollatorWithFlattening` (or "
            "`DataCollatorForCompletionOnlyLM`) instead of passing them to the model."
        )
    check_row_length(model, state.row_limit, arguments)
    positions = arguments.get("position_ids")
    for feature in state.features:
        if feature.text_positions is not None:  # e.g. the text row of 3-D rotary positions
            positions = feature.text_positions(model, arguments)
    rows_of_positions = isinstance(positions, torch.Tensor) and positions.dim() == 2
    if rows_of_positions and positions.shape[0] == 1 and (rows := token_count(arguments, positions)[0]) > 1:
        positions = positions.expand(rows, positions.shape[1])  # one row of positions shared by every row
    has_boundaries = any(arguments.get(key) is not None for key in BOUNDARY_KEYS)  # no tensor data read
    restarting = None  # without boundaries, a mask or a cache, the boundaries of the positions decide (one copy)
    unmasked = arguments.get("attention_mask") is None and not any(arguments.get(k) is not None for k in _CACHE_KEYS)
    if not has_boundaries and unmasked and rows_of_positions:
        restarting = Boundaries.from_position_ids(positions.to(token_count(arguments, positions)[2]))
        flattened = len(restarting.host) - 1 > positions.shape[0]  # more sequences than rows
    else:
        flattened = has_boundaries or is_flattened({**arguments, "position_ids": positions})
    if state.unsupported is not None and flattened:
        raise ValueError(
            f"{type(model).__name__} got a flattened batch, but family {model.config.model_type!r} cannot keep "
            f"sequences apart: {state.unsupported}. Use padded batches for this model."
        )
    mask = arguments.get("attention_mask")
    mask_checked = flattened and not has_boundaries and isinstance(mask, torch.Tensor)
    if mask_checked:  # restarting positions under a 2-D mask: the mask must agree, then the boundaries replace it
        check_mask(positions.to(mask.device), mask)
    found = _offending(arguments, mask_checked=mask_checked)
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
        flat = _flat_batch(model, state, arguments, positions, restarting)
        if flat.derived:
            changes["position_ids"] = flat.positions
        if mask_checked:
            changes["attention_mask"] = None
        packed = model.config.get_text_config()._attn_implementation == ATTN_IMPLEMENTATION
        if packed and not flat.sliced and state.takes_kwargs:
            # Every layer reads this one object (and its `cu_seq_lens`, for layers that never see positions).
            changes.update(flat.boundaries.kwargs())
            changes[BOUNDARIES_KEY] = flat.boundaries
            changes[HOST_BOUNDARIES_KEY] = torch.tensor(flat.boundaries.host, dtype=CU_SEQLENS_DTYPE)  # for compile
    for feature in state.features:
        if feature.changes is not None:
            changes.update(feature.changes(model, arguments, flat))
    text_config = model.config.get_text_config()
    cache_on = getattr(model.config, "use_cache", None) or getattr(text_config, "use_cache", None)
    cache_by_default = arguments.get("use_cache") is None and bool(cache_on)
    if cache_by_default and not found and flattened:
        # The config's default (the language model's, in a composite model) would build a cache, which turns off
        # packed-sequence detection: a training batch needs none, so a flattened batch runs without one (the config
        # itself stays as saved).
        if not state.takes_use_cache:
            raise ValueError(
                f"{type(model).__name__} got a flattened batch while `config.use_cache` is on, and its forward takes "
                "no `use_cache`; set `model.config.use_cache = False` for training."
            )
        changes["use_cache"] = False
    if not changes and not kwargs.keys() & set(DATA_COLUMNS):
        return args, kwargs, flat
    kwargs = {key: value for key, value in kwargs.items() if key not in DATA_COLUMNS}
    given_positionally = state.signature.bind_partial(*args).arguments.keys() & changes.keys()
    if given_positionally:  # passed by position: rebind so that nothing is given twice
        bound = state.signature.bind_partial(*args, **kwargs)
        bound.arguments.update(changes)
        return bound.args, bound.kwargs, flat
    return args, {**kwargs, **changes}, flat


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
    """Check the call, then open its slot (`flatcollate.boundaries.forward_slot`) until `_run_after_forward`."""
    state = vars(model)[STATE_ATTRIBUTE]
    args, kwargs, flat = _check_arguments(model, state, args, kwargs)
    state.tokens.append(enter_forward(model, None if flat is None or flat.sliced else flat.boundaries))
    return args, kwargs


@torch.compiler.disable
def _run_after_forward(model) -> None:
    token = vars(model)[STATE_ATTRIBUTE].tokens.pop()
    if token is not None:
        leave_forward(token)


def _guard_pre_hook(model, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The guard on `model(...)`: runs even when another library replaces `model.forward` later."""
    try:
        args, kwargs = _run_before_forward(model, args, kwargs)
    except BaseException:  # refused: the post-hook still runs (`always_call`), with no slot to give back
        vars(model)[STATE_ATTRIBUTE].tokens.append(None)
        raise
    vars(model)[STATE_ATTRIBUTE].checked = True  # `_guarded_forward` need not check this call again
    return args, kwargs


def _guard_post_hook(model, args: tuple, output):
    vars(model)[STATE_ATTRIBUTE].checked = False  # the call is over, whichever forward ran (or raised)
    _run_after_forward(model)


def _guarded_forward(model: torch.nn.Module, inner: Callable | None, *args, **kwargs):
    """`model`'s forward behind the guard, for wrappers that call `model.forward(...)` directly (PEFT's LoRA model
    does), which skips forward hooks; a call that came through `model(...)` was checked by the pre-hook."""
    state = vars(model)[STATE_ATTRIBUTE]
    direct = not state.checked
    state.checked = False
    if direct:
        args, kwargs = _run_before_forward(model, args, kwargs)
    try:
        if inner is None:
            return type(model).forward(model, *args, **kwargs)
        return inner(*args, **kwargs)
    finally:
        if direct:
            _run_after_forward(model)


def install_guard(model: torch.nn.Module, *, unsupported: str | None = None) -> GuardHandle:
    """Put the flattened-batch guard in front of `model.forward` (once; a second call returns the first handle).

    The guard runs as a forward pre-hook (so it stays when a library such as TRL replaces `model.forward` afterwards)
    and inside the guarded `forward`, `functools.partial(_guarded_forward, model, ...)`, for wrappers that call
    `model.forward(...)` directly (PEFT); each call is checked once. The partial rebinds to the copy under
    `copy.deepcopy` and pickling. Its `__signature__` is the model's plus the collator's per-example fields
    (`DATA_COLUMNS`), keyword-only: `Trainer(remove_unused_columns=True)` keeps only the columns the signature names,
    and would drop `seq_lengths` and the masks before the collator sees them. The guard refuses them at the model.

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
        model.register_forward_hook(_guard_post_hook, always_call=True),
    ]
    state.guard = GuardHandle(model, previous, hooks)
    return state.guard
