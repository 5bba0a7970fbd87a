"""`FlatDPOTrainer`: TRL's `DPOTrainer`, padding-free, with the same loss, metrics and optimizer steps.

TRL 1.16's `DPOTrainer(padding_free=True)` warns that padding-free is unavailable and pads. This subclass collates each
batch of `N` pairs into one flattened row of `2N` sequences (`flatcollate.preference.DataCollatorForPreference`) and
runs the policy and the reference model on that row, with the label shift stopping at every boundary. Everything
after the forward is TRL's own code: the per-token log-probabilities are laid out as TRL's padded forward returns
them (`(2N, L - 1)`, zero past each sequence), so every loss type, `ld_alpha`, WPO weights, the metrics and the token
counts are computed by `DPOTrainer` itself::

    collated      [p0 c0 | p1 c1 | p0 r0 | p1 r1]                  one row, no padding
    forward       policy and reference, each once over the row      (TRL's fused LM head, pre-shifted labels)
    laid out      row k of TRL's padded [chosen; rejected] batch     -> DPOTrainer's loss and metrics

Image-text pairs (`image` / `images` rows, processed on the fly as TRL's `DataCollatorForVisionPreference` does) are
collated by `flatcollate.preference.vision_collate.VisionDataCollatorForPreference`: each pair's images go with its
chosen and its rejected sequence, and the prepared model computes multimodal positions per sequence. Families proven
exact against `DPOTrainer`'s padded vision step have `Family.dpo_images` (`flatcollate.families`); others are refused.
"""

from collections.abc import Mapping

from trl import DPOConfig, DPOTrainer

from ...families import FAMILIES, family_of
from ...preference.collate import DataCollatorForPreference
from ...preference.vision_collate import VisionDataCollatorForPreference
from .flat_forward import FlatForward, SequenceLayout, is_flattened, refuse_padding_options
from .prepared import PreparedModelsMixin


class FlatDPOTrainer(PreparedModelsMixin, DPOTrainer):
    """`trl.DPOTrainer` on flattened rows: one row of `2N` sequences per batch, the policy and reference models
    prepared with `prepare_model_for_flattening` (the reference's log-probabilities too, live or precomputed).

    One optimizer step equals `DPOTrainer`'s padded step on the same batch (loss, rewards/margins/accuracies metrics,
    parameters after the step), for every `loss_type`, with PEFT too; the number of optimizer steps is unchanged.
    `padding_free` in the config is not read: this trainer is always padding-free.

    Args:
        *args, **kwargs: as for `DPOTrainer`.
        data_collator (*optional*): defaults to `DataCollatorForPreference(max_length=args.max_length,
            truncation_mode=args.truncation_mode)`, and for rows with images to
            `VisionDataCollatorForPreference.from_model(model, processing_class, max_length=args.max_length)`.
        attn_implementation (`str`, *optional*, defaults to `"flatcollate"`): passed to
            `prepare_model_for_flattening`; `None` keeps the model's backend (e.g. `flash_attention_2`).
    """

    def __init__(self, *args, data_collator=None, attn_implementation: str | None = "flatcollate", **kwargs):
        self._init_flattening(attn_implementation)
        names = ("model", "ref_model", "args", "data_collator", "train_dataset")
        given = {**dict(zip(names, args, strict=False)), **kwargs}
        columns = getattr(given.get("train_dataset"), "column_names", None) or []
        vision = bool({"image", "images"} & set(columns))
        training_args = given.get("args")
        refuse_padding_options(training_args)
        if data_collator is None and not vision:  # without `args`, DPOTrainer builds a default DPOConfig: cut there
            cut = DPOConfig if training_args is None else training_args
            data_collator = DataCollatorForPreference(max_length=cut.max_length, truncation_mode=cut.truncation_mode)
        if vision and hasattr(given.get("model"), "config"):  # a model given by name is read once loaded
            refuse_unproven_family(given["model"])
        super().__init__(*args, data_collator=data_collator, **kwargs)
        if vision:
            refuse_unproven_family(self.model)
            if data_collator is None:  # TRL's padded vision collator, built by `DPOTrainer.__init__`, is replaced
                self.data_collator = VisionDataCollatorForPreference.from_model(
                    self.model, self.processing_class, max_length=self.args.max_length
                )
        self._prepare_models()

    def compute_ref_log_probs(self, model, inputs):
        """The reference log-probabilities of a flattened batch, computed over the row by `DPOTrainer`'s own code."""
        if not is_flattened(inputs):
            return super().compute_ref_log_probs(model, inputs)
        layout = pair_layout(inputs)
        return super().compute_ref_log_probs(FlatForward(model, [layout]), padded_pairs(layout, inputs))

    def _compute_loss(self, model, inputs, return_outputs):
        if not is_flattened(inputs):
            return super()._compute_loss(model, inputs, return_outputs)
        layout = pair_layout(inputs)
        padded = padded_pairs(layout, inputs)
        if not self.precompute_ref_logps:  # the reference over the flattened row too
            reference = self._reference_model()
            padded["ref_chosen_logps"], padded["ref_rejected_logps"] = self.compute_ref_log_probs(reference, inputs)
        return self._loss_with_reference_given(FlatForward(model, [layout]), padded, return_outputs)


def refuse_unproven_family(model) -> None:
    """Raise for image rows on a family whose flattened DPO step is not tested equal to the padded one."""
    family = getattr(getattr(model, "config", None), "model_type", None)
    if not family_of(family or "").dpo_images:
        proven = sorted(name for name, record in FAMILIES.items() if record.dpo_images)
        raise ValueError(
            f"FlatDPOTrainer on rows with images is tested equal to DPOTrainer's padded step for "
            f"{', '.join(proven)}; the model is {family!r}. Use trl.DPOTrainer for this model."
        )


def pair_layout(inputs: Mapping) -> SequenceLayout:
    """The layout of a flattened row of `2N` sequences: every chosen one, then every rejected one."""
    layout = SequenceLayout(inputs)
    if layout.count % 2:
        raise ValueError(f"a batch of preference pairs has an even number of sequences, got {layout.count}.")
    return layout


def padded_pairs(layout: SequenceLayout, inputs: Mapping) -> dict:
    """What `DPOTrainer` reads of a batch: padded `input_ids`, `attention_mask`, `completion_mask` `(2N, L)`, and the
    precomputed reference log-probabilities `(N,)` where the batch has them."""
    reference = {key: inputs[key] for key in ("ref_chosen_logps", "ref_rejected_logps") if key in inputs}
    return {**layout.padded_inputs(), **reference}
