"""What `FlatDPOTrainer` and `FlatKTOTrainer` share around TRL's own code: the policy and the reference model prepared
once, before TRL precomputes reference log-probabilities, and the loss computed by TRL's precomputed-reference branch
on a padded layout whose reference values were taken over the flattened rows."""

from ...modeling import prepare_model_for_flattening


class PreparedModelsMixin:
    """Mixed in before a TRL preference trainer (`class FlatDPOTrainer(PreparedModelsMixin, DPOTrainer)`)."""

    def _init_flattening(self, attn_implementation: str | None) -> None:
        """Record the backend to prepare with; call before the trainer's `__init__` (which may precompute)."""
        self._attn_implementation = attn_implementation
        self._prepared = False

    def _prepare_models(self) -> None:
        """Prepare the policy (its base model under PEFT) and the reference model with
        `prepare_model_for_flattening`, once: before the reference log-probabilities are precomputed, which the
        trainer's `__init__` does."""
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

    def _reference_model(self):
        """The model whose log-probabilities are the reference: `ref_model`, or the policy (its adapters disabled
        by TRL under PEFT)."""
        return self.ref_model if self.ref_model is not None else self.model

    def _loss_with_reference_given(self, forward, padded: dict, return_outputs: bool):
        """The trainer's own `_compute_loss` on `padded`, which holds the reference log-probabilities already (taken
        over the flattened rows), so its precomputed-reference branch reads them instead of running the reference
        on the padded batch."""
        precomputed = self.precompute_ref_logps
        try:
            self.precompute_ref_logps = True
            return super()._compute_loss(forward, padded, return_outputs)
        finally:
            self.precompute_ref_logps = precomputed
