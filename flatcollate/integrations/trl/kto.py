"""`FlatKTOTrainer`: TRL's `KTOTrainer`, padding-free, with the same loss, metrics and optimizer steps.

`KTOTrainer` pads a batch of `B` unpaired examples into `(B, L)` and, for the KL term of `loss_type="kto"`, the same
prompts with mismatched completions into a second `(B, L')` batch. This subclass collates each into one flattened
row (`flatcollate.preference.DataCollatorForUnpairedPreference`) and runs the policy and the reference model once per
row, with the label shift stopping at every boundary. Everything after the forward is TRL's own code: the per-token
outputs are laid out as TRL's padded forward returns them (`(B, L - 1)`, zero past each sequence), so the KTO and
APO-zero losses, the KL estimate, the desirable/undesirable weights and every metric are computed by `KTOTrainer`
itself::

    collated      [p0 c0 | p1 c1 | p2 c2]    KL_ [p0 c2 | p1 c0 | p2 c1]     two rows, no padding
    forward       each model once per row               (TRL's fused LM head, pre-shifted labels)
    laid out      TRL's padded outputs of that row       -> KTOTrainer's loss and metrics

`KTOTrainer` calls the model once for the completions and once for the KL completions; the stand-in model answers
each call with the row whose padded `input_ids`, `attention_mask` and labels TRL passed, and raises if none is.
"""

from collections.abc import Mapping

from trl import KTOConfig, KTOTrainer

from ...preference.unpaired_collate import DataCollatorForUnpairedPreference
from .flat_forward import FlatForward, SequenceLayout, is_flattened, refuse_image_rows, refuse_padding_options
from .prepared import PreparedModelsMixin

REFERENCE_FIELDS = ("ref_logps", "ref_KL_logps")


class FlatKTOTrainer(PreparedModelsMixin, KTOTrainer):
    """`trl.KTOTrainer` on flattened rows: the completions of a batch in one row, their KL completions in another, the
    policy and reference models prepared with `prepare_model_for_flattening` (the reference's log-probabilities too,
    live or precomputed).

    One optimizer step equals `KTOTrainer`'s padded step on the same batch (loss, KL, rewards, log-probs, logits and
    entropy metrics, parameters after the step), for `loss_type="kto"` and `"apo_zero_unpaired"`, with PEFT too; the
    number of optimizer steps is unchanged.

    Args:
        *args, **kwargs: as for `KTOTrainer`.
        data_collator (*optional*): defaults to `DataCollatorForUnpairedPreference(max_length=args.max_length)`.
        attn_implementation (`str`, *optional*, defaults to `"flatcollate"`): passed to
            `prepare_model_for_flattening`; `None` keeps the model's backend (e.g. `flash_attention_2`).
    """

    def __init__(self, *args, data_collator=None, attn_implementation: str | None = "flatcollate", **kwargs):
        self._init_flattening(attn_implementation)
        names = ("model", "ref_model", "args", "data_collator", "train_dataset")
        given = {**dict(zip(names, args, strict=False)), **kwargs}
        refuse_image_rows(given.get("train_dataset"), trainer="FlatKTOTrainer", padded_trainer="KTOTrainer")
        training_args = given.get("args")
        refuse_padding_options(training_args)
        if data_collator is None:  # without `args`, KTOTrainer builds a default KTOConfig: its `max_length`
            max_length = KTOConfig.max_length if training_args is None else training_args.max_length
            data_collator = DataCollatorForUnpairedPreference(max_length=max_length)
        super().__init__(*args, data_collator=data_collator, **kwargs)
        self._prepare_models()

    def compute_ref_log_probs(self, model, inputs):
        """The reference log-probabilities of a flattened batch (and of its KL row), by `KTOTrainer`'s own code."""
        if not is_flattened(inputs):
            return super().compute_ref_log_probs(model, inputs)
        layouts = self._layouts(inputs)
        return super().compute_ref_log_probs(FlatForward(model, layouts), padded_batch(layouts, inputs))

    def _compute_kl_logps(self, model, batch):
        """The KL completions' log-probabilities of a flattened batch, by `KTOTrainer`'s own code."""
        if not is_flattened(batch):
            return super()._compute_kl_logps(model, batch)
        layouts = self._layouts(batch)
        return super()._compute_kl_logps(FlatForward(model, layouts), padded_batch(layouts, batch))

    def _compute_loss(self, model, inputs, return_outputs):
        if not is_flattened(inputs):
            return super()._compute_loss(model, inputs, return_outputs)
        layouts = self._layouts(inputs)
        padded = padded_batch(layouts, inputs)
        if not self.precompute_ref_logps:  # the reference over the flattened rows too
            padded["ref_logps"], ref_kl_logps = self.compute_ref_log_probs(self._reference_model(), inputs)
            if self.calculate_KL:
                padded["ref_KL_logps"] = ref_kl_logps
        return self._loss_with_reference_given(FlatForward(model, layouts), padded, return_outputs)

    def _layouts(self, inputs: Mapping) -> list[SequenceLayout]:
        """The completions' row and, when the loss estimates the KL term, the KL completions' row."""
        return unpaired_layouts(inputs, with_kl=self.calculate_KL)


def unpaired_layouts(inputs: Mapping, *, with_kl: bool) -> list[SequenceLayout]:
    """The layouts of a flattened unpaired batch: its completions' row, then its KL row when `with_kl`; each holds one
    sequence per example."""
    if with_kl and not is_flattened(inputs, "KL_"):
        raise ValueError(
            "loss_type='kto' estimates the KL term from each example's `KL_completion_ids`, and this flattened batch "
            "has no KL row (`KL_input_ids`, `KL_cu_seq_lens_q`, `KL_completion_mask`). Collate the dataset KTOTrainer "
            "prepares with `flatcollate.preference.DataCollatorForUnpairedPreference`."
        )
    layouts = [SequenceLayout(inputs)] + ([SequenceLayout(inputs, "KL_")] if with_kl else [])
    counts = [layout.count for layout in layouts]
    if any(count != len(inputs["label"]) for count in counts):
        raise ValueError(
            f"a flattened unpaired batch holds one sequence per example in each row; got {counts} sequences for "
            f"{len(inputs['label'])} labels."
        )
    return layouts


def padded_batch(layouts: list[SequenceLayout], inputs: Mapping) -> dict:
    """What `KTOTrainer` reads of a batch: padded `input_ids`, `attention_mask`, `completion_mask` `(B, L)` and their
    `KL_` counterparts, `label` `(B,)`, and the precomputed reference log-probabilities `(B,)` where the batch has
    them."""
    padded = layouts[0].padded_inputs()
    for layout in layouts[1:]:
        padded.update(layout.padded_inputs("KL_"))
    padded["label"] = inputs["label"]
    padded.update({key: inputs[key] for key in REFERENCE_FIELDS if key in inputs})
    return padded
