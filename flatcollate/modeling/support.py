"""Which model families the `flatcollate` backend can make exact, read from their records (`flatcollate.families`).

A family is exact when its attention layers dispatch through transformers' attention interface and hand the forward's
keyword arguments (`cu_seq_lens_*`, `position_ids`) down to it: the backend then keeps sequences apart itself, whatever
the family's mask builder does. A family whose layers do not dispatch (falcon, bloom, mpt) keeps its own backend and
gets its mask builders patched (`mask_patch`). A family whose state-space, linear-attention or short-convolution
layers carry state along the row gets those layers run once per sequence (`Family.mixers`). The families refused here
(`Family.unsupported`) break exactness for a reason none of these can fix.
"""

import torch
from transformers import PreTrainedModel

from ..families import family_of, is_mixer
from .composite import vision_towers
from .heads import head_reason


def unsupported_reason(model: PreTrainedModel) -> str | None:
    """Why `model` cannot run flattened batches exactly with the `flatcollate` backend, or None when it can.

    Args:
        model (`PreTrainedModel`): the model to inspect (its config and attention layers).
    """
    config = model.config
    text_type = getattr(config.get_text_config(), "model_type", "") if hasattr(config, "get_text_config") else ""
    reason = family_of(model).unsupported  # its own record and those of the classes it is built from
    if reason is not None:
        language = family_of(text_type).unsupported == reason and text_type != getattr(config, "model_type", "")
        return f"its language model ({text_type}): {reason}" if language else reason
    unknown = unknown_token_mixers(model)
    if unknown:
        return (
            f"{len(unknown)} of its modules mix tokens along the row in a way no record of `flatcollate.families` "
            f"describes ({', '.join(unknown[:4])}): a recurrent layer or a depthwise causal convolution carries state "
            "from one sequence into the next"
        )
    if getattr(config, "is_encoder_decoder", False):
        return "it is an encoder-decoder model; flattening applies to decoder-only causal LMs"
    if not getattr(config, "is_causal", True):
        return "it is configured for bidirectional attention (`is_causal=False`)"
    return head_reason(model)


def takes_packed_backend(model: PreTrainedModel) -> bool:
    """Whether `model`'s attention layers dispatch through transformers' attention interface (so `flatcollate` can
    be selected); the others (`Family.own_backend`, or layers that ignore the interface) stay on their own backend
    with `patch_mask_builders`."""
    return family_of(model).own_backend is None and model._can_set_attn_implementation()


def row_length_limit(model: PreTrainedModel) -> tuple[str, int, str] | None:
    """`(config attribute, tokens, what it sizes)` when `model` cannot run rows longer than a config value
    (`Family.row_length_limit`), else None."""
    entry = family_of(model).row_length_limit
    if entry is None:
        return None
    key, what = entry
    limit = getattr(model.config, key, None)
    return (key, int(limit), what) if isinstance(limit, int) else None


def unknown_token_mixers(model: torch.nn.Module) -> list[str]:
    """`"name (class)"` of every module of the language model that carries state along the row and is not inside a
    known state-carrying layer (`flatcollate.families.is_mixer`, run once per sequence): recurrent layers
    (`nn.RNNBase`) and depthwise convolutions over the tokens (`nn.Conv1d` with one group per channel and a kernel
    longer than one). Vision towers are left out: they never see the flattened row."""
    skipped = [name + "." for name, module in model.named_modules() if is_mixer(module)]
    towers = {id(tower) for tower in vision_towers(model)} if isinstance(model, PreTrainedModel) else set()
    skipped += [name + "." for name, module in model.named_modules() if id(module) in towers]
    found = []
    for name, module in model.named_modules():
        if any(name.startswith(prefix) for prefix in skipped):
            continue
        depthwise = isinstance(module, torch.nn.Conv1d) and module.groups == module.in_channels > 1
        if isinstance(module, torch.nn.RNNBase) or (depthwise and module.kernel_size[0] > 1):
            found.append(f"{name} ({type(module).__name__})")
    return found


def check_row_length(model, limit: tuple | None, arguments: dict) -> None:
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
