"""`chunked_cross_entropy` against the full-logits cross-entropy on awkward sizes: the summed loss and the gradients of
the hidden states, the head's weight and bias within 1e-6 relative (fp32), whatever the chunk; a chunk fed targets one
token off breaks it."""

import pytest
import torch
import torch.nn.functional as F

from flatcollate.modeling.chunked_loss import chunk_tokens, chunked_cross_entropy, next_token_targets, softcapped


def _inputs(rows: int = 97, hidden_size: int = 24, vocab: int = 1025, *, bias: bool = True, seed: int = 0):
    torch.manual_seed(seed)
    head = torch.nn.Linear(hidden_size, vocab, bias=bias)
    hidden = torch.randn(rows, hidden_size, requires_grad=True)
    targets = torch.randint(0, vocab, (rows,))
    targets[torch.rand(rows) < 0.3] = -100  # prompts and sequence starts
    return hidden, head, targets


def _run(loss_of, hidden, head, targets):
    """`(loss, grads)` of one backward through `loss_of(hidden, head, targets)`."""
    hidden.grad = None
    head.zero_grad(set_to_none=True)
    loss = loss_of(hidden, head, targets)
    loss.backward()
    grads = {"hidden": hidden.grad.clone(), **{name: p.grad.clone() for name, p in head.named_parameters()}}
    return loss.detach(), grads


def _full(softcap=None):
    """The reference: the whole `(N, V)` logits at once, as transformers' `ForCausalLMLoss` computes them."""

    def loss_of(hidden, head, targets):
        return F.cross_entropy(softcapped(head(hidden), softcap).float(), targets, reduction="sum")

    return loss_of


def _chunked(chunk_size, softcap=None):
    def loss_of(hidden, head, targets):
        return chunked_cross_entropy(hidden, head, targets, chunk_size=chunk_size, softcap=softcap)

    return loss_of


@pytest.mark.parametrize("chunk_size", [1, 7, 96, 97, 4096])
@pytest.mark.parametrize("softcap", [None, 3.0])
@pytest.mark.parametrize("bias", [True, False])
def test_every_chunking_equals_the_full_loss(chunk_size, softcap, bias, assert_relatively_close):
    hidden, head, targets = _inputs(bias=bias)
    expected = _run(_full(softcap), hidden, head, targets)
    assert_relatively_close(_run(_chunked(chunk_size, softcap), hidden, head, targets), expected)


def test_targets_one_token_off_break_it(assert_relatively_close):
    """Negative control: the same rows scored against the next row's target (labels shifted by one) differ."""
    hidden, head, targets = _inputs()
    expected = _run(_full(), hidden, head, targets)
    off_by_one = torch.cat([targets[1:], targets[:1]])
    with pytest.raises(AssertionError, match="loss"):
        assert_relatively_close(_run(_chunked(7), hidden, head, off_by_one), expected)


def test_a_batch_without_labels_gives_zero_and_backward_runs():
    hidden, head, targets = _inputs(rows=5)
    loss = chunked_cross_entropy(hidden, head, torch.full_like(targets, -100), chunk_size=2)
    loss.backward()
    assert loss.item() == 0.0 and hidden.grad.abs().sum().item() == 0.0


def test_without_gradients_it_runs_no_checkpoint(monkeypatch):
    from flatcollate.modeling import chunked_loss

    hidden, head, targets = _inputs()
    monkeypatch.setattr(chunked_loss, "checkpoint", None)  # called, it would raise
    with torch.no_grad():
        got = chunked_cross_entropy(hidden, head, targets, chunk_size=10)
        torch.testing.assert_close(got, _full()(hidden, head, targets), rtol=1e-6, atol=0)


def test_bad_chunk_size_is_refused():
    hidden, head, targets = _inputs(rows=3)
    with pytest.raises(ValueError, match="chunk_size must be a positive number of rows, got 0"):
        chunked_cross_entropy(hidden, head, targets, chunk_size=0)


def test_next_token_targets_match_transformers_shift():
    from transformers.loss.loss_utils import ForCausalLMLoss

    torch.manual_seed(1)
    logits, labels = torch.randn(2, 9, 11), torch.randint(0, 11, (2, 9))
    labels[0, 3] = -100
    expected = ForCausalLMLoss(logits, labels, vocab_size=11)
    got = F.cross_entropy(logits.reshape(-1, 11), next_token_targets(labels).reshape(-1))
    torch.testing.assert_close(got, expected)
    assert chunk_tokens(1025) == 2**25 // 1025
