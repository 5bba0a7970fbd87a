"""TRL glue: `FlatSFTTrainer`, an `SFTTrainer` that takes flatcollate's collators with `padding_free=True`.

TRL refuses a custom `data_collator` when `padding_free=True` and builds its own. This subclass lets TRL prepare the
dataset as usual (tokenization, completion/assistant masks folded into `labels`, `seq_lengths` when packing), then
collates with flatcollate (vectorized, validated, boundary kwargs always present) and prepares the model so that
nothing can attend across sequences.
"""

from trl import SFTTrainer

from ..collate import DataCollatorWithFlattening
from ..modeling import prepare_model_for_flattening


class FlatSFTTrainer(SFTTrainer):
    """`trl.SFTTrainer` that collates padding-free batches with flatcollate.

    With `SFTConfig(padding_free=True)` (or BFD packing), the batch is collated by `data_collator` (default:
    `DataCollatorWithFlattening` with the config's `pad_to_multiple_of`) and the model goes through
    `prepare_model_for_flattening`. Without padding-free it is exactly `SFTTrainer`.

    Args:
        *args, **kwargs: as for `SFTTrainer`.
        data_collator (*optional*): a flatcollate collator, e.g. `DataCollatorForCompletionOnlyLM(...)`.
        attn_implementation (`str`, *optional*, defaults to `"flatcollate"`): passed to
            `prepare_model_for_flattening`; `None` keeps the model's backend (e.g. `flash_attention_2`).

    Example (TRL requires `max_length=None` for padding-free training without packing):

    ```python
    from flatcollate.integrations.trl import FlatSFTTrainer
    from trl import SFTConfig

    trainer = FlatSFTTrainer(model=model, args=SFTConfig(padding_free=True, max_length=None), train_dataset=ds)
    ```
    """

    def __init__(self, *args, data_collator=None, attn_implementation: str | None = "flatcollate", **kwargs):
        training_args = kwargs.get("args", args[1] if len(args) > 1 else None)
        padding_free = training_args is not None and (
            training_args.padding_free
            or (training_args.packing and training_args.packing_strategy in {"bfd", "bfd_split"})
        )
        if not padding_free:
            super().__init__(*args, data_collator=data_collator, **kwargs)
            return
        super().__init__(*args, **kwargs)
        self.data_collator = data_collator or DataCollatorWithFlattening(
            pad_to_multiple_of=self.args.pad_to_multiple_of, pad_token_id=self._tokenizer.pad_token_id
        )
        base = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model  # PEFT
        prepare_model_for_flattening(base, attn_implementation=attn_implementation)
