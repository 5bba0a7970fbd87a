"""A batch with an attention mask (2-D, 4-D, a dict of masks) or a cache and no boundaries is an ordinary batch: a
prepared model runs it as the unprepared model does, whatever its positions say. Static-cache `generate()` numbers a
left-padded row `[0 0 0 1 2 ...]` and passes a 4-D mask (a dict of masks for families with several mask types); a
user builds 4-D masks of their own. Checked for every family of docs/compatibility.md that is exact when flattened
and that transformers' static cache generates with."""

import copy
from pathlib import Path

import pytest
import torch
from transformers import DynamicCache

from flatcollate import prepare_model_for_flattening
from flatcollate.modeling.guard import is_flattened
from flatcollate.testing import tiny_causal_lm

TOL = 1e-5
COMPATIBILITY = Path(__file__).resolve().parents[2] / "docs" / "compatibility.md"

NO_STATIC_CACHE = {
    **dict.fromkeys(
        (
            "bailing_hybrid",
            "bamba",
            "granitemoehybrid",
            "jamba",
            "kimi_linear",
            "lfm3",
            "olmo_hybrid",
            "qwen3_5_moe_text",
            "qwen3_5_text",
            "qwen3_next",
            "qwen4_exp_text",
            "zamba",
            "zamba2",
        ),
        "its static cache has no attention layer to count the prompt from (`get_seq_length` raises)",
    ),
    "hrm_text": "its static cache is built for fewer layers than it runs (IndexError)",
}
"""Families exact when flattened that transformers 5.23 cannot generate with `cache_implementation="static"`, even
unprepared (measured on the tiny models)."""


def exact_families() -> list[str]:
    """`model_type`s whose flatcollate column of the text table in docs/compatibility.md reads `exact`."""
    text = COMPATIBILITY.read_text().split("## Image-text-to-text architectures")[0]
    lines = text[text.index("| model_type | lengths |") :].splitlines()[2:]
    end = next(i for i, line in enumerate(lines) if not line.startswith("|"))
    rows = [line.strip("|").split("|") for line in lines[:end]]
    return [cells[0].strip() for cells in rows if cells[4].strip().startswith("exact")]


STATIC_CACHE_FAMILIES = [family for family in exact_families() if family not in NO_STATIC_CACHE]

NO_4D_MASK = {
    "bloom": "it builds its ALiBi bias from a 2-D mask",
    "falcon_mamba": "it has no attention and multiplies its hidden states by a 2-D mask",
    "mamba": "it has no attention and multiplies its hidden states by a 2-D mask",
}
"""Families whose forward takes no 4-D mask, even unprepared."""


def pair(family: str):
    """The unprepared model and a prepared copy with the same weights."""
    plain = tiny_causal_lm(family, seed=0)
    return plain, prepare_model_for_flattening(copy.deepcopy(plain))


def left_padded(model, lengths=(4, 7), *, seed=0):
    """Rows of `lengths` real tokens, left-padded with token 0: `(input_ids, attention_mask)`, both `(B, T)` int64."""
    vocab = model.config.get_text_config().vocab_size
    generator = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.randint(3, min(vocab, 200), (len(lengths), width), generator=generator)
    mask = (torch.arange(width)[None] >= width - torch.tensor(lengths)[:, None]).long()
    return ids.masked_fill(mask == 0, 0), mask


def static_generate(model, ids, mask):
    options = {"max_new_tokens": 3, "do_sample": False, "pad_token_id": 0, "cache_implementation": "static"}
    with torch.no_grad():
        return model.generate(
            input_ids=ids, attention_mask=mask, return_dict_in_generate=True, output_logits=True, **options
        )


@pytest.mark.parametrize("family", STATIC_CACHE_FAMILIES)
def test_static_cache_generate_equals_the_unprepared_model(family):
    plain, prepared = pair(family)
    ids, mask = left_padded(plain)
    expected, got = static_generate(plain, ids, mask), static_generate(prepared, ids, mask)
    torch.testing.assert_close(got.sequences, expected.sequences, rtol=0, atol=0)
    torch.testing.assert_close(torch.stack(got.logits), torch.stack(expected.logits), rtol=0, atol=TOL)


