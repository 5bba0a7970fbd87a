"""The differentiable all-to-all that moves attention inputs between sequence sharding and head sharding.

Each of `P` ranks holds a contiguous slice of the row with every head; attention needs every token of the row, so
each rank trades its slice of the other ranks' heads for their slices of its own heads (DeepSpeed-Ulysses)::

    sequence sharded (T/P, H, D)                 head sharded (T, H/P, D)
    rank 0: tokens 0..T/P    heads 0..H    ->     rank 0: tokens 0..T    heads 0..H/P
    rank 1: tokens T/P..T    heads 0..H    <-     rank 1: tokens 0..T    heads H/P..H

Block `j` of an equal-split `all_to_all_single` goes to rank `j`, and block `i` of the result comes from rank `i`.
That exchange is its own adjoint, so the backward is the same collective on the gradients. It is written here on
`torch.distributed.all_to_all_single` (gloo on CPU, nccl on GPU) because `torch.distributed.nn.functional`'s
differentiable version is deprecated in torch 2.13 and its replacement lives in a private module.
"""

import torch
import torch.distributed as dist


class _AllToAll(torch.autograd.Function):
    """Equal-split all-to-all over dimension 0 of `(P, ...)` blocks; differentiable."""

    @staticmethod
    def forward(ctx, blocks: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        blocks = blocks.contiguous()
        received = torch.empty_like(blocks)
        dist.all_to_all_single(received, blocks, group=group)
        return received

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _AllToAll.apply(grad, ctx.group), None


def all_to_all(blocks: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Send block `j` of `blocks` `(P, ...)` to rank `j`; block `i` of the result is what rank `i` sent here."""
    return _AllToAll.apply(blocks, group)


def sequence_to_heads(local: torch.Tensor, group: dist.ProcessGroup, size: int) -> torch.Tensor:
    """This rank's slice of every head -> every token of this rank's heads.

    Args:
        local (`torch.Tensor` of shape `(T / P, H, D)`): this rank's contiguous slice of tokens, all heads.
        group (`ProcessGroup`): the sequence-parallel group, rank `r` holding slice `r`.
        size (`int`): `P`, the group's size; `H` must be a multiple of it.

    Returns:
        `torch.Tensor` of shape `(T, H / P, D)`: heads `r * H / P` to `(r + 1) * H / P` for the whole row.
    """
    tokens, heads, dim = local.shape
    blocks = local.reshape(tokens, size, heads // size, dim).transpose(0, 1)  # block j: the heads rank j keeps
    return all_to_all(blocks, group).reshape(size * tokens, heads // size, dim)


def heads_to_sequence(whole: torch.Tensor, group: dist.ProcessGroup, size: int) -> torch.Tensor:
    """Every token of this rank's heads -> this rank's slice of every head (the inverse of `sequence_to_heads`).

    Args:
        whole (`torch.Tensor` of shape `(T, H / P, D)`).
        group (`ProcessGroup`): the sequence-parallel group.
        size (`int`): `P`; `T` must be a multiple of it.

    Returns:
        `torch.Tensor` of shape `(T / P, H, D)`.
    """
    tokens, heads, dim = whole.shape
    blocks = whole.reshape(size, tokens // size, heads, dim)  # block j: the tokens rank j holds
    received = all_to_all(blocks, group)  # block i: this rank's tokens, the heads of rank i
    return received.transpose(0, 1).reshape(tokens // size, size * heads, dim)
