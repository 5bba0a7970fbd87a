"""`prepare_model_for_flattening(model, fused_loss=True)`: a forward with labels returns the loss without `(T, V)`
logits.

The prepared model's forward, given `labels` (or `shift_labels`), runs the model's decoder (`model.base_model`) and
computes the next-token loss from its final hidden states and the output head (`model.get_output_embeddings()`):
Cut Cross-Entropy or Liger's fused linear cross-entropy on CUDA where installed (`loss_kernels`), the chunked PyTorch
path elsewhere (`chunked_loss`). It returns `logits=None`. Without labels, with `return_logits=True`, or with TRL's
`fused_lm_head=True`, the model's own forward runs (full logits). The loss is what the model's forward computes from
its logits (transformers' `ForCausalLMLoss`): labels shifted inside the loss unless `shift_labels` is given, the mean
over labelled tokens, or their sum over `num_items_in_batch` when `Trainer` passes it (gradient accumulation). The
guard sits in front of this forward, so a flattened batch's labels never predict across a boundary (`heads`)::

    guard (labels inside sequences) -> fused forward -> base_model(...) -> hidden (B, T, H) -> chunked loss
                                                     \\-> model's own forward   (no labels, or return_logits=True)
"""

import functools
import inspect
from dataclasses import dataclass

import torch
from transformers.modeling_outputs import CausalLMOutputWithPast

from .._conventions import IGNORE_INDEX
from .chunked_loss import chunk_tokens, chunked_cross_entropy, next_token_targets
from .heads import labels_in_place
from .loss_kernels import check_backend, kernel_cross_entropy, kernel_for
from .prepared_state import state_of

SCALES = ("logit_scale", "logits_scaling", "output_multiplier", "lm_head_multiplier")
"""Config attributes of families whose forward scales the logits after the head (Cohere, Granite, Falcon-H1, ...)."""


@dataclass(frozen=True)
class FusedLoss:
    """A model's fused-loss settings.

    Args:
        backend (`str`): `"auto"`, `"chunked"`, `"cce"` or `"liger"` (`loss_kernels.BACKENDS`).
        softcap (`float`, *optional*): the config's `final_logit_softcapping` (Gemma 2), applied per chunk.
        chunk_size (`int`): labelled tokens per chunk of the chunked path (`chunk_tokens(vocab_size)`).
        signature (`inspect.Signature`): the model's forward signature, to name arguments given by position.
    """

    backend: str
    softcap: float | None
    chunk_size: int
    signature: inspect.Signature


def fused_loss_reason(model: torch.nn.Module) -> str | None:
    """Why `model`'s loss cannot be computed from its decoder's hidden states and its head, or None when it can."""
    text_config = model.config.get_text_config()
    if labels_in_place(model):
        return f"its head ({type(model).__name__}) labels tokens in place; the fused loss is the next-token loss"
    if model.get_output_embeddings() is None or model.base_model is model:
        return f"{type(model).__name__} has no output head apart from its decoder (`get_output_embeddings()`)"
    scaled = [name for name in SCALES if getattr(text_config, name, None) not in (None, 1, 1.0)]
    if scaled:
        return f"its forward scales the logits after the head (`config.{scaled[0]}`), which the fused loss would drop"
    if getattr(text_config, "output_router_logits", False):
        return "its forward adds the experts' load-balancing loss (`output_router_logits=True`) to the loss"
    return None


def check_fused_loss(model: torch.nn.Module, backend: str | bool) -> str:
    """Raise `ValueError` unless `fused_loss=backend` can apply to `model`; the backend's name (True is `"auto"`)."""
    backend = "auto" if backend is True else backend
    check_backend(backend)
    reason = fused_loss_reason(model)
    if reason is not None:
        raise ValueError(f"fused_loss={backend!r} cannot apply to {type(model).__name__}: {reason}. Leave it False.")
    return backend


