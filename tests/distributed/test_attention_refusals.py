"""The sequence-parallel attention refuses what it cannot compute, before any communication (no processes)."""

import pytest
import torch

from flatcollate.parallel.attention import (
    SP_CONTEXT_KEY,
    SequenceParallelContext,
    sequence_parallel_attention_forward,
)


def layer() -> torch.nn.Module:
    module = torch.nn.Module()
    module.is_causal = True
    return module


def group(size: int) -> dict:
    """The keyword argument a prepared model's forward hands every attention layer."""
    return {SP_CONTEXT_KEY: SequenceParallelContext(group=None, rank=0, size=size)}


def qkv(query_heads: int, kv_heads: int, tokens: int = 4):
    return (torch.randn(1, h, tokens, 8) for h in (query_heads, kv_heads, kv_heads))


def row_kwargs(total: int) -> dict:
    return {"cu_seq_lens_q": torch.tensor([0, total], dtype=torch.int32), "max_length_q": total}


@pytest.mark.parametrize(("query_heads", "kv_heads"), [(6, 2), (4, 1)], ids=["query-heads", "kv-heads"])
def test_heads_that_do_not_split_are_refused_with_the_counts(query_heads, kv_heads):
    q, k, v = qkv(query_heads, kv_heads)
    message = f"{query_heads} query heads and {kv_heads} key/value heads, which do not split over a .* group of 4"
    with pytest.raises(ValueError, match=message):
        sequence_parallel_attention_forward(layer(), q, k, v, None, **row_kwargs(16), **group(4))


def test_a_layer_without_a_group_is_refused():
    q, k, v = qkv(4, 2)
    with pytest.raises(ValueError, match="prepare_model_for_sequence_parallel"):
        sequence_parallel_attention_forward(torch.nn.Module(), q, k, v, None, **row_kwargs(8))


def test_a_mask_or_a_cache_is_refused():
    q, k, v = qkv(4, 2)
    with pytest.raises(ValueError, match="use_cache=False"):
        sequence_parallel_attention_forward(layer(), q, k, v, torch.ones(1, 1, 4, 4, dtype=torch.bool), **group(2))
    with pytest.raises(ValueError, match="use_cache=False"):
        sequence_parallel_attention_forward(layer(), q, k[:, :, :2], v[:, :, :2], None, **row_kwargs(8), **group(2))


def test_missing_whole_row_boundaries_are_refused():
    q, k, v = qkv(4, 2)
    with pytest.raises(ValueError, match="whole row's `cu_seq_lens_q/k`"):
        sequence_parallel_attention_forward(layer(), q, k, v, None, position_ids=torch.arange(4)[None], **group(2))
