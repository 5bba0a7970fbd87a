"""TRL glue: `FlatSFTTrainer`, an `SFTTrainer` that takes flatcollate's collators with `padding_free=True`.

TRL refuses a custom `data_collator` when `padding_free=True` and builds its own. This subclass lets TRL prepare the
dataset as usual (tokenization, completion/assistant masks folded into `labels`, `seq_lengths` when packing), then
collates with flatcollate (vectorized, validated, boundary kwargs always present) and prepares the model so that
nothing can attend across sequences.
"""

import copy
import functools
import logging
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import datasets
from trl import SFTTrainer

from ..._conventions import IMAGE_FIELDS, TOKEN_TYPE_FIELDS
from ...collate import DataCollatorForCompletionOnlyLM, DataCollatorWithFlattening
from ...collate.features import MASK_KEYS
from ...data.dataset import pack_dataset
from ...modeling import prepare_model_for_flattening
from ...vision import VisionDataCollatorWithFlattening
from ...vision.fields import has_vision_tower

logger = logging.getLogger(__name__)

IMAGE_ROW_KEYS = ("image", "images")
"""Columns by which TRL recognises rows with raw images (`SFTTrainer._is_vision_dataset`)."""


class FlatSFTTrainer(SFTTrainer):
    """`trl.SFTTrainer` that collates padding-free batches with flatcollate.

    With `SFTConfig(padding_free=True)` (or BFD packing), the batch is collated by `data_collator` (default:
    `DataCollatorWithFlattening` with the config's `pad_to_multiple_of`) and the model goes through
    `prepare_model_for_flattening`. Without padding-free it is exactly `SFTTrainer` (padded batches, model not
    prepared) and warns; passing a flattening collator then raises, naming `padding_free=True`.

    `SFTTrainer(args=SFTConfig(padding_free=True), data_collator=collator)` raises TRL's "Passing a custom data
    collator is not supported when using padding-free"; `FlatSFTTrainer` takes that same call.

    The tokens trained are those of `SFTTrainer(padding_free=True)` for every `SFTConfig`: TRL folds the masks the
    config asks for (`completion_mask` when `completion_only_loss`, `assistant_masks`) into `labels` while preparing
    the dataset and its collator ignores mask columns left over (e.g. `completion_mask` with
    `completion_only_loss=False`, kept by `remove_unused_columns=False`). Those leftovers are removed before
    flatcollate's collator, which would otherwise fold them into `labels` a second time.

    Image-text models (a config with a `vision_config`) train padding-free on rows a processor already encoded
    (`flatcollate.data.make_supervised_dataset(processor, ...)`: `input_ids`, `labels`, `pixel_values`,
    `image_grid_thw`, `mm_token_type_ids`, ...), collated by `VisionDataCollatorWithFlattening.from_model(model)`;
    the vision fields and per-token types are kept where TRL would keep only `input_ids` and `labels` (and train on
    the image placeholders without their images). TRL refuses `padding_free=True` for raw rows with an `image(s)`
    column (it processes images in its own padded collator), which raises naming the route that works.

    `SFTConfig(packing=True)` (`packing_strategy` `"bfd"` or `"bfd_split"`) with an image-text model, which TRL
    refuses or packs without the images, packs the encoded rows with `flatcollate.data.pack_dataset` instead: whole
    examples of at most `max_length` tokens (image placeholders counted), each pack carrying its examples' vision
    fields, collated by `VisionDataCollatorWithFlattening` (each example keeps its own positions and images). The
    trainer logs the packs and their fill and keeps the `PackingStats` as `packing_stats`; optimizer steps follow
    from the packs (`per_device_train_batch_size` packs per step), as with text packing. An example with images
    longer than `max_length` raises (it is never cut); the `args` the trainer runs with have `packing=False` and
    `padding_free=True`, since the rows are packed already.

    Args:
        *args, **kwargs: as for `SFTTrainer`.
        data_collator (*optional*): a flatcollate collator, e.g. `DataCollatorForCompletionOnlyLM(...)` or
            `VisionDataCollatorWithFlattening.from_model(model)` (the default for an image-text model).
        attn_implementation (`str`, *optional*, defaults to `"flatcollate"`): passed to
            `prepare_model_for_flattening`; `None` keeps the model's backend (e.g. `flash_attention_2`).
        fused_loss (`bool` or `str`, defaults to `False`): passed to `prepare_model_for_flattening`. TRL's own loss
            (`loss_type="nll"`) never builds the full logits (its fused LM head, `fused_lm_head=True`, passes through);
            with this option the model's other forwards with labels (a `compute_loss` of your own, evaluation outside
            TRL) do not either.

    Example (TRL requires `max_length=None` for padding-free training without packing):

    ```python
    from flatcollate.integrations.trl import FlatSFTTrainer
    from trl import SFTConfig

    trainer = FlatSFTTrainer(model=model, args=SFTConfig(padding_free=True, max_length=None), train_dataset=ds)
    ```
    """

    _drops_mask_columns = False
    _keeps_vision_fields = False

    def __init__(
        self,
        *args,
        data_collator=None,
        attn_implementation: str | None = "flatcollate",
        fused_loss: bool | str = False,
        **kwargs,
    ):
        training_args = kwargs.get("args", args[1] if len(args) > 1 else None)
        model = kwargs.get("model", args[0] if args else None)
        padding_free = training_args is not None and (
            training_args.padding_free
            or (training_args.packing and training_args.packing_strategy in {"bfd", "bfd_split"})
        )
        if not padding_free:
            if is_flattening_collator(data_collator):
                raise ValueError(
                    f"{type(data_collator).__name__} flattens batches, but padding-free training is off, so TRL would "
                    "feed it to an unprepared model; pass SFTConfig(padding_free=True, max_length=None) (or "
                    "packing=True with packing_strategy='bfd')."
                )
            if fused_loss:
                raise ValueError(
                    f"fused_loss={fused_loss!r} applies to a model FlatSFTTrainer prepares for flattened batches, but "
                    "padding-free training is off; pass SFTConfig(padding_free=True, max_length=None) (or packing=True "
                    "with packing_strategy='bfd'), or leave fused_loss False."
                )
            refuse_dropped_images(model, kwargs, args)
            warnings.warn(
                "FlatSFTTrainer without padding_free=True is plain SFTTrainer: padded batches and a model that is not "
                "prepared for flattening; pass SFTConfig(padding_free=True, max_length=None) (or packing=True with "
                "packing_strategy='bfd') to train padding-free, or use trl.SFTTrainer.",
                stacklevel=2,
            )
            super().__init__(*args, data_collator=data_collator, **kwargs)
            if isinstance(model, str):  # a model given by name is loaded now
                refuse_dropped_images(self.model, kwargs, args)
            return
        refuse_raw_image_rows(kwargs.get("train_dataset", args[3] if len(args) > 3 else None))
        self.packing_stats = None
        vision = is_image_text_model(model) or isinstance(data_collator, VisionDataCollatorWithFlattening)
        if vision and training_args.packing and "args" in kwargs and "train_dataset" in kwargs:
            kwargs = self._pack_image_text_rows(kwargs)
            training_args = kwargs["args"]
        refuse_image_packing(kwargs.get("model", args[0] if args else None), data_collator, training_args)
        super().__init__(*args, **kwargs)
        base = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model  # PEFT
        refuse_image_packing(base, data_collator, self.args)  # a model given by name is loaded now
        self._drops_mask_columns = True
        options = {"pad_to_multiple_of": self.args.pad_to_multiple_of, "pad_token_id": self._tokenizer.pad_token_id}
        if data_collator is None and is_image_text_model(base):
            data_collator = VisionDataCollatorWithFlattening.from_model(base, **options)
        self.data_collator = data_collator or DataCollatorWithFlattening(**options)
        self._keeps_vision_fields = isinstance(self.data_collator, VisionDataCollatorWithFlattening)
        prepare_model_for_flattening(base, attn_implementation=attn_implementation, fused_loss=fused_loss)
        if vars(base).get("accepts_loss_kwargs") is True:  # set by preparing, after Trainer read the class's False
            self.model_accepts_loss_kwargs = True  # so the step's tokens are counted and accumulation weighs them

    def _pack_image_text_rows(self, kwargs: dict) -> dict:
        """Pack `train_dataset` (and a map-style `eval_dataset` when eval packing is on) with `pack_dataset`, log
        what it did, and return the keyword arguments with the packed rows and `args` that do not pack again."""
        training_args = kwargs["args"]
        if training_args.max_length is None:
            raise ValueError("packing=True needs SFTConfig(max_length=...): the most tokens of one pack.")
        options = {
            "strategy": "bfd",
            "overlong": "split" if training_args.packing_strategy == "bfd_split" else "truncate",
        }
        kwargs = dict(kwargs)
        train = kwargs["train_dataset"]
        if isinstance(train, datasets.Dataset):
            kwargs["train_dataset"], self.packing_stats = pack_dataset(
                train, training_args.max_length, return_stats=True, **options
            )
            stats = self.packing_stats
            logger.info(
                "FlatSFTTrainer packed %d image-text rows into %d packs of <= %d tokens (fill %.2f%%, %.2f examples "
                "per pack), vision fields one entry per example: %s",
                stats.num_sequences,
                stats.num_packs,
                stats.pack_len,
                100 * stats.fill,
                stats.mean_sequences_per_pack,
                ", ".join(stats.vision_columns) or "none",
            )
        else:  # a stream is packed chunk by chunk as it is read
            kwargs["train_dataset"] = pack_dataset(train, training_args.max_length, **options)
            logger.info(
                "FlatSFTTrainer packs the image-text stream chunk by chunk into <= %d tokens.", training_args.max_length
            )
        eval_packing = training_args.packing if training_args.eval_packing is None else training_args.eval_packing
        if eval_packing and isinstance(kwargs.get("eval_dataset"), datasets.Dataset):
            kwargs["eval_dataset"] = pack_dataset(kwargs["eval_dataset"], training_args.max_length, **options)
        unpacked = copy.copy(training_args)  # the user's config is left as given
        unpacked.packing, unpacked.padding_free, unpacked.max_length = False, True, None
        kwargs["args"] = unpacked
        return kwargs

    def _set_signature_columns_if_needed(self):
        """TRL keeps `input_ids`, `labels` and `seq_lengths`; a vision collator also takes each example's vision
        fields and per-token types."""
        super()._set_signature_columns_if_needed()
        if self._keeps_vision_fields:
            kept = self._signature_columns
            self._signature_columns = [*kept, *(k for k in (*IMAGE_FIELDS, *TOKEN_TYPE_FIELDS) if k not in kept)]

    def _remove_unused_columns(self, dataset, description: str | None = None):
        """Map-style datasets: TRL's column removal, then mask columns TRL's collator would ignore."""
        dataset = super()._remove_unused_columns(dataset, description=description)
        leftover = [name for name in MASK_KEYS if name in dataset.column_names] if self._drops_mask_columns else []
        return dataset.remove_columns(leftover) if leftover else dataset

    def _get_collator_with_removed_columns(self, data_collator: Callable, description: str | None = None) -> Callable:
        """Iterable datasets: TRL's column removal, then mask fields TRL's collator would ignore, per batch."""
        data_collator = super()._get_collator_with_removed_columns(data_collator, description=description)
        if not self._drops_mask_columns:
            return data_collator
        return functools.partial(collate_without_masks, collator=data_collator)  # a partial pickles for workers


