"""PEFT's prompt-learning adapters cannot keep the sequences of a flattened batch apart, so a prepared model refuses
flattened batches through them.

Prompt tuning and P-tuning prepend their virtual tokens once to each row (and drop `position_ids`); prefix tuning puts
its virtual keys and values once in front of each row, as a cache. On a flattened row only the first sequence has them
as its prefix; every later sequence attends to them through the sequences before it::

    row            [v v v | a0 a1 a2 | b0 b1 | c0]      virtual tokens v, once per row
    b0 sees        v v v a0 a1 a2 b0                    alone it would see  v v v b0

PEFT calls the model it wraps with the virtual tokens already in place, so the model's own guard cannot tell. A
forward pre-hook on the PEFT model (`refuse_flattened_prompt_learning`) reads the batch before PEFT changes it and
raises for a flattened one, naming the method and the fix. Padded batches, `generate()` and LoRA pass it unchanged.
"""

import inspect
import sys

import torch
from torch.nn.modules.module import register_module_module_registration_hook

from .guard import is_flattened
from .prepared_state import state_of

METHOD_NAMES = {
    "PROMPT_TUNING": "prompt tuning",
    "MULTITASK_PROMPT_TUNING": "multitask prompt tuning",
    "P_TUNING": "P-tuning",
    "PREFIX_TUNING": "prefix tuning",
    "CPT": "context-aware prompt tuning",
    "CARTRIDGE": "cartridge",
}
"""PEFT's prompt-learning `peft_type`s and the names the refusal gives them."""

_WATCHING: list = []  # the handle of the one registration hook, once a model has been prepared


def refuse_flattened_prompt_learning(wrapper: torch.nn.Module, args: tuple, kwargs: dict) -> None:
    """Forward pre-hook of a PEFT model around a prepared model: raise `ValueError` for a flattened batch (as
    `flatcollate.modeling.is_flattened` decides) while the active adapter is a prompt-learning one."""
    config = getattr(wrapper, "active_peft_config", None)
    if config is None or not config.is_prompt_learning:
        return
    arguments = {**inspect.signature(wrapper.forward).bind_partial(*args).arguments, **kwargs} if args else kwargs
    if not is_flattened(arguments):
        return
    kind = getattr(config.peft_type, "value", config.peft_type)
    method = METHOD_NAMES.get(kind, str(kind))
    where = (
        "its virtual keys and values once in front of each row, as a cache"
        if kind in ("PREFIX_TUNING", "CARTRIDGE")
        else "its virtual tokens once at the start of each row and drops `position_ids`"
    )
    raise ValueError(
        f"{type(wrapper).__name__} runs a {method} adapter (`{type(config).__name__}`, "
        f"{config.num_virtual_tokens} virtual tokens) on a flattened batch: PEFT puts {where}, so every sequence "
        f"after the first would attend to the virtual tokens through the sequences before it. Train {method} on "
        "padded batches (e.g. `transformers.DataCollatorForSeq2Seq`), or use LoRA (`peft.LoraConfig`), which is "
        "exact on flattened batches."
    )


def guard_prompt_learning(wrapper: torch.nn.Module) -> None:
    """Put `refuse_flattened_prompt_learning` in front of `wrapper`'s forward (once)."""
    if refuse_flattened_prompt_learning not in wrapper._forward_pre_hooks.values():
        wrapper.register_forward_pre_hook(refuse_flattened_prompt_learning, with_kwargs=True)


def _is_peft_model(module: torch.nn.Module) -> bool:
    peft = sys.modules.get("peft")  # a PEFT model exists only once peft was imported: never import it here
    return peft is not None and isinstance(module, peft.PeftModel)


def _on_registration(module: torch.nn.Module, name: str, submodule: torch.nn.Module | None) -> None:
    """Module registration hook: a PEFT model that takes a prepared model as its submodule gets the refusal."""
    state = None if submodule is None else state_of(submodule)
    if state is not None and state.guard is not None and _is_peft_model(module):
        guard_prompt_learning(module)


def watch_prompt_learning(wrapper: torch.nn.Module | None = None) -> None:
    """Guard the PEFT model `wrapper` (a model wrapped before preparing), and every PEFT model that wraps a prepared
    model later (`get_peft_model(prepared_model, ...)`): PyTorch calls a registration hook, installed once per process,
    whenever a module becomes another's submodule, which is how PEFT takes the model."""
    if wrapper is not None and _is_peft_model(wrapper):
        guard_prompt_learning(wrapper)
    if not _WATCHING:
        _WATCHING.append(register_module_module_registration_hook(_on_registration))
