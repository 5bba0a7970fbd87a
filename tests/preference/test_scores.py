"""Reward models on flattened rows: one score per sequence, equal to each sequence run alone.

The proof compares `sequence_scores` on a flattened batch with the unprepared model's own forward on each sequence
(`model(input_ids=seq).logits`), outputs and gradients, fp32 on CPU, for several decoder families. Negative controls
show that the comparison would catch a boundary off by one token, and that the model's own forward on a flattened row
gives one score for the whole row (which is why it stays refused).
"""

import copy

import pytest
import torch
from transformers import AutoModelForSequenceClassification

from flatcollate import DataCollatorWithFlattening, prepare_model_for_flattening
from flatcollate.preference import sequence_scores
from flatcollate.preference.scores import pooled_indices, prepare_reward_model
from flatcollate.testing import tiny_causal_lm, tiny_config

FAMILIES = ["llama", "qwen2", "mistral", "gemma"]
LENGTHS = [5, 1, 8, 3, 12, 2]  # a length-1 sequence and uneven neighbours
PAD = 0
TOLERANCE = 1e-5


def classifier(family: str, num_labels: int = 1, pad_token_id: int | None = PAD):
    torch.manual_seed(0)
    config = tiny_config(family, num_labels=num_labels, pad_token_id=pad_token_id)
    return AutoModelForSequenceClassification.from_config(config).eval()


def sequences(lengths=LENGTHS, seed: int = 0) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(PAD + 1, 256, (n,), generator=generator).tolist() for n in lengths]


def flattened(seqs: list[list[int]]) -> dict:
    batch = DataCollatorWithFlattening()([{"input_ids": ids} for ids in seqs])
    batch.pop("labels")
    return batch


def reference_scores(model, seqs) -> torch.Tensor:
    """Slow reference: the unprepared model's own forward on each sequence alone, `(N, num_labels)`."""
    return torch.cat([model(input_ids=torch.tensor([ids])).logits for ids in seqs])


def loss_weights(shape, seed: int = 1) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def grads(model) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.mark.parametrize("num_labels", [1, 3])
@pytest.mark.parametrize("family", FAMILIES)
def test_scores_and_gradients_equal_each_sequence_alone(family, num_labels):
    reference = classifier(family, num_labels)
    model = prepare_reward_model(copy.deepcopy(reference))
    seqs = sequences()
    weights = loss_weights((len(seqs), num_labels))

    expected = reference_scores(reference, seqs)
    (expected * weights).sum().backward()
    scores = sequence_scores(model, flattened(seqs))
    (scores * weights).sum().backward()

    assert scores.shape == (len(seqs), num_labels)
    torch.testing.assert_close(scores, expected, atol=TOLERANCE, rtol=0)
    assert max_diff(grads(model), grads(reference)) <= TOLERANCE
    assert len(grads(model)) == len(list(model.parameters()))  # every parameter got a gradient


def test_boundary_off_by_one_token_is_caught():
    """Negative control: the same batch with the first boundary one token late (the first sequence swallows the
    second's first token) gives scores the comparison rejects."""
    reference = classifier("llama")
    model = prepare_reward_model(copy.deepcopy(reference))
    seqs = sequences([5, 3, 4])
    shifted = [seqs[0] + seqs[1][:1], seqs[1][1:], seqs[2]]
    scores = sequence_scores(model, flattened(shifted))
    assert (scores - reference_scores(reference, seqs)).abs().max() > 1e-3


def test_the_models_own_forward_gives_one_score_for_a_flattened_row():
    """Why the model's own forward stays refused: unprepared, it pools the whole row once."""
    model = classifier("llama")
    batch = flattened(sequences())
    assert model(**batch, use_cache=False).logits.shape == (1, 1)


def test_prepared_reward_model_still_refuses_flattened_rows_in_its_own_forward():
    model = prepare_reward_model(classifier("llama"))
    with pytest.raises(ValueError, match=r"(?s)flattened batch.*per row.*sequence_scores"):
        model(**flattened(sequences()))
    with pytest.raises(ValueError, match=r"(?s)ForSequenceClassification.*per row"):
        prepare_model_for_flattening(classifier("llama"))


