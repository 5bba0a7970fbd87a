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

from .._conventions import FLASH_KWARG_KEYS
from ..attention.bidirectional_blocks import BLOCK_TOKEN_TYPE, BLOCKS_KEY, block_ids
from ..attention.packed_segments import position_starts
from .boundary_check import BOUNDARY_KEYS, check_boundaries
from .families import row_length_limit
from .family_positions import position_start, text_changes
from .heads import warn_masked_first_labels
from .multimodal_positions import checked_multimodal_positions, rope_index_of
from .prepared_state import GUARD_ATTRIBUTE, check_in_force
from .token_types import require_token_types

_BOUNDARY_KEYS = (*FLASH_KWARG_KEYS, *BOUNDARY_KEYS)
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
    if any(arguments.get(key) is not None for key in _BOUNDARY_KEYS):
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


def _check_row_length(model, arguments: dict) -> None:
    """Raise for a row longer than a buffer the family sizes by its config (`families.ROW_LENGTH_LIMITS`)."""
    limit = model._flatcollate_row_limit
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


def _text_row(position_ids: torch.Tensor) -> torch.Tensor:
    """The text positions `(B, T)` of multimodal-RoPE positions `(4, B, T)` (transformers puts them first)."""
    if position_ids.shape[0] != 4:
        raise ValueError(
            f"`position_ids` of shape {tuple(position_ids.shape)} hold the 3-D rotary positions without the text row, "
            "so the sequences of a flattened batch cannot be told apart from them. Leave `position_ids` out "
            "(flatcollate computes them per sequence) or pass shape (4, 1, T), text row first."
        )
    return position_ids[0]


def _multimodal_changes(model, arguments: dict, text_positions: torch.Tensor | None) -> dict:
    """What a flattened batch of an image-text model runs with besides its text positions: per-sequence 3-D positions
    (multimodal-RoPE families) and the image blocks that attend both ways (`BLOCK_TOKEN_TYPE` families)."""
    require_token_types(model, arguments)  # both read the per-token types: images without them are refused
    changes = {}
    if model._flatcollate_rope_index is not None and text_positions is not None:
        changes["position_ids"] = checked_multimodal_positions(model._flatcollate_rope_index, arguments, text_positions)
    block_type = BLOCK_TOKEN_TYPE.get(getattr(model.config, "model_type", None))
    token_types = arguments.get("token_type_ids")
    if block_type is not None and token_types is not None and text_positions is not None:
        changes[BLOCKS_KEY] = block_ids(token_types, position_starts(text_positions), block_type)
    return changes


