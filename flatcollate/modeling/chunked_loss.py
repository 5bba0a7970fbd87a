"""The next-token loss from final hidden states, a chunk of tokens at a time: no `(T, V)` logits are ever held.

A flattened batch is one row of `T` tokens, so its logits are one `(T, V)` tensor: at 8k tokens and a 128k vocabulary
that is 4 GiB in fp32, and as much again for the softmax the loss saves and for the gradient. Here only the labelled
tokens are projected, `chunk` of them at a time, and each chunk's logits are freed once its loss is summed. A plain
`Linear` head takes each chunk's gradients in the forward (`softmax - onehot` times the weight and the rows: three
products with the head, as the full path makes); any other head (LoRA-wrapped) has its chunks recomputed in the
backward (`torch.utils.checkpoint`). Either way the most ever held is a few `(chunk, V)` tensors::

    hidden (T, H) --labelled rows--> (N, H) --+-- rows 0..c     -> head -> soft-cap -> (c, V) -> CE sum --+
                                              +-- rows c..2c    -> head -> soft-cap -> (c, V) -> CE sum --+-> sum (fp32)
                                              +-- ...                                                     |
    backward: each chunk's logits recomputed from its (c, H) rows, its gradient taken, then freed         <-+

Each token's loss is computed as the full path computes it (its own logits, the same soft-cap, `float()` before the
cross-entropy, as transformers' `ForCausalLMLoss`), so the sum differs from the full one only by summation order.
"""

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from .._conventions import IGNORE_INDEX

CHUNK_ELEMENTS = 2**25
"""Logit elements of one chunk (128 MiB in fp32): `chunk_tokens(V)` rows of a `V`-wide head."""


def chunk_tokens(vocab_size: int, *, elements: int = CHUNK_ELEMENTS) -> int:
    """Tokens per chunk for a head of `vocab_size` outputs, so that one chunk's logits hold `elements` values.

    >>> chunk_tokens(131072), chunk_tokens(2**26)
    (256, 1)
    """
    return max(1, elements // vocab_size)


def next_token_targets(labels: torch.Tensor) -> torch.Tensor:
    """What each position predicts, as transformers' `ForCausalLMLoss` shifts labels: position `t` predicts
    `labels[t + 1]`, the last position nothing.

    Args:
        labels (`torch.Tensor` of shape `(B, T)`, int64): labels in place, -100 where nothing is learnt.

    Returns:
        `torch.Tensor` of shape `(B, T)`, int64.

    >>> next_token_targets(torch.tensor([[5, 6, -100, 7]])).tolist()
    [[6, -100, 7, -100]]
    """
    return F.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:]