def padding_mask_4d(mask: torch.Tensor, dtype=torch.float32, *, hide_padding: bool = True) -> torch.Tensor:
    """A user-built additive 4-D mask `(B, 1, T, T)`: causal, and (with `hide_padding`) no query sees a pad key."""
    width = mask.shape[1]
    allowed = torch.ones(width, width, dtype=torch.bool).tril()[None, None]
    if hide_padding:
        allowed = allowed & mask.bool()[:, None, None, :]
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)


def positions_from_first_real(mask: torch.Tensor) -> torch.Tensor:
    """`(B, T)` int64 positions counted from each row's first real token, 0 on padding (`[0 0 0 1 2 ...]`)."""
    return (mask.cumsum(-1) - 1).clamp(min=0)


@pytest.mark.parametrize("family", [family for family in STATIC_CACHE_FAMILIES if family not in NO_4D_MASK])
def test_a_forward_with_a_4d_mask_equals_the_unprepared_model(family):
    plain, prepared = pair(family)
    ids, mask = left_padded(plain)
    inputs = {
        "input_ids": ids,
        "attention_mask": padding_mask_4d(mask),
        "position_ids": positions_from_first_real(mask),
    }
    with torch.no_grad():
        expected, got = plain(**inputs, use_cache=False).logits, prepared(**inputs, use_cache=False).logits
    real = mask.bool()
    torch.testing.assert_close(got[real], expected[real], rtol=0, atol=TOL)


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma3_text", "gpt2"])
def test_the_comparisons_catch_a_run_that_lets_tokens_see_padding(family):
    """Negative controls: generating without the padding mask, or a 4-D mask that shows the pads, moves the logits of
    the left-padded row far beyond the tolerance the comparisons above use."""
    plain, prepared = pair(family)
    ids, mask = left_padded(plain)
    expected = static_generate(plain, ids, mask)
    seeing_pads = static_generate(prepared, ids, torch.ones_like(mask))
    assert (torch.stack(seeing_pads.logits) - torch.stack(expected.logits)).abs().max() > 1e-3
    positions = positions_from_first_real(mask)
    with torch.no_grad():
        hidden = plain(input_ids=ids, attention_mask=padding_mask_4d(mask), position_ids=positions).logits
        shown = prepared(
            input_ids=ids, attention_mask=padding_mask_4d(mask, hide_padding=False), position_ids=positions
        )
    real = mask.bool()
    assert (shown.logits[real] - hidden[real]).abs().max() > 1e-3


RESTARTING = torch.tensor([[0, 1, 2, 0, 1, 0]])


@pytest.mark.parametrize(
    ("extra", "flattened"),
    [
        ({}, True),
        ({"attention_mask": torch.ones(1, 6, dtype=torch.long)}, True),  # restarts between attended tokens: packed
        ({"attention_mask": torch.ones(1, 1, 6, 6, dtype=torch.bool)}, False),
        ({"attention_mask": {"full_attention": None, "sliding_attention": None}}, False),
        ({"past_key_values": DynamicCache()}, False),
        ({"cache_position": torch.arange(6)}, False),
        ({"use_cache": True}, True),  # no cache yet: the guard refuses it as a flattened batch with `use_cache`
        ({"cu_seq_lens_q": torch.tensor([0, 3, 5, 6], dtype=torch.int32)}, True),
        ({"seq_idx": torch.tensor([[0, 0, 0, 1, 1, 2]]), "attention_mask": torch.ones(1, 6)}, True),
    ],
    ids=["positions", "2d_mask", "4d_mask", "dict_of_masks", "cache", "cache_position", "use_cache", "cu", "seq_idx"],
)
def test_the_batch_keys_decide(extra, flattened):
    assert is_flattened({"input_ids": torch.zeros(1, 6, dtype=torch.long), "position_ids": RESTARTING, **extra}) is (
        flattened
    )
