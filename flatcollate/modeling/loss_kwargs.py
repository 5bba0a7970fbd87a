"""Token-weighted gradient accumulation for models whose class says its forward takes no loss arguments.

`transformers.Trainer` counts the labelled tokens of all the micro-batches of one optimizer step
(`num_items_in_batch`) and passes the count to a model's forward when the model accepts loss arguments; the loss is
then a sum over that count and the step weighs every token alike. Qwen2-VL/2.5-VL/3-VL, GLM-4V and other image-text
classes set `accepts_loss_kwargs = False`, so Trainer passes nothing, each micro-batch (a pack of 1-4 examples) is
divided by its own token count, and Trainer divides by the accumulation steps: packs weigh alike, not tokens::

    micro-batches     A: 30 labelled tokens     B: 90 labelled tokens       accumulation 2
    their class       (sum_A / 30 + sum_B / 90) / 2       tokens of A weigh 3x those of B
    accepted          (sum_A + sum_B) / 120                every token alike, as one batch of A and B

Their forwards hand their keyword arguments to `self.loss_function` (transformers' `ForCausalLMLoss`, which divides by
`num_items_in_batch` when given), so `accept_loss_kwargs` lets Trainer pass the count. That this model's forward
does hand it on is checked at every forward that receives it: the count reaching the forward but not the loss raises.
"""

import inspect

import torch
from transformers import PreTrainedModel

COUNT = "num_items_in_batch"


class _CountedLoss:
    """The model's loss function, noting whether the last call received `num_items_in_batch`."""

    def __init__(self, loss_function):
        self.loss_function, self.received = loss_function, None

    def __call__(self, *args, **kwargs):
        self.received = COUNT in kwargs
        return self.loss_function(*args, **kwargs)


def accept_loss_kwargs(model: PreTrainedModel) -> bool:
    """Let `Trainer` pass `num_items_in_batch` to `model` where its class refuses it but its forward takes
    `**kwargs`; returns whether it did (idempotent).

    >>> from flatcollate.testing.tiny_vision import tiny_vision_lm
    >>> model = tiny_vision_lm("qwen2_5_vl")
    >>> type(model).accepts_loss_kwargs, accept_loss_kwargs(model), model.accepts_loss_kwargs
    (False, True, True)
    """
    if isinstance(vars(model).get("_loss_function"), _CountedLoss):
        return True
    if getattr(model, "accepts_loss_kwargs", None) is not False:
        return False  # Trainer passes the count already (or reads it from the forward's `**kwargs`)
    parameters = inspect.signature(model.forward).parameters.values()
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return False
    model.loss_function = _CountedLoss(model.loss_function)
    model.register_forward_pre_hook(_before, with_kwargs=True)
    model.register_forward_hook(_after, with_kwargs=True)
    model.accepts_loss_kwargs = True
    return True


def _before(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
    module.loss_function.received = None


def _after(module: torch.nn.Module, args: tuple, kwargs: dict, output) -> None:
    if kwargs.get(COUNT) is None or kwargs.get("labels") is None or module.loss_function.received is not False:
        return
    raise ValueError(
        f"{type(module).__name__}'s forward took `{COUNT}` but its loss did not receive it: its loss is this batch's "
        "mean, and gradient accumulation would weigh batches instead of tokens. Set `model.accepts_loss_kwargs = "
        "False` and train with gradient_accumulation_steps=1 (a larger batch instead), or compute the loss outside "
        "the model from `num_items_in_batch`."
    )
