"""Controls that an image-text proof can see what it proves: its logits depend on which image goes where, and every
parameter on the image path takes part.

A proof compares a flattened batch with each example run alone. If the model ignored its pixels (Gemma 3 with its
projection left at transformers' zero init), an image moved into another example's sequence would change nothing and
the proof would pass blind. Two controls, run beside every proof:

- `images_reversed`: the batch with its images in reverse order across examples; the logits must move by more than
  `IMAGE_SHIFT` (the proofs' tolerance is 1e-5)::

      pixel_values   [img0 | img1 img2 | ]        example 0: 1 image, example 1: 2, example 2: none
      reversed       [img2 | img1 img0 | ]        example 0 now sees example 1's second image

- `dead_image_parameters`: the vision tower's and projector's parameters whose gradient is missing or exactly zero
  everywhere, less the ones a family leaves unused by design (`Family.unused_by_design`, each with its reason).
"""

import re
from collections.abc import Mapping

import torch

from ..families import family_of
from .layouts import VisionLayout

IMAGE_SHIFT = 1e-2
"""Smallest largest-logit change that reversing a batch's images must cause."""

PIXEL_FIELDS = ("pixel_values", "pixel_values_videos")
"""The fields whose contents `images_reversed` reverses; sizes, grids and masks stay where they are."""


def images_reversed(batch: Mapping, layout: VisionLayout) -> dict:
    """The batch with the contents of its images in reverse order (a negative control for a proof).

    Args:
        batch (`Mapping`): a flattened batch from `VisionDataCollatorWithFlattening`.
        layout (`VisionLayout`): the family's layout (`batch_first` fields hold images on dimension 1).

    Returns:
        `dict`: the batch, with `pixel_values` / `pixel_values_videos` flipped on their image dimension (dimension 0:
        images, crops or Qwen's patch rows; dimension 1 for `layout.batch_first` fields). Shapes, image sizes, grids
        and masks are unchanged, so the model takes it; only which pixels each placeholder sees changes.

    >>> batch = {"input_ids": torch.tensor([[1, 9, 9]]), "pixel_values": torch.arange(3.0)[:, None]}
    >>> images_reversed(batch, VisionLayout())["pixel_values"].flatten().tolist()
    [2.0, 1.0, 0.0]
    """
    reversed_batch = dict(batch)
    for field in PIXEL_FIELDS:
        value = batch.get(field)
        if isinstance(value, torch.Tensor):
            axis = 1 if field in layout.batch_first else 0
            if value.shape[axis] < 2:
                raise ValueError(
                    f"`{field}` of shape {tuple(value.shape)} holds one image on dimension {axis}: reversing it "
                    "changes nothing. Give the control a batch with at least two images."
                )
            reversed_batch[field] = value.flip(axis)
    return reversed_batch


def image_parameters(model: torch.nn.Module) -> list[str]:
    """Names of the parameters outside the language model and the output head: vision towers and projectors.

    >>> from flatcollate.testing.tiny_vision import tiny_vision_lm
    >>> names = image_parameters(tiny_vision_lm("llava"))
    >>> names[0], any("language_model" in n or "lm_head" in n for n in names)
    ('model.vision_tower.embeddings.class_embedding', False)
    """
    text = {id(p) for p in model.get_decoder().parameters()}
    head = model.get_output_embeddings()
    text |= {id(p) for p in head.parameters()} if head is not None else set()
    return [name for name, parameter in model.named_parameters() if id(parameter) not in text]


def unused_by_design(model: torch.nn.Module) -> list[str]:
    """Image-path parameters that the model's family leaves unused by design (`Family.unused_by_design`): everything
    else on the image path must get a gradient."""
    patterns = [pattern for pattern, _ in family_of(getattr(model.config, "model_type", "")).unused_by_design]
    return [name for name in image_parameters(model) if any(re.fullmatch(p, name) for p in patterns)]


def dead_image_parameters(model: torch.nn.Module, grads: Mapping[str, torch.Tensor]) -> list[str]:
    """Image-path parameters (`image_parameters`) whose gradient is missing or exactly zero in every element, less
    the ones unused by design (`unused_by_design`).

    Args:
        model (`torch.nn.Module`): the model the gradients come from.
        grads (`Mapping[str, torch.Tensor]`): parameter name -> gradient, as after `loss.backward()` (missing where
            the parameter got none).
    """
    allowed = set(unused_by_design(model))
    dead = []
    for name in image_parameters(model):
        grad = grads.get(name)
        if (grad is None or not bool(grad.any())) and name not in allowed:
            dead.append(name)
    return dead


def image_shift(model: torch.nn.Module, batch: Mapping, layout: VisionLayout, logits: torch.Tensor) -> float:
    """Largest change of `logits` (the model's on `batch`) when the batch's images are reversed (`images_reversed`).

    Args:
        model (`torch.nn.Module`): a model that takes the flattened batch (prepared, or a backend under test).
        batch (`Mapping`): the flattened batch (`labels` are left out of the forward).
        layout (`VisionLayout`): the family's layout.
        logits (`torch.Tensor` of shape `(1, T, V)` or `(T, V)`): the model's logits on `batch`.

    Returns:
        `float`: the largest absolute logit difference.
    """
    inputs = {key: value for key, value in images_reversed(batch, layout).items() if key != "labels"}
    with torch.no_grad():
        moved = model(**inputs, use_cache=False).logits
    return (moved.reshape(logits.shape).float() - logits.float()).abs().max().item()
