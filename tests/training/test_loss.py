"""Loss normalization against per-sequence references, and the gradient of a simulated 2-rank accumulated step."""

import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from flatcollate import DataCollatorWithFlattening
from flatcollate.testing import tiny_causal_lm
from flatcollate.training import count_items, normalized_loss
from flatcollate.training.loss import sequence_loss_terms, token_loss_terms

COLLATE = DataCollatorWithFlattening()


def random_sequences(lengths, *, seed, vocab=256, masked=0.3):
    rng = np.random.default_rng(seed)
    out = []
    for n in lengths:
        ids = rng.integers(0, vocab, size=n)
        labels = np.where(rng.random(n) < masked, -100, ids)
        out.append({"input_ids": ids.tolist(), "labels": labels.tolist()})
    return out


def reference_terms(logits_per_seq, labels_per_seq):
    """Per-sequence loop: (token loss sum, token count, sum of sequence means, sequences with a label)."""
    token_sum, tokens, seq_sum, seqs = 0.0, 0, 0.0, 0
    for logits, labels in zip(logits_per_seq, labels_per_seq, strict=True):
        targets = labels[1:]
        keep = targets != -100
        if keep.any():
            losses = F.cross_entropy(logits[:-1][keep], targets[keep], reduction="none")
            token_sum, tokens = token_sum + losses.sum(), tokens + int(keep.sum())
            seq_sum, seqs = seq_sum + losses.mean(), seqs + 1
    return token_sum, tokens, seq_sum, seqs


CASES = {
    "random_mix": [7, 1, 30, 12, 2, 19],
    "one_sequence": [16],
    "many_tiny": [1, 2, 1, 3] * 6,
    "length_one_only": [1, 1, 1],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_terms_match_per_sequence_reference(case):
    features = random_sequences(CASES[case], seed=len(case))
    batch = COLLATE(features)
    torch.manual_seed(0)
    logits = torch.randn(1, batch["input_ids"].shape[1], 11)
    labels = torch.where(batch["labels"] == -100, -100, batch["labels"] % 11)  # targets within the 11 classes
    cu = batch["cu_seq_lens_q"].tolist()
    per_logits = [logits[0, s:e] for s, e in itertools.pairwise(cu)]
    per_labels = [labels[0, s:e] for s, e in itertools.pairwise(cu)]
    token_sum, tokens, seq_sum, seqs = reference_terms(per_logits, per_labels)
    got_sum, got_tokens = token_loss_terms(logits, labels)
    torch.testing.assert_close(got_sum, torch.as_tensor(token_sum, dtype=torch.float32), atol=1e-5, rtol=1e-6)
    assert int(got_tokens) == tokens == int(count_items(labels))
    got_seq_sum, got_seqs = sequence_loss_terms(logits, labels, batch["seq_idx"])
    torch.testing.assert_close(got_seq_sum, torch.as_tensor(seq_sum, dtype=torch.float32), atol=1e-5, rtol=1e-6)
    assert int(got_seqs) == seqs == int(count_items(labels, normalization="sequence", seq_idx=batch["seq_idx"]))


def test_sequence_terms_with_padded_rows():
    labels = torch.tensor([[-100, 1, 2, -100], [-100, 3, -100, -100]])
    seq_idx = torch.zeros_like(labels)
    logits = torch.randn(2, 4, 5)
    got, count = sequence_loss_terms(logits, labels, seq_idx)
    expected = F.cross_entropy(logits[0, :2], labels[0, 1:3]) + F.cross_entropy(logits[1, :1], labels[1, 1:2])
    torch.testing.assert_close(got, expected)
    assert int(count) == 2


def test_bad_arguments_raise():
    labels = torch.tensor([[-100, 1]])
    with pytest.raises(ValueError, match="needs `seq_idx`"):
        normalized_loss(torch.randn(1, 2, 3), labels, num_items_in_batch=1, normalization="sequence")
    with pytest.raises(ValueError, match="must be 'token' or 'sequence'"):
        count_items(labels, normalization="mean", seq_idx=torch.zeros_like(labels))
    with pytest.raises(ValueError, match="`num_items_in_batch` is 0"):
        normalized_loss(torch.randn(1, 2, 3), labels, num_items_in_batch=0)


@pytest.mark.parametrize("normalization", ["token", "sequence"])
def test_two_ranks_with_accumulation_match_one_global_step(normalization):
    """2 ranks x 2 micro-batches, each packed differently, average to the per-sequence gradient of the global batch."""
    model = tiny_causal_lm("llama", use_cache=False)
    sequences = random_sequences([9, 3, 17, 1, 6, 11, 4, 8, 14, 2], seed=7)
    micro_batches = {0: [sequences[0:3], sequences[3:5]], 1: [sequences[5:6], sequences[6:10]]}
    batches = {rank: [COLLATE(mb) for mb in mbs] for rank, mbs in micro_batches.items()}
    mode = {"normalization": normalization}
    total = sum(int(count_items(b["labels"], **mode, seq_idx=b["seq_idx"])) for bs in batches.values() for b in bs)

    def rank_gradient(rank):
        model.zero_grad()
        for batch in batches[rank]:
            logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits
            loss = normalized_loss(
                logits, batch["labels"], num_items_in_batch=total, seq_idx=batch["seq_idx"], world_size=2, **mode
            )
            loss.backward()
        return [p.grad.clone() for p in model.parameters()]

    averaged = [(a + b) / 2 for a, b in zip(rank_gradient(0), rank_gradient(1), strict=True)]

    model.zero_grad()
    logits = [model(input_ids=torch.tensor([s["input_ids"]])).logits[0] for s in sequences]
    labels = [torch.tensor(s["labels"]) for s in sequences]
    token_sum, tokens, seq_sum, seqs = reference_terms(logits, labels)
    reference_loss = token_sum / tokens if normalization == "token" else seq_sum / seqs
    reference_loss.backward()
    assert total == (tokens if normalization == "token" else seqs)
    for got, (name, param) in zip(averaged, model.named_parameters(), strict=True):
        torch.testing.assert_close(got, param.grad, atol=1e-5, rtol=0, msg=name)
