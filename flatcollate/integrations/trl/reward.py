"""TRL glue: `FlatRewardTrainer`, a `RewardTrainer` that trains a reward model on flattened batches.

`trl.RewardTrainer` pads each batch's chosen sequences, then its rejected ones, into `2B` rows, and reads one score per
row from the model's forward. Here the same `2B` sequences go into one row with no padding
(`DataCollatorForRewardPairs`), and `sequence_scores` reads one score per sequence from the backbone and head. The
loss, margin, centring term and metrics are `RewardTrainer.compute_loss`'s own, computed on those scores.
"""

from transformers.modeling_outputs import SequenceClassifierOutput
from trl import RewardTrainer

from ...preference.reward_collate import DataCollatorForRewardPairs
from ...preference.scores import prepare_reward_model, sequence_scores


class FlatRewardTrainer(RewardTrainer):
    """`trl.RewardTrainer`, padding-free: each batch of pairs is one flattened row.

    The dataset is prepared by TRL (`chosen` / `rejected` text tokenized into `chosen_ids` / `rejected_ids`, an eos
    appended, pairs longer than `max_length` dropped); batches, optimizer steps, loss (with `margin` and
    `center_rewards_coefficient`) and logged metrics are `RewardTrainer`'s, on the scores each sequence gets alone.
    The model (or the one a PEFT model wraps, e.g. LoRA with `modules_to_save=["score"]`) goes through
    `prepare_reward_model`: its backbone takes flattened rows, its own forward keeps refusing them.

    Single process only: the scores come from the backbone and head, not from the model's forward, which
    `DistributedDataParallel` and FSDP need to run to synchronise gradients. `pad_to_multiple_of` is refused (the
    flattened row is not padded).

    Args:
        *args, **kwargs: as for `RewardTrainer`.
        data_collator (*optional*): defaults to `DataCollatorForRewardPairs()`; any collator must emit a flattened row
            with every chosen sequence, then every rejected one (`cu_seq_lens_q` marking them).
        attn_implementation (`str`, *optional*, defaults to `"flatcollate"`): passed to `prepare_reward_model`;
            `None` keeps the model's backend (e.g. `flash_attention_2`).

    Example:

    ```python
    from flatcollate.integrations.trl import FlatRewardTrainer
    from trl import RewardConfig

    trainer = FlatRewardTrainer(model=model, args=RewardConfig(...), train_dataset=pairs, processing_class=tokenizer)
    ```
    """

    def __init__(self, *args, data_collator=None, attn_implementation: str | None = "flatcollate", **kwargs):
        training_args = kwargs.get("args", args[1] if len(args) > 1 else None)
        if training_args is not None and training_args.pad_to_multiple_of is not None:
            raise ValueError(
                f"pad_to_multiple_of={training_args.pad_to_multiple_of} rounds the width of padded rows; "
                "FlatRewardTrainer collates each batch into one row without padding. Set "
                "`RewardConfig(pad_to_multiple_of=None)`, or train with `trl.RewardTrainer`."
            )
        super().__init__(*args, data_collator=data_collator or DataCollatorForRewardPairs(), **kwargs)
        if self.args.world_size > 1 or self.is_deepspeed_enabled or self.is_fsdp_enabled:
            raise ValueError(
                "FlatRewardTrainer runs in a single process: it reads the scores from the backbone and head, outside "
                "the model's forward, which DistributedDataParallel, FSDP and DeepSpeed wrap to synchronise gradients. "
                "Train on one device, or use `trl.RewardTrainer` (padded batches)."
            )
        prepare_reward_model(self.model, attn_implementation=attn_implementation)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """`RewardTrainer.compute_loss` on the scores of a flattened row.

        The scores `(2B, 1)` (chosen, then rejected) stand in for the padded model's `logits`; an `attention_mask` of
        ones over the row stands in for the padded one, whose sum (the token count TRL logs) is the row's length.
        """
        if "cu_seq_lens_q" not in inputs:
            raise ValueError(
                f"FlatRewardTrainer got a batch without `cu_seq_lens_q` (keys: {sorted(inputs)}): its collator must "
                "flatten each batch of pairs into one row, e.g. `flatcollate.preference.DataCollatorForRewardPairs()` "
                "(the default), not TRL's padding `DataCollatorForPreference`."
            )
        outputs = SequenceClassifierOutput(logits=sequence_scores(model, inputs))
        scored = {"attention_mask": inputs["input_ids"].new_ones(inputs["input_ids"].shape)}
        if "margin" in inputs:
            scored["margin"] = inputs["margin"]
        return super().compute_loss(
            lambda **_: outputs, scored, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
        )