def test_padded_batches_through_the_prepared_model_are_unchanged():
    reference = classifier("llama")
    model = prepare_reward_model(copy.deepcopy(reference))
    seqs = sequences([5, 2, 7])
    width = max(map(len, seqs))
    input_ids = torch.tensor([ids + [PAD] * (width - len(ids)) for ids in seqs])
    mask = (input_ids != PAD).long()
    expected = reference(input_ids=input_ids, attention_mask=mask).logits
    torch.testing.assert_close(model(input_ids=input_ids, attention_mask=mask).logits, expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(expected, reference_scores(reference, seqs), atol=TOLERANCE, rtol=0)


def test_trailing_pad_tokens_pool_where_the_model_alone_pools():
    """When `pad_token_id` is also the end-of-sequence id (Llama 3, Mistral tokenizers without a pad token), a
    sequence ends with it and the model pools at its last other token; an all-pad sequence pools at its start."""
    reference = classifier("llama")
    model = prepare_reward_model(copy.deepcopy(reference))
    seqs = [*sequences([4, 6]), [PAD], [7, PAD, PAD]]
    seqs[0] = seqs[0] + [PAD]
    batch = flattened(seqs)
    assert pooled_indices(batch["input_ids"][0], batch["cu_seq_lens_q"], PAD).tolist() == [3, 10, 11, 12]
    torch.testing.assert_close(sequence_scores(model, batch), reference_scores(reference, seqs), atol=TOLERANCE, rtol=0)


def test_pooled_indices_without_a_pad_token_are_each_sequences_last_token():
    cu_seqlens = torch.tensor([0, 3, 4, 6], dtype=torch.int32)
    ids = torch.tensor([5, 0, 0, 0, 7, 0])
    assert pooled_indices(ids, cu_seqlens, None).tolist() == [2, 3, 5]
    assert pooled_indices(ids, cu_seqlens, 0).tolist() == [0, 3, 4]


def test_a_model_without_a_score_head_is_refused():
    with pytest.raises(TypeError, match=r"LlamaForCausalLM.*score"):
        prepare_reward_model(tiny_causal_lm("llama"))
    with pytest.raises(TypeError, match=r"LlamaForCausalLM.*score"):
        sequence_scores(tiny_causal_lm("llama"), flattened(sequences()))


def test_an_unprepared_model_is_refused():
    with pytest.raises(ValueError, match="prepare_reward_model"):
        sequence_scores(classifier("llama"), flattened(sequences()))


def test_a_batch_without_boundaries_is_refused():
    model = prepare_reward_model(classifier("llama"))
    batch = flattened(sequences())
    batch.pop("cu_seq_lens_q")
    with pytest.raises(ValueError, match=r"cu_seq_lens_q.*DataCollatorWithFlattening"):
        sequence_scores(model, batch)
    with pytest.raises(ValueError, match=r"one flattened row of shape \(1, T\)"):
        sequence_scores(model, {**flattened(sequences()), "input_ids": torch.ones(2, 31, dtype=torch.long)})


def test_lora_reward_model_is_exact():
    peft = pytest.importorskip("peft")
    reference = classifier("llama")
    config = peft.LoraConfig(task_type="SEQ_CLS", r=4, target_modules=["q_proj", "v_proj"], modules_to_save=["score"])
    reference = peft.get_peft_model(reference, config)
    for name, parameter in reference.named_parameters():  # non-zero B so LoRA changes the outputs
        if "lora_B" in name:
            torch.nn.init.normal_(parameter, std=0.5, generator=torch.Generator().manual_seed(len(name)))
    model = prepare_reward_model(copy.deepcopy(reference))
    assert isinstance(model, peft.PeftModel)
    seqs = sequences()
    weights = loss_weights((len(seqs), 1))
    (reference_scores(reference, seqs) * weights).sum().backward()
    scores = sequence_scores(model, flattened(seqs))
    (scores * weights).sum().backward()
    torch.testing.assert_close(scores, reference_scores(reference, seqs), atol=TOLERANCE, rtol=0)
    trained = grads(model)
    assert trained and all("lora_" in name or "score" in name for name in trained)
    assert max_diff(trained, grads(reference)) <= TOLERANCE