def is_image_text_model(model: Any) -> bool:
    """Whether `model` (a model, or a PEFT wrapper of one) has a vision tower (`flatcollate.vision.fields`).

    >>> from flatcollate.testing import tiny_vision_lm
    >>> is_image_text_model(tiny_vision_lm("llava")), is_image_text_model("org/model-name")
    (True, False)
    """
    return has_vision_tower(model)


def refuse_dropped_images(model: Any, kwargs: dict, args: tuple) -> None:
    """Raise where TRL's own path (padded batches, or `packing_strategy="wrapped"`) would train image placeholders
    without their images: rows a processor encoded (vision fields among the columns; TRL's collator keeps `input_ids`,
    `labels` and `attention_mask`), or packing with an image-text model (TRL packs `input_ids` and `labels` only).
    Raw image rows (`image`/`images`) on the padded path are TRL's own image route and pass."""
    training_args = kwargs.get("args", args[1] if len(args) > 1 else None)
    dataset = kwargs.get("train_dataset", args[3] if len(args) > 3 else None)
    columns = getattr(dataset, "column_names", None)
    if columns is None and dataset is not None:
        sample = next(iter(dataset))
        columns = list(sample) if isinstance(sample, Mapping) else []
    carried = [name for name in IMAGE_FIELDS if name in (columns or ())]
    packing = training_args is not None and training_args.packing
    if not carried and not (packing and is_image_text_model(model)):
        return
    what = f"the training rows carry `{carried[0]}`" if carried else "the model has a vision tower"
    path = f"packing_strategy={training_args.packing_strategy!r}" if packing else "padded batches (padding_free=False)"
    raise ValueError(
        f"FlatSFTTrainer: {what}, but padding-free training is off ({path}), so TRL's own path would run: it keeps "
        "`input_ids` and `labels` of each row and drops the vision fields, and the image placeholder tokens would "
        "train without their images. Pass SFTConfig(padding_free=True, max_length=None), or SFTConfig(packing=True, "
        "packing_strategy='bfd', max_length=...) to pack the rows with their images."
    )