def softcapped(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    """`cap * tanh(logits / cap)`, in the order Gemma 2's forward applies its `final_logit_softcapping`; `logits`
    unchanged when `cap` is None."""
    if cap is None:
        return logits
    return torch.tanh(logits / cap) * cap


def _chunk_loss(hidden: torch.Tensor, targets: torch.Tensor, head: torch.nn.Module, cap: float | None) -> torch.Tensor:
    logits = softcapped(head(hidden), cap)
    return F.cross_entropy(logits.float(), targets, reduction="sum")


class _LinearCrossEntropy(torch.autograd.Function):
    """The summed cross-entropy of a plain `Linear` head, chunk by chunk, with every gradient taken in the forward.

    Each chunk's logits are used once: the loss, then `softmax - onehot` (through the soft-cap's derivative) times the
    weight for the rows' gradient and times the rows for the weight's. Three products with the head, as the full path
    makes, and no recompute; the backward only scales what the forward kept by the loss's gradient.
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, chunk_size, cap):
        wants_hidden, wants_weight, wants_bias = ctx.needs_input_grad[:3]
        grad_hidden = torch.zeros_like(hidden) if wants_hidden else None
        grad_weight = torch.zeros_like(weight) if wants_weight else None
        grad_bias = torch.zeros_like(bias) if wants_bias else None
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        for start in range(0, hidden.shape[0], chunk_size):  # over chunks, never tokens
            rows, wanted = hidden[start : start + chunk_size], targets[start : start + chunk_size]
            raw = F.linear(rows, weight, bias)
            logits = softcapped(raw, cap).float()
            log_probs = torch.log_softmax(logits, dim=-1)
            picked = log_probs.gather(1, wanted[:, None])
            total = total - picked.sum()
            if grad_hidden is None and grad_weight is None and grad_bias is None:
                continue
            grad = log_probs.exp_()
            grad.scatter_add_(1, wanted[:, None], torch.full_like(picked, -1.0))  # softmax - onehot
            if cap is not None:
                grad = grad * (1 - (raw.float() / cap).tanh().square())  # d/dz cap * tanh(z / cap)
            grad = grad.to(raw.dtype)
            if grad_hidden is not None:
                grad_hidden[start : start + chunk_size] = grad @ weight
            if grad_weight is not None:
                grad_weight.addmm_(grad.T, rows)
            if grad_bias is not None:
                grad_bias += grad.sum(0)
        ctx.save_for_backward(*(g for g in (grad_hidden, grad_weight, grad_bias) if g is not None))
        ctx.wants = (wants_hidden, wants_weight, wants_bias)
        return total

    @staticmethod
    def backward(ctx, grad_total):
        saved = iter(ctx.saved_tensors)
        grads = [next(saved) * grad_total if wanted else None for wanted in ctx.wants]
        return (*grads, None, None, None)


def chunked_cross_entropy(
    hidden: torch.Tensor,
    head: torch.nn.Module,
    targets: torch.Tensor,
    *,
    chunk_size: int,
    softcap: float | None = None,
) -> torch.Tensor:
    """The summed cross-entropy of `head(hidden)` against `targets`, one chunk of labelled rows at a time.

    Args:
        hidden (`torch.Tensor` of shape `(N, H)`): final hidden states, one row per position.
        head (`torch.nn.Module`): the output projection `(.., H) -> (.., V)` (`model.get_output_embeddings()`): a
            plain `Linear`, a tied embedding's `Linear`, or a LoRA-wrapped one; it is called, never unpacked.
        targets (`torch.Tensor` of shape `(N,)`, int64): what each row predicts, -100 where nothing is learnt
            (`next_token_targets`).
        chunk_size (`int`): rows per chunk (`chunk_tokens(V)`).
        softcap (`float`, *optional*): the config's `final_logit_softcapping`.

    Returns:
        `torch.Tensor` of shape `()`, fp32: the sum over labelled rows of `-log softmax(logits)[target]` (0, still
        attached to `hidden`, when no row is labelled).

    >>> head = torch.nn.Linear(4, 10)
    >>> hidden, targets = torch.randn(7, 4), torch.tensor([1, -100, 3, 3, 9, 0, 2])
    >>> full = F.cross_entropy(head(hidden), targets, reduction="sum")
    >>> bool(torch.allclose(chunked_cross_entropy(hidden, head, targets, chunk_size=2), full))
    True
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive number of rows, got {chunk_size}.")
    labelled = targets != IGNORE_INDEX
    # Only labelled rows are projected (prompts and each sequence's last token never are): one host copy, the count.
    hidden, targets = hidden[labelled], targets[labelled]
    if type(head) is torch.nn.Linear:  # a plain head: every gradient taken in the forward, nothing recomputed
        return _LinearCrossEntropy.apply(hidden, head.weight, head.bias, targets, chunk_size, softcap)
    recompute = torch.is_grad_enabled()
    total = hidden.sum(dtype=torch.float32) * 0  # 0 attached to `hidden`: an unlabelled batch still runs backward
    for start in range(0, hidden.shape[0], chunk_size):  # over chunks (N / chunk_size of them), never tokens
        rows, wanted = hidden[start : start + chunk_size], targets[start : start + chunk_size]
        if recompute:
            total = total + checkpoint(_chunk_loss, rows, wanted, head, softcap, use_reentrant=False)
        else:
            total = total + _chunk_loss(rows, wanted, head, softcap)
    return total
