"""Padded batch vs the same examples flattened, on prepared models: transformers' padding-free modeling comparison.

Upstream: transformers v5.23.0, `tests/test_modeling_common.py`,
`ModelTesterMixin.attention_mask_padding_matches_padding_free_with_position_ids` (run per backend as
`test_{eager,sdpa,flash_attention_2}_padding_matches_padding_free_with_position_ids`, with and without the flash
kwargs). There, one model takes a left-padded batch with an `attention_mask`, then the same tokens with the padding
removed as one row with restarting `position_ids` (optionally `cu_seq_lens`), and the logits of the real tokens must
agree.

Here both sides run on the PREPARED model (the padded side goes through its padding-aware path, the flattened side
through the packed backend), and the padded side must also equal the unprepared model: fp32, 1e-5.
"""

import copy

import pytest
import torch

from flatcollate import DataCollatorWithFlattening, prepare_model_for_flattening
from flatcollate.testing import tiny_causal_lm

pytestmark = pytest.mark.slow

FAMILIES = {
    "llama": {},
    "mistral": {"sliding_window": 4},
    "qwen2": {},
    "qwen3": {},
    "gemma": {},
    "gemma2": {"sliding_window": 4},  # soft-capping, alternating sliding layers
    "gemma3_text": {"sliding_window": 4},
    "phi3": {},
    "mixtral": {},
    "starcoder2": {},
    "olmo2": {},
    "granite": {},
    "gpt2": {},  # learned absolute positions
    "opt": {},  # its mask builder drops position_ids
    "falcon": {},  # keeps its own backend, patched mask builders
}
LENGTHS = [9, 3, 6, 1]


def padded_batch(left: bool, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    longest = max(LENGTHS)
    ids = torch.zeros(len(LENGTHS), longest, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(LENGTHS):  # a loop over rows builds the padding the reference way
        span = slice(longest - n, longest) if left else slice(0, n)
        ids[row, span] = torch.randint(1, 256, (n,), generator=generator)
        mask[row, span] = 1
    return ids, mask


@pytest.mark.parametrize("flash_kwargs", [True, False], ids=["cu_seq_lens", "position_ids_only"])
@pytest.mark.parametrize("left", [True, False], ids=["left-padded", "right-padded"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_padded_matches_padding_free(family, left, flash_kwargs):
    plain = tiny_causal_lm(family, seed=11, **FAMILIES[family]).eval()
    if family == "gemma2":
        plain.set_attn_implementation("eager")  # transformers' SDPA refuses soft-capping
    prepared = prepare_model_for_flattening(copy.deepcopy(plain)).eval()
    ids, mask = padded_batch(left)
    real = mask.bool()

    # Positions count real tokens, as `generate()` numbers a left-padded row (learned positions such as GPT-2's
    # would otherwise start past the padding); a restart between real tokens would make it a flattened row.
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        reference = plain(input_ids=ids, attention_mask=mask, position_ids=positions).logits[real]
        padded = prepared(input_ids=ids, attention_mask=mask, position_ids=positions).logits[real]
        features = [{"input_ids": row[keep].tolist()} for row, keep in zip(ids, real, strict=True)]
        batch = DataCollatorWithFlattening(return_flash_attn_kwargs=flash_kwargs, return_seq_idx=False)(features)
        batch.pop("labels")
        flattened = prepared(**batch).logits[0]

    torch.testing.assert_close(padded, reference, atol=1e-5, rtol=0, msg="prepared padded vs unprepared")
    torch.testing.assert_close(flattened, padded, atol=1e-5, rtol=0, msg="padding-free vs padded")
