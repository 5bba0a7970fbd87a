"""TRL's fused-head forward on flattened rows, returned in the layout of its padded batch.

TRL's preference trainers (`DPOTrainer`, `KTOTrainer`) call `model(input_ids=(N, L), attention_mask=(N, L),
labels=(N, L), fused_lm_head=True)` on right-padded batches and read per-token outputs of shape `(N, L - 1)`. A
`SequenceLayout` says where each token of a flattened row of `N` sequences sits in that padded batch; `FlatForward`
stands for the model: it runs it once over the row, the label shift stopping at every boundary, and lays the
per-token outputs out as the padded forward returns them::

    row            [a0 a1 a2 | b0 b1 | c0]       cu_seq_lens_q [0 3 5 6]
    padded         a0 a1 a2                     valid  1 1 1
                   b0 b1 0                             1 1 0
                   c0 0  0                             1 0 0
    outputs        (N, L - 1): position j of row k scores token j + 1 of sequence k, 0 past it
"""

from collections.abc import Mapping, Sequence

import torch
from trl.trainer.utils import FusedCausalLMOutput

from ..._conventions import IGNORE_INDEX, IMAGE_FIELDS, TOKEN_TYPE_FIELDS
from ...boundaries import Boundaries, next_token_labels

MODEL_INPUTS = ("input_ids", "position_ids", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")
VISION_INPUTS = (*TOKEN_TYPE_FIELDS, *IMAGE_FIELDS)
"""Fields of a flattened image-text row the model takes as they are: per-token types `(1, T)` and vision fields in
sequence order (`flatcollate.vision.VisionDataCollatorWithFlattening`)."""
PER_TOKEN_OUTPUTS = ("log_probs", "entropy", "log_sum_sq_probs", "mean_logits", "is_top1", "label_mask")


def is_flattened(inputs: Mapping, prefix: str = "") -> bool:
    """Whether a batch holds a flattened row of prompt + completion sequences under `prefix`-ed keys (what
    `flatcollate.preference`'s preference collators emit)."""
    return inputs.get(f"{prefix}cu_seq_lens_q") is not None and inputs.get(f"{prefix}completion_mask") is not None


class SequenceLayout:
    """Where each token of a flattened row of `N` sequences sits in TRL's right-padded `(N, L)` batch.

    Args:
        inputs (`Mapping`): a flattened batch: `input_ids`, `completion_mask` `(1, T)`, `cu_seq_lens_q` `(N + 1,)`
            and the model inputs of `MODEL_INPUTS` (and `VISION_INPUTS` of an image-text row), under `prefix`-ed keys.
        prefix (`str`, defaults to `""`): `"KL_"` reads the KL row of an unpaired preference batch.
    """

    def __init__(self, inputs: Mapping, prefix: str = ""):
        fields = (*MODEL_INPUTS, *VISION_INPUTS, "completion_mask")
        self.row = {key: inputs[prefix + key] for key in fields if inputs.get(prefix + key) is not None}
        self.boundaries = Boundaries.from_kwargs(self.row, rows=1, length=self.row["input_ids"].shape[1])
        self.count = len(self.boundaries.lengths)
        self.index, self.valid = self.boundaries.padded()  # (N, L)
        self._padded_ids = self.padded(self.row["input_ids"])
        completion = torch.where(self.row["completion_mask"].bool(), self.row["input_ids"], IGNORE_INDEX)
        self._padded_labels = self.padded(completion, fill=IGNORE_INDEX)

    def padded(self, flat: torch.Tensor, fill=0) -> torch.Tensor:
        """A `(1, T)` per-token field as `(N, L)`, `fill` past each sequence."""
        values = flat[0][self.index.to(flat.device)]
        return torch.where(self.valid.to(flat.device), values, torch.full_like(values, fill))

    def padded_inputs(self, prefix: str = "") -> dict[str, torch.Tensor]:
        """The padded `input_ids` (0 past each sequence), `attention_mask` and `completion_mask`, `(N, L)` int64, under
        `prefix`-ed keys: what TRL's trainers read of a batch."""
        return {
            f"{prefix}input_ids": self._padded_ids,
            f"{prefix}attention_mask": self.valid.long().to(self._padded_ids.device),
            f"{prefix}completion_mask": self.padded(self.row["completion_mask"]),
        }

    def holds(self, input_ids, attention_mask=None, labels=None) -> bool:
        """Whether a padded batch TRL passes to the model is this row's: the same ids, and the same attention mask and
        completion labels where given."""
        expected = ((input_ids, self._padded_ids), (attention_mask, self.valid), (labels, self._padded_labels))
        return all(
            given is None or (given.shape == mine.shape and torch.equal(given.to(mine.device), mine.to(given.dtype)))
            for given, mine in expected
        )

    def shift_labels(self) -> torch.Tensor:
        """Next-token labels over the row, `(1, T)`: completion tokens only, never across a boundary."""
        ids, completion = self.row["input_ids"], self.row["completion_mask"]
        return next_token_labels(torch.where(completion.bool(), ids, IGNORE_INDEX), self.boundaries.cu_seqlens.long())

    def padded_outputs(self, outputs: FusedCausalLMOutput) -> FusedCausalLMOutput:
        """The fused head's per-token fields over the row, laid out as its padded forward returns them:
        `(N, L - 1)`, position `j` of row `k` scoring token `j + 1` of sequence `k`."""
        fields = {key: getattr(outputs, key) for key in ("loss", "aux_loss")}
        for key in PER_TOKEN_OUTPUTS:
            value = getattr(outputs, key)
            fields[key] = None if value is None else self.padded(value)[:, :-1]
        return FusedCausalLMOutput(**fields)


class FlatForward:
    """Stands for a model inside a TRL trainer: its fused-head call runs the model once over the flattened row whose
    padded layout TRL passed (`input_ids`, and `attention_mask` / `labels` where given, must be one layout's) and
    returns the padded outputs (an image-text row runs with its vision fields and token types); any other call (the
    deprecated `return_outputs` path) runs the model as given.

    Two layouts that both match hold the same sequences (ids, lengths, completion masks), so either gives the same
    outputs; a call that matches none raises rather than guess.
    """

    def __init__(self, model, layouts: Sequence[SequenceLayout]):
        self.model, self.layouts = model, tuple(layouts)

    def __call__(self, *args, fused_lm_head: bool = False, **kwargs):
        if not fused_lm_head:
            return self.model(*args, **kwargs)
        layout = self.layout_of(kwargs.get("input_ids"), kwargs.get("attention_mask"), kwargs.get("labels"))
        options = {key: kwargs[key] for key in ("output_router_logits",) if key in kwargs}
        inputs = {key: layout.row[key] for key in (*MODEL_INPUTS, *VISION_INPUTS) if key in layout.row}
        outputs = self.model(
            **inputs, shift_labels=layout.shift_labels(), fused_lm_head=True, use_cache=False, **options
        )
        return layout.padded_outputs(outputs)

    def layout_of(self, input_ids, attention_mask=None, labels=None) -> SequenceLayout:
        """The layout whose padded batch TRL passed to the model."""
        if input_ids is None:
            raise ValueError("the fused-head call passed no `input_ids` keyword: there is no row to tell it from.")
        for layout in self.layouts:
            if layout.holds(input_ids, attention_mask, labels):
                return layout
        raise ValueError(
            f"the model was called with padded `input_ids` {tuple(input_ids.shape)} that are none of the flattened "
            f"rows' padded layouts {[tuple(layout.valid.shape) for layout in self.layouts]}; the batch was changed "
            "between the collator and the forward."
        )


def refuse_image_rows(dataset, *, trainer: str, padded_trainer: str) -> None:
    """Raise for a dataset with `image` / `images` columns: the flattened trainers collate text only."""
    columns = getattr(dataset, "column_names", None) or []
    if {"image", "images"} & set(columns):
        raise ValueError(
            f"{trainer} flattens text preference data; rows with images go through {padded_trainer}'s own padded "
            f"vision collator. Use trl.{padded_trainer} for this dataset."
        )


def refuse_padding_options(args) -> None:
    """Raise for `pad_to_multiple_of`, which shapes padded batches only."""
    if getattr(args, "pad_to_multiple_of", None) is not None:
        raise ValueError("`pad_to_multiple_of` shapes padded batches; a flattened row has none. Leave it None.")
