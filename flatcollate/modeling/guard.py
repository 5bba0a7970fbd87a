"""A forward pre-hook that refuses the arguments which make a flattened batch attend across sequences.

transformers detects packed rows from `position_ids` only when no `attention_mask` and no cache are present; with
either one, sequences of a flattened row silently attend to each other. The hook raises instead. It does no work on
an ordinary call: only when one of those arguments is present does it look at the batch (one host sync at most, on
the top-level model, never per layer).
"""

import inspect

import torch

from .._conventions import FLASH_KWARG_KEYS

GUARD_ATTRIBUTE = "_flatcollate_guard"


def is_flattened(arguments: dict) -> bool:
    """Whether a forward's arguments describe a flattened batch.

    Args:
        arguments (`dict`): the forward's keyword arguments; a batch is flattened when it carries `cu_seq_lens_*` /
            `max_length_*`, or `position_ids` (`(B, T)` integer) that restart inside a row.

    >>> is_flattened({"position_ids": torch.tensor([[0, 1, 2, 0, 1]])})
    True
    >>> is_flattened({"position_ids": torch.tensor([[0, 1, 2, 3, 4]])})
    False
    """
    if any(arguments.get(key) is not None for key in FLASH_KWARG_KEYS):
        return True
    position_ids = arguments.get("position_ids")
    if position_ids is None or position_ids.shape[-1] < 2:
        return False
    return bool((position_ids[..., 1:] - position_ids[..., :-1] != 1).any())


def _offending(arguments: dict, config) -> list[str]:
    """Arguments that make sequences of a flattened row see each other; checked without touching tensor data."""
    found = []
    if arguments.get("attention_mask") is not None:
        found.append("an `attention_mask` is passed (it turns off packed-sequence detection)")
    use_cache = arguments.get("use_cache")
    if use_cache or (use_cache is None and getattr(config, "use_cache", False)):
        found.append("`use_cache=True` (the cache turns off packed-sequence detection)")
    if arguments.get("past_key_values") is not None:
        found.append("`past_key_values` is given (a cache mixes the sequences' keys)")
    return found


def _guard_hook(model, args: tuple, kwargs: dict):
    arguments = kwargs
    if len(args) > 1:
        arguments = {**model._flatcollate_signature.bind_partial(*args, **kwargs).arguments, **kwargs}
    unsupported = model._flatcollate_unsupported
    if unsupported is not None and is_flattened(arguments):
        raise ValueError(
            f"{type(model).__name__} got a flattened batch, but family {model.config.model_type!r} cannot keep "
            f"sequences apart: {unsupported}. Use padded batches for this model."
        )
    found = _offending(arguments, model.config)
    if found and is_flattened(arguments):
        raise ValueError(
            f"{type(model).__name__} got a flattened batch (sequences back to back in one row) but "
            + "; ".join(found)
            + ". Sequences would attend to each other. Call the model with `use_cache=False`, no `attention_mask` and "
            "no `past_key_values` (the flattening collators emit none of them), e.g. `model(**batch, use_cache=False)`."
        )
    return None


def install_guard(model: torch.nn.Module, *, unsupported: str | None = None) -> torch.utils.hooks.RemovableHandle:
    """Install the flattened-batch guard on `model` (once; a second call returns the first handle).

    Args:
        model (`torch.nn.Module`): the top-level model.
        unsupported (`str`, *optional*): why the family cannot be exact; then every flattened batch is refused
            (one check of `position_ids` per forward).

    Returns:
        The hook's `RemovableHandle` (`handle.remove()` uninstalls it).
    """
    model._flatcollate_unsupported = unsupported
    existing = getattr(model, GUARD_ATTRIBUTE, None)
    if existing is not None:
        return existing
    model._flatcollate_signature = inspect.signature(model.forward)
    handle = model.register_forward_pre_hook(_guard_hook, with_kwargs=True)
    setattr(model, GUARD_ATTRIBUTE, handle)
    return handle
