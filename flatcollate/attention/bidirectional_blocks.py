"""Attention that is bidirectional inside marked blocks of a sequence (an image's tokens) and causal elsewhere.

Gemma 3 lets the tokens of one image attend to each other in both directions (`token_type_ids == 1`); PaliGemma does
the same over its prefix (image and prompt, `token_type_ids == 0`). transformers draws both as an overlay on the
causal mask over the whole row. In a flattened row two sequences can end and start with an image, so the overlay's
runs must also break at every sequence start; `block_ids` numbers the blocks that way, and `block_kernel` applies
them inside each sequence only. Two sequences, the first with a 3-token image, the second starting with a 2-token
image (`x` attends, `.` does not)::

    tokens     t  i  i  i  t | i  i  t
    block_ids -1  0  0  0 -1 | 1  1 -1

               t i i i t   i i t
            t  x . . . .   . . .
            i  x x x x .   . . .
            i  x x x x .   . . .
            i  x x x x .   . . .
            t  x x x x x   . . .
            i  . . . . .   x x .
            i  . . . . .   x x .
            t  . . . . .   x x x
"""

import itertools

import torch
import torch.nn.functional as F

from ..boundaries import Boundaries

BLOCKS_KEY = "bidirectional_blocks"
"""Forward argument the guard adds for those families; the packed backend reads it."""


def block_ids(token_type_ids: torch.Tensor, sequence_starts: torch.Tensor, block_type: int) -> torch.Tensor:
    """Number each run of `block_type` tokens, breaking runs at sequence starts; -1 elsewhere.

    Args:
        token_type_ids (`torch.Tensor` of shape `(B, T)`, integer).
        sequence_starts (`torch.Tensor` of shape `(B * T,)`, bool): True where a sequence starts.
        block_type (`int`): the token type whose runs are blocks.

    Returns:
        `torch.Tensor` of shape `(B * T,)`, int64.

    >>> types = torch.tensor([[0, 1, 1, 1, 0, 1, 1, 0]])
    >>> starts = torch.tensor([True, False, False, False, False, True, False, False])
    >>> block_ids(types, starts, 1).tolist()
    [-1, 0, 0, 0, -1, 1, 1, -1]
    >>> block_ids(torch.tensor([[1, 1, 1]]), torch.tensor([True, False, True]), 1).tolist()  # image | image
    [0, 0, 1]
    """
    inside = token_type_ids.reshape(-1) == block_type
    before = F.pad(inside, (1, 0))[:-1]
    new_block = inside & (~before | sequence_starts.to(inside.device))
    return torch.where(inside, torch.cumsum(new_block, 0) - 1, -1)


def _allowed(blocks: torch.Tensor, window: int | None) -> torch.Tensor:
    """`(L, L)` bool for one sequence: causal keys (the last `window` of them) or keys of the query's own block."""
    length = blocks.shape[0]
    rows = torch.arange(length, device=blocks.device)
    distance = rows[:, None] - rows[None, :]
    causal = distance >= 0
    if window is not None:
        causal &= distance < window
    same = (blocks[:, None] == blocks[None, :]) & (blocks[:, None] >= 0)
    return causal | same


def block_kernel(query, key, value, boundaries: Boundaries, blocks: torch.Tensor, *, scale, window, softcap, dropout):
    """SDPA once per sequence with its own `(L, L)` mask (`_allowed`); masks never span two sequences.

    Args:
        query (`torch.Tensor` of shape `(T, Hq, D)`); key, value (`(T, Hkv, D)`).
        boundaries (`Boundaries`): the row's sequences.
        blocks (`torch.Tensor` of shape `(T,)`, int64): `block_ids` of the row.
        scale, window, softcap, dropout: as the other packed kernels take them.

    Returns:
        `torch.Tensor` of shape `(T, Hq, D)`.
    """
    bounds = boundaries.host
    groups = query.shape[1] // key.shape[1]
    outputs = []
    for start, end in itertools.pairwise(bounds):  # one masked call per sequence
        q, k, v = (t[start:end].transpose(0, 1)[None] for t in (query, key, value))
        allowed = _allowed(blocks[start:end], window)
        if softcap is None:
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=allowed, dropout_p=dropout, scale=scale, enable_gqa=groups > 1
            )
        else:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
            scores = softcap * torch.tanh((q @ k.transpose(-1, -2)) * scale / softcap)
            probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1, dtype=torch.float32)
            out = F.dropout(probs.to(q.dtype), p=dropout, training=dropout > 0) @ v
        outputs.append(out[0].transpose(0, 1))
    return torch.cat(outputs)
