"""`FlatForward` answers each fused-head call of a TRL trainer with the flattened row whose padded batch it was given,
and refuses a batch that is none of its rows'; `SequenceLayout` lays a row out as TRL pads it."""

import pytest
import torch

from flatcollate.integrations.trl.flat_forward import FlatForward, SequenceLayout
from flatcollate.preference import DataCollatorForUnpairedPreference

pytest.importorskip("trl")

EXAMPLES = [
    {"prompt_ids": [1, 2], "completion_ids": [3], "KL_completion_ids": [4, 5], "label": True},
    {"prompt_ids": [6], "completion_ids": [4, 5], "KL_completion_ids": [3], "label": False},
]


def test_the_padded_layout_is_trls():
    batch = DataCollatorForUnpairedPreference()(EXAMPLES)
    padded = SequenceLayout(batch, "KL_").padded_inputs("KL_")
    assert padded.keys() == {"KL_input_ids", "KL_attention_mask", "KL_completion_mask"}
    assert padded["KL_input_ids"].tolist() == [[1, 2, 4, 5], [6, 3, 0, 0]]
    assert padded["KL_attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert padded["KL_completion_mask"].tolist() == [[0, 0, 1, 1], [0, 1, 0, 0]]


def test_each_call_gets_the_row_it_was_given_and_a_foreign_batch_is_refused():
    batch = DataCollatorForUnpairedPreference()(EXAMPLES)
    main, kl = SequenceLayout(batch), SequenceLayout(batch, "KL_")
    forward = FlatForward(model=None, layouts=[main, kl])
    for layout, prefix in ((main, ""), (kl, "KL_")):
        padded = layout.padded_inputs(prefix)
        ids, mask = padded[f"{prefix}input_ids"], padded[f"{prefix}attention_mask"]
        labels = ids.masked_fill(padded[f"{prefix}completion_mask"] == 0, -100)
        assert forward.layout_of(ids, mask, labels) is layout
    with pytest.raises(ValueError, match=r"none of the flattened rows' padded layouts"):
        forward.layout_of(torch.tensor([[1, 2, 3], [6, 4, 9]]))
    with pytest.raises(ValueError, match=r"none of the flattened rows' padded layouts"):  # same ids, other labels
        forward.layout_of(main.padded_inputs()["input_ids"], labels=torch.full((2, 3), -100))