def refuse_raw_image_rows(train_dataset: Any) -> None:
    """Raise for rows with raw images (an `image` or `images` column), which TRL refuses to train padding-free."""
    sample = next(iter(train_dataset)) if train_dataset is not None else {}
    found = [key for key in IMAGE_ROW_KEYS if isinstance(sample, Mapping) and key in sample]
    if found:
        raise ValueError(
            f"The training rows have an {found[0]!r} column: TRL turns such rows into pixels in its own collator, "
            "one padded batch at a time, and refuses padding_free=True for them. Encode the rows first with "
            "`flatcollate.data.make_supervised_dataset(processor, dataset)` (input_ids, labels, pixel_values, ...) "
            "and pass those: FlatSFTTrainer collates them with VisionDataCollatorWithFlattening. Or train padded "
            "with trl.SFTTrainer and padding_free=False."
        )


def refuse_image_packing(model: Any, collator: Any, training_args: Any) -> None:
    """Raise for packing with an image-text model that `FlatSFTTrainer` could not pack itself (a model given by name,
    `args` or `train_dataset` given by position): TRL packs `input_ids` and `labels` only."""
    vision = is_image_text_model(model) or isinstance(collator, VisionDataCollatorWithFlattening)
    if vision and training_args.packing:
        raise ValueError(
            "packing=True keeps only `input_ids` and `labels` of each row in TRL (`select_columns` before packing), "
            "so the images of an image-text model would be dropped while their placeholder tokens stay. Pass the "
            "loaded model, and `args=` and `train_dataset=` by keyword, for FlatSFTTrainer to pack the rows with their "
            "images (flatcollate.data.pack_dataset); or SFTConfig(padding_free=True, packing=False, max_length=None)."
        )


def is_flattening_collator(collator: Any) -> bool:
    """Whether `collator` is one of flatcollate's collators that flatten the batch into one row.

    >>> is_flattening_collator(DataCollatorWithFlattening()), is_flattening_collator(None)
    (True, False)
    """
    if isinstance(collator, DataCollatorForCompletionOnlyLM):
        return collator.padding_free
    return isinstance(collator, DataCollatorWithFlattening)


def collate_without_masks(features: Sequence[Mapping[str, Any]], *, collator: Callable) -> dict[str, Any]:
    """Call `collator` on `features` without their `completion_mask` / `assistant_masks` fields.

    >>> collate_without_masks([{"input_ids": [1, 2], "completion_mask": [0, 1]}], collator=list)
    [{'input_ids': [1, 2]}]
    """
    return collator([{key: value for key, value in feature.items() if key not in MASK_KEYS} for feature in features])