def install_fused_loss(model: torch.nn.Module, backend: str | bool) -> None:
    """Compute `model`'s loss without full logits whenever a forward has labels (`fused_loss` of
    `prepare_model_for_flattening`; called before the guard is installed, so that the guard sits in front of it).

    Args:
        model (`PreTrainedModel`): a causal LM (the base model of a PEFT wrapper).
        backend (`bool` or `str`): True (`"auto"`), `"chunked"`, `"cce"` or `"liger"`.
    """
    backend = check_fused_loss(model, backend)
    text_config = model.config.get_text_config()
    state = state_of(model, create=True)
    if isinstance(state.fused_loss, FusedLoss):  # installed already: new settings, the same forward
        state.fused_loss = FusedLoss(backend, *_sizes(text_config), state.fused_loss.signature)
        return
    if state.guard is not None:
        state.guard.remove()  # prepared before: preparing installs the guard again, in front of the fused forward
    inner = model.forward  # the class's forward, or one another library set (TRL's fused head)
    signature = inspect.signature(inner)
    state.fused_loss = FusedLoss(backend, *_sizes(text_config), signature)
    forward = functools.partial(_fused_forward, model, inner)
    forward.__signature__ = signature  # `Trainer` keeps the dataset columns its forward names
    model.forward = forward


def _sizes(text_config) -> tuple[float | None, int]:
    return getattr(text_config, "final_logit_softcapping", None), chunk_tokens(text_config.vocab_size)


def _fused_forward(model: torch.nn.Module, inner, *args, return_logits: bool = False, **kwargs):
    """The forward `install_fused_loss` puts on `model`: the fused loss for a call with labels, else `inner`."""
    settings = state_of(model).fused_loss
    if args:  # given by position: named as the forward names them
        kwargs, args = {**settings.signature.bind_partial(*args).arguments, **kwargs}, ()
    labelled = kwargs.get("labels") is not None or kwargs.get("shift_labels") is not None
    if return_logits or not labelled or kwargs.get("fused_lm_head"):
        return inner(**kwargs)
    labels, shift_labels = kwargs.pop("labels", None), kwargs.pop("shift_labels", None)
    count = kwargs.pop("num_items_in_batch", None)
    kwargs.pop("logits_to_keep", None)  # every position is scored; none is projected to logits
    outputs = model.base_model(**kwargs)
    loss = next_token_loss(
        outputs[0],
        model.get_output_embeddings(),
        labels=labels,
        shift_labels=shift_labels,
        num_items_in_batch=count,
        settings=settings,
    )
    return CausalLMOutputWithPast(
        loss=loss,
        logits=None,
        past_key_values=getattr(outputs, "past_key_values", None),
        hidden_states=getattr(outputs, "hidden_states", None),
        attentions=getattr(outputs, "attentions", None),
    )


# Under `torch.compile` the loss runs eagerly: its chunks and its labelled count change from batch to batch.
@torch.compiler.disable
def next_token_loss(
    hidden: torch.Tensor,
    head: torch.nn.Module,
    *,
    labels: torch.Tensor | None,
    shift_labels: torch.Tensor | None,
    num_items_in_batch: torch.Tensor | int | None,
    settings: FusedLoss,
) -> torch.Tensor:
    """The model's loss from its final hidden states, as `ForCausalLMLoss` computes it from full logits.

    Args:
        hidden (`torch.Tensor` of shape `(B, T, H)`): the decoder's last hidden states.
        head (`torch.nn.Module`): `model.get_output_embeddings()`.
        labels (`torch.Tensor` of shape `(B, T)`, int64, *optional*): labels in place, shifted here.
        shift_labels (`torch.Tensor` of shape `(B, T)`, int64, *optional*): what each position predicts; used as
            given (context parallelism, TRL's flattened rows) in place of shifting `labels`.
        num_items_in_batch (*optional*): the labelled tokens of the whole optimizer step (`Trainer`): the loss is
            then the sum over it; else the mean over this batch's labelled tokens.
        settings (`FusedLoss`): the backend, soft-cap and chunk size.

    Returns:
        `torch.Tensor` of shape `()`, fp32.
    """
    targets = shift_labels if shift_labels is not None else next_token_targets(labels)
    rows = hidden.reshape(-1, hidden.shape[-1])
    targets = targets.reshape(-1).to(rows.device)
    kernel = kernel_for(settings.backend, rows, head)
    if kernel is None:
        total = chunked_cross_entropy(rows, head, targets, chunk_size=settings.chunk_size, softcap=settings.softcap)
    else:
        total = kernel_cross_entropy(kernel, rows, head, targets, softcap=settings.softcap)
    if num_items_in_batch is None:
        return total / (targets != IGNORE_INDEX).sum()
    if isinstance(num_items_in_batch, torch.Tensor):
        num_items_in_batch = num_items_in_batch.to(total.device)
    return total / num_items_in_batch
