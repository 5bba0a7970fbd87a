"""Batching plan of the `sdpa` kernel: the sequences of a row grouped by similar length, each group right-padded.

A row of sequences `a` (4 tokens), `b` (3), `c` (1) becomes two batches in one slot layout::

    tokens  [a a a a | b b b | c]
    slots   [a a a a   b b b .   c]      batch 1: 2 sequences of 4 (`.` repeats b's last token)    batch 2: c

`ToSlots` / `FromSlots` gather tokens into slots and back, with gradients. A row already in batch order (equal
lengths, or groups of equal lengths in decreasing order) has `in_place=True`: its slots are its tokens.
"""

from dataclasses import dataclass

import numpy as np
import torch

from ..boundaries import Boundaries

GROUP_FILL = 0.75
"""Sequences share one batched SDPA call when the shortest is at least this fraction of the group's longest."""

@dataclass(frozen=True)
class Plan:
    """Similar-length sequences batched and right-padded, all batches back to back in one slot layout.

    `slot_token` `(S,)` int64: the token each slot reads (a padding slot repeats its sequence's last token);
    `token_slot` `(T,)` int64: the slot of each token; `real` `(S, 1, 1)` float: 1 for real slots, 0 for padding;
    `batches`: `(first_slot, sequences, padded_length)` per batch; `in_place`: every slot is real and reads its own
    token (`slot_token` is `0..T-1`), so the row can be viewed as the batches without a gather.
    """

    slot_token: torch.Tensor
    token_slot: torch.Tensor
    real: torch.Tensor
    batches: list[tuple[int, int, int]]
    in_place: bool


def group_plan(boundaries: Boundaries) -> Plan:
    """The batching plan of a row, built on the host once per `Boundaries` (the layers of a forward share one)."""
    return boundaries.view("sdpa group plan", _plan)


def _plan(boundaries: Boundaries) -> Plan:
    bounds = np.asarray(boundaries.host, dtype=np.int64)
    starts, lengths = bounds[:-1], np.diff(bounds)
    order = [i for i in np.argsort(-lengths, kind="stable") if lengths[i] > 0]
    slot_token, real, batches, first, used = [], [], [], 0, 0
    # Greedy over sequences sorted by length: a batch closes when the next one would waste too much padding.
    for position in range(1, len(order) + 1):
        if position == len(order) or lengths[order[position]] < GROUP_FILL * lengths[order[first]]:
            members = np.array(order[first:position])
            longest = int(lengths[members[0]])
            offsets = np.arange(longest)[None, :]
            slot_token.append((starts[members][:, None] + np.minimum(offsets, lengths[members][:, None] - 1)).ravel())
            real.append((offsets < lengths[members][:, None]).ravel())
            batches.append((used, len(members), longest))
            used += len(members) * longest
            first = position
    slot_token = np.concatenate(slot_token) if slot_token else np.zeros(0, dtype=np.int64)
    real = np.concatenate(real) if real else np.zeros(0, dtype=bool)
    token_slot = np.empty(int(bounds[-1]), dtype=np.int64)
    token_slot[slot_token[real]] = np.flatnonzero(real)
    device = boundaries.cu_seqlens.device
    plan = Plan(
        slot_token=torch.from_numpy(slot_token).to(device),
        token_slot=torch.from_numpy(token_slot).to(device),
        real=torch.from_numpy(real).to(device, torch.float32)[:, None, None],
        batches=batches,
        in_place=bool(real.all()) and np.array_equal(slot_token, np.arange(slot_token.size)),
    )
    return plan


class ToSlots(torch.autograd.Function):
    """Tokens `(T, H, D)` -> slots `(S, H, D)`. Backward reads each token's own slot: padding slots get no gradient
    (their outputs are dropped and no real query sees them), so no scatter-add is needed."""

    @staticmethod
    def forward(ctx, tokens, plan):
        ctx.plan = plan
        return tokens.index_select(0, plan.slot_token)

    @staticmethod
    def backward(ctx, grad):
        return grad.index_select(0, ctx.plan.token_slot), None


class FromSlots(torch.autograd.Function):
    """Slots `(S, H, D)` -> tokens `(T, H, D)`; backward puts zeros in padding slots (a gather and a product)."""

    @staticmethod
    def forward(ctx, slots, plan):
        ctx.plan = plan
        return slots.index_select(0, plan.token_slot)

    @staticmethod
    def backward(ctx, grad):
        plan = ctx.plan
        return grad.index_select(0, plan.slot_token) * plan.real.to(grad.dtype), None
