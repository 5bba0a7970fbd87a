"""A flattened forward copies its boundaries to the host at most once, and waits on the device no more than it must."""

import pytest
import torch

from flatcollate import DataCollatorWithFlattening, prepare_model_for_flattening
from flatcollate.testing import tiny_causal_lm

LENGTHS = [5, 1, 9, 3]


def collated(**options):
    generator = torch.Generator().manual_seed(0)
    return DataCollatorWithFlattening(**options)(
        [{"input_ids": torch.randint(0, 256, (n,), generator=generator).tolist()} for n in LENGTHS]
    )


@pytest.mark.parametrize("keys", ["collator", "positions only"])
def test_one_copy_of_the_boundaries_per_flattened_forward(keys, host_syncs):
    model = prepare_model_for_flattening(tiny_causal_lm("llama", num_hidden_layers=3))
    batch = collated(return_flash_attn_kwargs=keys == "collator", return_seq_idx=keys == "collator")
    model(**batch)  # warm-up: nothing lazy counted below
    with torch.no_grad(), host_syncs() as seen:
        model(**batch)
    expected = {"tolist": 1} if keys == "collator" else {"tolist": 1, "nonzero": 1}  # positions need a `nonzero`
    assert dict(seen) == expected
