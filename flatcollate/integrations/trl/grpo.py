"""`FlatGRPOTrainer`: TRL's `GRPOTrainer` with its log-prob passes (policy, old policy, reference) padding-free.

GRPO scores each completion with the policy, and where asked with the old policy and the reference model, over a
batch of prompts left-padded to the longest prompt and completions right-padded to the longest completion. Here each
pass runs once over one flattened row of the batch's real tokens (the prompt and completion of every row, back to
back), with the label shift stopping at every boundary, and the per-token outputs are laid out as
`GRPOTrainer._get_per_token_logps_and_entropies` returns them, `(B, completion width)`, zero on padding; the rest
(generation, rewards, advantages, the loss and its metrics) is `GRPOTrainer`'s own code::

    padded rows        [_ _ p p | c c c _]   [p p p p | c _ _ _]     attention mask 0 on `_`
    flattened row      [p p c c c | p p p p c]                        one forward per model
    laid out           (B, 4): [lp(c) lp(c) lp(c) 0]  [lp(c) 0 0 0]

Batches with images, and rows whose real tokens are not one contiguous run, take `GRPOTrainer`'s padded pass.
"""

import torch
from trl import GRPOTrainer

from ..._conventions import IGNORE_INDEX
from ...boundaries import Boundaries, next_token_labels
from ...modeling import prepare_model_for_flattening


class FlatGRPOTrainer(GRPOTrainer):
    """`trl.GRPOTrainer` whose log-prob passes run on flattened rows; the policy (its base model under PEFT) and the
    reference model are prepared with `prepare_model_for_flattening` (generation is unchanged: a prepared model
    generates from padded batches as before).

    Args:
        *args, **kwargs: as for `GRPOTrainer`.
        attn_implementation (`str`, *optional*, defaults to `"flatcollate"`): passed to
            `prepare_model_for_flattening`; `None` keeps the model's backend.
    """

    def __init__(self, *args, attn_implementation: str | None = "flatcollate", **kwargs):
        super().__init__(*args, **kwargs)
        policy = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
        for model in (policy, self.ref_model):
            if model is not None:
                prepare_model_for_flattening(model, attn_implementation=attn_implementation)

    def _get_per_token_logps_and_entropies(
        self,
        model,
        input_ids,
        attention_mask,
        logits_to_keep,
        batch_size=None,
        compute_entropy=False,
        compute_aux_loss=False,
        **image_inputs,
    ):
        options = {"batch_size": batch_size, "compute_entropy": compute_entropy, "compute_aux_loss": compute_aux_loss}
        rows = CompletionRows(attention_mask, logits_to_keep)
        if any(value is not None for value in image_inputs.values()) or not rows.flattenable:
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, **options, **image_inputs
            )
        extra = {"output_router_logits": True} if compute_aux_loss else {}
        with self.accelerator.autocast():
            outputs = model(
                **rows.model_inputs(input_ids),
                shift_labels=rows.shift_labels(input_ids),
                fused_lm_head=True,
                use_cache=False,
                **extra,
            )
        entropies = rows.completion_view(outputs.entropy) if compute_entropy else None
        return rows.completion_view(outputs.log_probs), entropies, outputs.aux_loss if compute_aux_loss else None


class CompletionRows:
    """Where the real tokens of a padded `(B, L)` prompt + completion batch sit in one flattened row, and where each
    completion token's log-probability goes back in the `(B, K)` completion layout (`K = logits_to_keep`)."""

    def __init__(self, attention_mask: torch.Tensor, logits_to_keep: int):
        self.real = attention_mask.bool()
        self.width = logits_to_keep
        lengths = self.real.sum(dim=1)
        self.boundaries = Boundaries.from_lengths(lengths.tolist(), device=lengths.device)
        # A row flattens when its real tokens are one run (left-padded prompt, right-padded completion) and not empty.
        first = self.real.int().argmax(dim=1)
        span = torch.arange(self.real.shape[1], device=lengths.device)[None]
        run = (span >= first[:, None]) & (span < (first + lengths)[:, None])
        self.flattenable = bool((lengths > 0).all()) and torch.equal(run, self.real)

    def model_inputs(self, input_ids: torch.Tensor) -> dict:
        """The flattened row with restarting positions and its boundaries."""
        return {
            "input_ids": input_ids[self.real][None],
            "position_ids": self.boundaries.position_ids().to(input_ids.device)[None],
            **self.boundaries.kwargs(),
        }

    def shift_labels(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Next-token labels over the row: the completion tokens (the last `K` columns), never across a boundary."""
        scored = torch.zeros_like(self.real)
        scored[:, -self.width :] = True
        labels = torch.where(scored, input_ids, IGNORE_INDEX)[self.real][None]
        return next_token_labels(labels, self.boundaries.cu_seqlens.long())

    def completion_view(self, flat: torch.Tensor) -> torch.Tensor:
        """A `(1, T)` per-token output of the row as `(B, K)`: entry `j` of row `b` scores its completion token `j`
        (predicted at the token before it), 0 where that column is padding."""
        where = self.real.flatten().cumsum(0).view_as(self.real) - 1  # each real token's place in the row
        target = where[:, -self.width :] - 1  # the prediction of a token sits at the token before it
        valid = self.real[:, -self.width :] & (target >= self.boundaries.cu_seqlens[:-1, None].long())
        values = flat[0][target.clamp(min=0).to(flat.device)]
        return torch.where(valid.to(flat.device), values, torch.zeros_like(values))
