"""The image-text side of `flatcollate check --task dpo`: the checked examples' completions and the image control on
the completion log-probabilities (`flatcollate.check.vision.check_vision_model` runs the check).

Each example's completion is the second half of its tokens, as for text families (`flatcollate.check.tasks`); image
placeholders keep their -100 wherever they fall::

    example 0   [t t <i i i i> t | t t t]        scored: the tokens after `|`
    example 1   [t <i i> <i i i> t | t t t t]
    example 2   [t t | t t]                      text only

The reward check takes text families only: `FlatRewardTrainer` scores text pairs (`DataCollatorForRewardPairs`), and
no image-text reward path is proven exact.
"""

from collections.abc import Mapping

import torch

from .._conventions import IGNORE_INDEX
from ..preference.logprobs import flattened_logprobs
from ..vision.controls import images_reversed
from ..vision.layouts import VisionLayout
from .report import max_diff

IMAGE_TEXT_TASKS = ("sft", "dpo")
"""The tasks an image-text-to-text family is checked on."""


def completion_only(example: dict) -> dict:
    """The example with labels on the second half of its tokens only, `(L,)` int64 (-100 on the first half and on
    image placeholders, which its labels already hold).

    >>> completion_only({"input_ids": torch.tensor([5, 9, 9, 6, 7]), "labels": torch.tensor([5, -100, -100, 6, 7])})
    {'input_ids': tensor([5, 9, 9, 6, 7]), 'labels': tensor([-100, -100, -100,    6,    7])}
    """
    labels = example["labels"].clone()
    labels[: len(labels) // 2] = IGNORE_INDEX
    return {**example, "labels": labels}


def logprob_shift(model: torch.nn.Module, batch: Mapping, layout: VisionLayout, per_token: torch.Tensor) -> float:
    """Largest change of the batch's completion log-probabilities when its images are reversed across examples
    (`flatcollate.vision.controls.images_reversed`): the `image_shift` control on what the dpo check compares.

    Args:
        model (`torch.nn.Module`): a model that takes the flattened batch.
        batch (`Mapping`): the flattened batch, with `labels`.
        layout (`VisionLayout`): the family's layout.
        per_token (`torch.Tensor` of shape `(sum of (L - 1),)`): the model's per-token log-probabilities on `batch`,
            concatenated in example order.
    """
    with torch.no_grad():
        moved = torch.cat(flattened_logprobs(model, images_reversed(batch, layout), per_token=True))
    return max_diff(moved, per_token)


def image_text_task_refusal(model_type: str, task: str) -> str | None:
    """Why `task` is not checked on an image-text-to-text family, or None.

    >>> image_text_task_refusal("qwen2_vl", "dpo") is None
    True
    """
    if task in IMAGE_TEXT_TASKS:
        return None
    return (
        f"task={task!r} takes text families: {model_type} is an image-text-to-text architecture, and the {task} "
        "check does not prove image-text rows (FlatRewardTrainer flattens text pairs only). Check it with "
        "task='dpo' (completion log-probabilities) or task='sft'."
    )