def _check_arguments(model, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
    """Raise for arguments that would mix sequences; the completed `(args, kwargs)`, or None to keep them."""
    # Arguments given by position (`model(ids, ...)`) are checked as if given by name.
    arguments = {**model._flatcollate_signature.bind_partial(*args).arguments, **kwargs} if args else kwargs
    reached = [key for key in DATA_COLUMNS if arguments.get(key) is not None]
    if reached:
        raise ValueError(
            f"{type(model).__name__} got {reached}: these per-example fields are for the collator, which folds them "
            "into `labels` and the batch's boundaries. Collate with `flatcollate.DataCollatorWithFlattening` (or "
            "`DataCollatorForCompletionOnlyLM`) instead of passing them to the model."
        )
    _check_row_length(model, arguments)
    unsupported = model._flatcollate_unsupported
    if unsupported is not None and is_flattened(arguments):
        raise ValueError(
            f"{type(model).__name__} got a flattened batch, but family {model.config.model_type!r} cannot keep "
            f"sequences apart: {unsupported}. Use padded batches for this model."
        )
    found = _offending(arguments)
    if found and is_flattened(arguments):
        raise ValueError(
            f"{type(model).__name__} got a flattened batch (sequences back to back in one row) but "
            + "; ".join(found)
            + ". Sequences would attend to each other. Call the model with `use_cache=False`, no `attention_mask` and "
            "no `past_key_values` (the flattening collators emit none of them), e.g. `model(**batch, use_cache=False)`."
        )
    changes = {}
    # A sequence-parallel rank holds a slice of the row: `(rank, size)`, set by `prepare_model_for_sequence_parallel`.
    shard = getattr(model, "_flatcollate_sequence_shard", None)
    has_boundaries = any(arguments.get(key) is not None for key in _BOUNDARY_KEYS)
    given = arguments.get("position_ids")
    if model._flatcollate_rope_index is not None and isinstance(given, torch.Tensor) and given.dim() == 3:
        # Multimodal-RoPE positions: the text row (first of four) says where sequences start. Three rows and no
        # boundaries is an ordinary call, left as it is.
        text_positions = _text_row(given) if has_boundaries or given.shape[0] == 4 else None
        position_ids = (
            None if text_positions is None else check_boundaries({**arguments, "position_ids": text_positions})
        )
    else:
        position_ids, text_positions = check_boundaries(arguments, shard=shard), given
    if position_ids is not None:
        changes["position_ids"] = text_positions = position_ids
    flattened = has_boundaries or (
        text_positions is not None and is_flattened({**arguments, "position_ids": text_positions})
    )
    if flattened and shard is None and text_positions is not None and text_positions.dim() == 2:
        starts = position_starts(text_positions)
        changes.update(text_changes(model, arguments, text_positions, starts, derived=position_ids is not None))
        warn_masked_first_labels(model, arguments.get("labels"), starts)
    if flattened:
        check_in_force(model)
        changes.update(_multimodal_changes(model, arguments, text_positions))
    cache_by_default = arguments.get("use_cache") is None and getattr(model.config, "use_cache", False)
    if cache_by_default and not found and flattened:
        # The config's default would build a cache, which turns off packed-sequence detection: a training batch needs
        # none, so a flattened batch runs without one (the config itself stays as saved).
        if not model._flatcollate_takes_use_cache:
            raise ValueError(
                f"{type(model).__name__} got a flattened batch while `config.use_cache` is on, and its forward takes "
                "no `use_cache`; set `model.config.use_cache = False` for training."
            )
        changes["use_cache"] = False
    if not changes and not kwargs.keys() & set(DATA_COLUMNS):
        return None
    kwargs = {key: value for key, value in kwargs.items() if key not in DATA_COLUMNS}
    given_positionally = model._flatcollate_signature.bind_partial(*args).arguments.keys() & changes.keys()
    if given_positionally:  # passed as None by position: rebind so that nothing is given twice
        bound = model._flatcollate_signature.bind_partial(*args, **kwargs)
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
        vars(self._model).pop(GUARD_ATTRIBUTE, None)


@torch.compiler.disable  # under `torch.compile`: checked eagerly, once per forward, never traced into the graph
def _run_before_forward(model, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    changed = _check_arguments(model, args, kwargs)
    if changed is not None:
        args, kwargs = changed
    for before in model._flatcollate_before_forward:  # e.g. state-carrying layers read the row's boundaries
        before(model, args, kwargs)
    return args, kwargs


def _guard_pre_hook(model, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The guard on `model(...)`: runs even when another library replaces `model.forward` later."""
    args, kwargs = _run_before_forward(model, args, kwargs)
    vars(model)["_flatcollate_checked"] = True  # `_guarded_forward` need not check this call again
    return args, kwargs


def _clear_checked(model, args: tuple, output):
    vars(model).pop("_flatcollate_checked", None)  # the call is over, whichever forward ran


def _guarded_forward(model: torch.nn.Module, inner: Callable | None, *args, **kwargs):
    """`model`'s forward behind the guard, for wrappers that call `model.forward(...)` directly (PEFT's LoRA model
    does), which skips forward pre-hooks; a call that came through `model(...)` was checked by the pre-hook."""
    if not vars(model).pop("_flatcollate_checked", False):
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
    model._flatcollate_unsupported = unsupported
    model._flatcollate_row_limit = row_length_limit(model) if isinstance(model, PreTrainedModel) else None
    model._flatcollate_rope_index = rope_index_of(model)
    model._flatcollate_position_start = position_start(model)
    existing = vars(model).get(GUARD_ATTRIBUTE)
    if existing is not None:
        return existing
    signature = inspect.signature(model.forward)
    parameters = signature.parameters
    model._flatcollate_signature = signature
    model._flatcollate_takes_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    model._flatcollate_takes_use_cache = "use_cache" in parameters or model._flatcollate_takes_kwargs
    model._flatcollate_before_forward = []
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
    handle = GuardHandle(model, previous, hooks)
    setattr(model, GUARD_ATTRIBUTE, handle)
    return handle
