"""What `prepare_model_for_flattening` leaves on a model, and the check that it still holds: the guard's handle
(`GUARD_ATTRIBUTE`, read by `is_prepared`) and the backend and mask builders in force (`mark_in_force`,
`check_in_force`, run by the guard at every flattened forward)."""

import sys

import torch

GUARD_ATTRIBUTE = "_flatcollate_guard"


def mark_in_force(model: torch.nn.Module, patched: tuple[str, ...] = ()) -> None:
    """Record the attention backend now selected and the mask builders patched, for `check_in_force`; called at the
    end of preparing (and after a deliberate switch, such as the sequence-parallel backend)."""
    model._flatcollate_in_force = (model.config.get_text_config()._attn_implementation, tuple(patched))


def check_in_force(model: torch.nn.Module) -> None:
    """Raise unless what `prepare_model_for_flattening` set up still holds: the attention backend it selected (a later
    `set_attn_implementation` would un-prepare the model silently) and the mask builders it patched."""
    in_force = vars(model).get("_flatcollate_in_force")
    if in_force is None:
        return
    backend, patched = in_force
    now = model.config.get_text_config()._attn_implementation
    if now != backend:
        raise ValueError(
            f"{type(model).__name__} was prepared with attn_implementation={backend!r} but now runs {now!r} "
            "(`set_attn_implementation` after preparing), which lets a flattened batch's sequences attend to each "
            "other. Call `prepare_model_for_flattening(model)` again after changing the backend."
        )
    elsewhere = layers_on_other_backends(model, backend)
    if elsewhere:
        named = ", ".join(f"{name} ({own!r})" for name, own in elsewhere[:4])
        raise ValueError(
            f"{type(model).__name__} was prepared with attn_implementation={backend!r}, but {len(elsewhere)} of its "
            f"modules read another backend from a config of their own: {named}. A layer taken from another model "
            "(depth up-scaling) or given another config after preparing would let a flattened batch's sequences "
            "attend to each other. Call `prepare_model_for_flattening(model)` again after changing layers: it gives "
            f"each such module a copy of its config on {backend!r}."
        )
    module = sys.modules[type(model).__module__]
    lost = [name for name in patched if not hasattr(getattr(module, name, None), "_flatcollate_original")]
    if lost:
        raise ValueError(
            f"{module.__name__}.{', '.join(lost)} is no longer the mask builder `prepare_model_for_flattening` patched "
            "(it was replaced afterwards), so a flattened batch would get one causal mask over all its sequences. "
            "Call `prepare_model_for_flattening(model)` again."
        )


def layers_on_other_backends(model: torch.nn.Module, backend: str) -> list[tuple[str, str]]:
    """`(module name, backend)` of every module whose own config is a language-model config (the class of
    `model.config.get_text_config()`) on another backend than `backend`: attention layers read the backend from
    their own config, not the top-level one. Vision towers hold configs of other classes and are left out."""
    text_config = type(model.config.get_text_config())

    def elsewhere(module: torch.nn.Module) -> bool:
        config = vars(module).get("config")
        return isinstance(config, text_config) and config._attn_implementation != backend

    if not any(elsewhere(module) for module in model.modules()):  # every flattened forward: no names built
        return []
    return [(name, module.config._attn_implementation) for name, module in model.named_modules() if elsewhere(module)]


def is_prepared(model: torch.nn.Module) -> bool:
    """Whether `model`, or the model a PEFT, DDP/FSDP (`.module`) or `torch.compile` (`._orig_mod`) wrapper holds,
    carries the guard `prepare_model_for_flattening` installs.

    >>> from flatcollate.testing import tiny_causal_lm
    >>> is_prepared(tiny_causal_lm("llama"))
    False
    """
    for _ in range(8):  # wrappers nest a few levels at most (compile of DDP of PEFT)
        if vars(model).get(GUARD_ATTRIBUTE) is not None:
            return True
        if callable(getattr(model, "get_base_model", None)):
            inner = model.get_base_model()
        else:  # DDP/FSDP register the model as submodule `module`, torch.compile as `_orig_mod`
            submodules = vars(model).get("_modules", {})
            inner = submodules.get("module", submodules.get("_orig_mod"))
        if not isinstance(inner, torch.nn.Module) or inner is model:
            return False
        model = inner
    return False
