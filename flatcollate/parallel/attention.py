"""The `flatcollate_sp` attention backend: packed attention over a row split across a sequence-parallel group.

Every layer outside attention (embeddings, norms, MLPs, the LM head) works token by token, so each rank runs it on its
own slice of the row. Attention needs the whole row: inside each attention layer the query, key and value of the
local slice switch to head sharding, the `flatcollate` packed kernel runs on the whole row's `cu_seq_lens`, and the
output switches back::

    rank r:  q, k, v (1, H, T/P, D) --all-to-all--> (1, H/P, T, D) --packed kernel, whole-row cu_seq_lens-->
             out (1, T, H/P, D) --all-to-all--> (1, T/P, H, D)

Query heads and key/value heads are both split over the group, so each rank keeps whole GQA groups: query head
`r * Hq/P + i` reads key/value head `r * Hkv/P + i // (Hq/Hkv)`, which is on the same rank.
"""

from dataclasses import dataclass

import torch
import torch.distributed as dist
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from .._conventions import SP_CONTEXT_KEY
from ..attention.dispatch import packed_attention_forward, packed_or_padded_mask
from .all_to_all import heads_to_sequence, sequence_to_heads

SP_ATTN_IMPLEMENTATION = "flatcollate_sp"
"""Backend name `prepare_model_for_sequence_parallel` selects."""



@dataclass(frozen=True)
class SequenceParallelContext:
    """The sequence-parallel group an attention layer exchanges heads with.

    Args:
        group (`ProcessGroup`): the group; rank `r` of it holds slice `r` of every row.
        rank (`int`): this process's rank in `group`.
        size (`int`): the group's size.
    """

    group: dist.ProcessGroup | None
    rank: int
    size: int

    def __deepcopy__(self, memo) -> "SequenceParallelContext":
        return self  # a process group is a handle to shared communicators: a copied model uses the same one


def check_head_counts(query_heads: int, kv_heads: int, size: int, *, where: str) -> None:
    """Raise unless both head counts split evenly over `size` ranks.

    >>> check_head_counts(4, 2, 2, where="llama")
    >>> check_head_counts(4, 2, 4, where="llama")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: llama has 4 query heads and 2 key/value heads, which do not split over a sequence-parallel group of 4...
    """
    if query_heads % size == 0 and kv_heads % size == 0:
        return
    fits = max(d for d in range(1, size + 1) if query_heads % d == 0 and kv_heads % d == 0)
    raise ValueError(
        f"{where} has {query_heads} query heads and {kv_heads} key/value heads, which do not split over a "
        f"sequence-parallel group of {size} ranks: both must be multiples of the group size. Use a group size that "
        f"divides both (at most {fits} here), and data parallelism over the remaining ranks."
    )


def sequence_parallel_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Causal attention inside each sequence of a row whose tokens are split over a sequence-parallel group.

    Args:
        module (`torch.nn.Module`): the attention layer; carries a `SequenceParallelContext`
            (`prepare_model_for_sequence_parallel` sets it).
        query (`torch.Tensor` of shape `(1, Hq, T / P, D)`): this rank's slice of the row.
        key, value (`torch.Tensor` of shape `(1, Hkv, T / P, D)`).
        attention_mask: must be `None`: the backend trains flattened rows only (no padding, no cache).
        scaling (`float`, *optional*), dropout (`float`): as for `packed_attention_forward`.
        kwargs: `cu_seq_lens_q/k` (`(N + 1,)` int32) and `max_length_q/k` (`int`) of the WHOLE row (required),
            `sliding_window`, `softcap`, `s_aux` (`(Hq,)`, split by head here).

    Returns:
        `(torch.Tensor of shape (1, T / P, Hq, D), None)`.
    """
    context = kwargs.get(SP_CONTEXT_KEY)
    if not isinstance(context, SequenceParallelContext):
        raise ValueError(
            f"{type(module).__name__} runs the {SP_ATTN_IMPLEMENTATION!r} backend without a sequence-parallel group; "
            "select it with `flatcollate.parallel.prepare_model_for_sequence_parallel(model, group)`."
        )
    batch, query_heads, length, _ = query.shape
    if attention_mask is not None or key.shape[2] != length or batch != 1:
        raise ValueError(
            f"The {SP_ATTN_IMPLEMENTATION!r} backend trains one flattened row per rank, without attention mask or "
            f"cache; got {batch} rows of {length} queries over {key.shape[2]} keys (mask given: "
            f"{attention_mask is not None}). Call the model with `use_cache=False` on "
            "`split_for_sequence_parallel` batches; generate with the unprepared model."
        )
    check_head_counts(query_heads, key.shape[1], context.size, where=type(module).__name__)
    if kwargs.get("cu_seq_lens_q") is None:
        raise ValueError(
            "Sequence-parallel attention needs the whole row's `cu_seq_lens_q/k` and `max_length_q/k` (the local "
            "slice's positions cannot tell where sequences of other ranks start); pass the batch from "
            "`split_for_sequence_parallel` to the model unchanged."
        )
    size, group = context.size, context.group
    q, k, v = (sequence_to_heads(t[0].transpose(0, 1), group, size).transpose(0, 1)[None] for t in (query, key, value))
    inner = {name: item for name, item in kwargs.items() if name not in ("position_ids", SP_CONTEXT_KEY)}  # local
    sinks = kwargs.get("s_aux")
    if sinks is not None:  # one learned logit per query head: keep this rank's heads
        inner["s_aux"] = sinks.reshape(size, -1)[context.rank]
    out, _ = packed_attention_forward(module, q, k, v, None, scaling, dropout, **inner)  # (1, T, Hq/P, D)
    return heads_to_sequence(out[0], group, size)[None], None


def register_sequence_parallel_attention() -> str:
    """Register the `flatcollate_sp` attention and mask functions with transformers (idempotent); returns the name.

    The mask function is the packed backend's: no mask for a flattened slice (`q_length == kv_length`).
    """
    AttentionInterface.register(SP_ATTN_IMPLEMENTATION, sequence_parallel_attention_forward)
    AttentionMaskInterface.register(SP_ATTN_IMPLEMENTATION, packed_or_padded_mask)
    return SP_ATTN_IMPLEMENTATION
