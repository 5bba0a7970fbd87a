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
"""

from collections.abc import Mapping

import torch
from trl import DPOTrainer
from trl.trainer.utils import FusedCausalLMOutput

from ..._conventions import IGNORE_INDEX
from ...modeling import prepare_model_for_flattening
from ...preference.collate import DataCollatorForPreference
from ...preference.logprobs import next_token_labels

MODEL_INPUTS = ("input_ids", "position_ids", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")
PER_TOKEN_OUTPUTS = ("log_probs", "entropy", "log_sum_sq_probs", "mean_logits", "is_top1", "label_mask")


class FlatDPOTrainer(DPOTrainer):
    """`trl.DPOTrainer` on flattened rows: one row of `2N` sequences per batch, the policy and reference models
    prepared with `prepare_model_for_flattening` (the reference's log-probabilities too, live or precomputed).

    One optimizer step equals `DPOTrainer`'s padded step on the same batch (loss, rewards/margins/accuracies metrics,
    parameters after the step), for every `loss_type`, with PEFT too; the number of optimizer steps is unchanged.
    `padding_free` in the config is not read: this trainer is always padding-free.

    Args:
        *args, **kwargs: as for `DPOTrainer`.
        data_collator (*optional*): defaults to `DataCollatorForPreference(max_length=args.max_length,
            truncation_mode=args.truncation_mode)`.
        attn_implementation (`str`, *optional*, defaults to `"flatcollate"`): passed to
            `prepare_model_for_flattening`; `None` keeps the model's backend (e.g. `flash_attention_2`).
    """

    def __init__(self, *args, data_collator=None, attn_implementation: str | None = "flatcollate", **kwargs):
        self._attn_implementation = attn_implementation
        self._prepared = False
        names = ("model", "ref_model", "args", "data_collator", "train_dataset")
        given = {**dict(zip(names, args, strict=False)), **kwargs}
        _refuse_image_rows(given.get("train_dataset"))
        training_args = given.get("args")
        if getattr(training_args, "pad_to_multiple_of", None) is not None:
            raise ValueError("`pad_to_multiple_of` shapes padded batches; a flattened row has none. Leave it None.")
        if data_collator is None and training_args is not None:
            data_collator = DataCollatorForPreference(
                max_length=training_args.max_length, truncation_mode=training_args.truncation_mode
            )
        super().__init__(*args, data_collator=data_collator or DataCollatorForPreference(), **kwargs)
        self._prepare_models()

    def _prepare_models(self) -> None:
        """Prepare the policy (its base model under PEFT) and the reference model, once: before the reference
        log-probabilities are precomputed, which `DPOTrainer.__init__` does."""
        if self._prepared:
            return
        policy = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
        for model in (policy, self.ref_model):
            if model is not None:
                prepare_model_for_flattening(model, attn_implementation=self._attn_implementation)
        self._prepared = True

    def _precompute_ref_logps(self, dataset, name: str, batch_size: int):
        self._prepare_models()
        return super()._precompute_ref_logps(dataset, name, batch_size)

    def compute_ref_log_probs(self, model, inputs):
        """The reference log-probabilities of a flattened batch, computed over the row by `DPOTrainer`'s own code."""
        if not is_flattened_pairs(inputs):
            return super().compute_ref_log_probs(model, inputs)
        layout = PairLayout(inputs)
        return super().compute_ref_log_probs(FlatForward(model, layout), layout.padded_inputs())

    def _compute_loss(self, model, inputs, return_outputs):
        if not is_flattened_pairs(inputs):
            return super()._compute_loss(model, inputs, return_outputs)
        layout = PairLayout(inputs)
        padded = layout.padded_inputs()
        precomputed = self.precompute_ref_logps
        if not precomputed:  # the reference over the flattened row too, then TRL's precomputed branch takes it
            reference = self.ref_model if self.ref_model is not None else self.model
            padded["ref_chosen_logps"], padded["ref_rejected_logps"] = self.compute_ref_log_probs(reference, inputs)
        try:
            self.precompute_ref_logps = True
            return super()._compute_loss(FlatForward(model, layout), padded, return_outputs)
        finally:
            self.precompute_ref_logps = precomputed


def is_flattened_pairs(inputs: Mapping) -> bool:
    """Whether a batch is a flattened row of preference pairs (`DataCollatorForPreference`'s output)."""
    return inputs.get("cu_seq_lens_q") is not None and inputs.get("completion_mask") is not None


class PairLayout:
    """Where each token of a flattened row of `2N` sequences sits in TRL's padded `(2N, L)` batch."""

    def __init__(self, inputs: Mapping):
        self.inputs = inputs
        bounds = inputs["cu_seq_lens_q"].long()
        self.bounds = bounds.cpu()
        starts, lengths = bounds[:-1], bounds[1:] - bounds[:-1]
        if len(lengths) % 2:
            raise ValueError(f"a batch of preference pairs has an even number of sequences, got {len(lengths)}.")
        width = int(lengths.max())
        offsets = torch.arange(width, device=bounds.device)
        self.valid = offsets[None] < lengths[:, None]  # (2N, L)
        self.index = (starts[:, None] + offsets[None]).clamp(max=int(bounds[-1]) - 1)

    def padded(self, flat: torch.Tensor, fill=0) -> torch.Tensor:
        """A `(1, T)` per-token field as `(2N, L)`, `fill` past each sequence."""
        values = flat[0][self.index.to(flat.device)]
        return torch.where(self.valid.to(flat.device), values, torch.full_like(values, fill))

    def padded_inputs(self) -> dict:
        """What `DPOTrainer` reads of a batch: padded `input_ids`, `attention_mask`, `completion_mask`, and the
        precomputed reference log-probabilities where the batch has them."""
        inputs = self.inputs
        padded = {
            "input_ids": self.padded(inputs["input_ids"]),
            "attention_mask": self.valid.long().to(inputs["input_ids"].device),
            "completion_mask": self.padded(inputs["completion_mask"]),
        }
        for key in ("ref_chosen_logps", "ref_rejected_logps"):
            if key in inputs:
                padded[key] = inputs[key]
        return padded

    def shift_labels(self) -> torch.Tensor:
        """Next-token labels over the row, `(1, T)`: completion tokens only, never across a boundary."""
        ids, completion = self.inputs["input_ids"], self.inputs["completion_mask"]
        return next_token_labels(torch.where(completion.bool(), ids, IGNORE_INDEX), self.bounds)

    def padded_outputs(self, outputs: FusedCausalLMOutput) -> FusedCausalLMOutput:
        """The fused head's per-token fields over the row, laid out as its padded forward returns them:
        `(2N, L - 1)`, position `j` of row `k` scoring token `j + 1` of sequence `k`."""
        fields = {key: getattr(outputs, key) for key in ("loss", "aux_loss")}
        for key in PER_TOKEN_OUTPUTS:
            value = getattr(outputs, key)
            fields[key] = None if value is None else self.padded(value)[:, :-1]
        return FusedCausalLMOutput(**fields)


class FlatForward:
    """Stands for a model inside `DPOTrainer`: its fused-head call runs the model once over the flattened row and
    returns the padded layout; any other call (the deprecated `return_outputs` path) runs the model as given."""

    def __init__(self, model, layout: PairLayout):
        self.model, self.layout = model, layout

    def __call__(self, *args, fused_lm_head: bool = False, **kwargs):
        if not fused_lm_head:
            return self.model(*args, **kwargs)
        inputs = {key: self.layout.inputs[key] for key in MODEL_INPUTS if key in self.layout.inputs}
        options = {key: kwargs[key] for key in ("output_router_logits",) if key in kwargs}
        outputs = self.model(
            **inputs, shift_labels=self.layout.shift_labels(), fused_lm_head=True, use_cache=False, **options
        )
        return self.layout.padded_outputs(outputs)


def _refuse_image_rows(dataset) -> None:
    columns = getattr(dataset, "column_names", None) or []
    if {"image", "images"} & set(columns):
        raise ValueError(
            "FlatDPOTrainer flattens text preference pairs; rows with images go through DPOTrainer's own padded "
            "vision collator. Use trl.DPOTrainer for this dataset."
        )
