"""`prepare_model_for_flattening(model, fused_loss=...)`: a forward with labels returns the loss without logits, equal
to the model's own full-logits loss (the same model called with `return_logits=True`) within 1e-6 relative in fp32,
loss and every parameter's gradient, on a flattened batch cut into chunks of 3 tokens; tied embeddings, Gemma 2's
soft-capped logits, LoRA (on the head too) and `torch.compile` included. A chunk fed targets one token off breaks it.
The flattened batch equals each sequence alone (`per_sequence`): no prediction crosses a boundary.

Cut Cross-Entropy and Liger are not installed on the CPU machines the suite runs on: their dispatch is tested through
patched detection (`loss_kernels.installed_kernels`, `loss_kernels.runs_kernels`) with a stand-in kernel; the real
kernels are compared on CUDA only, where installed.
"""

import pytest
import torch

from flatcollate import DataCollatorWithFlattening, prepare_model_for_flattening
from flatcollate.check.runs import gradients
from flatcollate.modeling import chunked_loss, fused_loss, loss_kernels
from flatcollate.testing import tiny_causal_lm

LENGTHS = (1, 7, 4, 12, 2)  # a length-1 sequence, and rows that cut the 3-token chunks anywhere


@pytest.fixture
def sequences():
    generator = torch.Generator().manual_seed(0)
    return [torch.randint(0, 256, (n,), generator=generator) for n in LENGTHS]


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of 3 labelled tokens, so that every batch here is cut into several."""
    monkeypatch.setattr(fused_loss, "chunk_tokens", lambda vocab_size: 3)


def flat_batch(sequences) -> dict:
    batch = DataCollatorWithFlattening()([{"input_ids": ids.tolist()} for ids in sequences])
    batch["labels"] = batch["input_ids"].clone()  # the guard keeps them inside their sequences
    return batch


def run(model, batch: dict, **options):
    """`(loss, grads)` of one backward of `model(**batch, **options)`."""
    model.zero_grad(set_to_none=True)
    out = model(**batch, use_cache=False, **options)
    out.loss.backward()
    return out.loss.detach(), gradients(model)


def prepared(family: str = "llama", *, fused: bool | str = True, **overrides):
    return prepare_model_for_flattening(tiny_causal_lm(family, **overrides), fused_loss=fused)


CASES = {
    "llama": ("llama", {}),
    "tied embeddings": ("qwen2", {"tie_word_embeddings": True}),
    "gemma2 soft-cap": ("gemma2", {"final_logit_softcapping": 0.5}),
}


@pytest.mark.parametrize("case", CASES)
def test_the_fused_loss_equals_the_full_loss(case, sequences, small_chunks, assert_relatively_close):
    family, overrides = CASES[case]
    model = prepared(family, **overrides)
    if family == "qwen2":
        assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    batch = flat_batch(sequences)
    expected = run(model, batch, return_logits=True)
    assert_relatively_close(run(model, batch), expected)


def test_a_chunk_fed_targets_one_token_off_breaks_it(sequences, small_chunks, monkeypatch, assert_relatively_close):
    model, batch = prepared(), flat_batch(sequences)
    expected = run(model, batch, return_logits=True)
    exact = chunked_loss.chunked_cross_entropy

    def one_off(hidden, head, targets, **options):
        return exact(hidden, head, targets.roll(-1), **options)

    monkeypatch.setattr(fused_loss, "chunked_cross_entropy", one_off)
    with pytest.raises(AssertionError, match="loss"):
        assert_relatively_close(run(model, batch), expected)


def test_no_prediction_crosses_a_boundary(sequences, small_chunks, per_sequence, assert_exact):
    model = prepared()
    expected = per_sequence(model, sequences)
    loss, grads = run(model, flat_batch(sequences))
    assert_exact((expected[0], loss, grads), expected)  # no logits come back: the reference's stand in


def test_shift_labels_are_used_as_given(sequences, small_chunks, per_sequence, assert_relatively_close):
    """`shift_labels` replace the shift: the guard's label rule applies to `labels` only, so shift labels taken over
    the whole row (each sequence's last token predicting the next one's first) train across boundaries."""
    model, batch = prepared(), flat_batch(sequences)
    expected = run(model, batch)
    masked = batch["input_ids"].masked_fill(batch["position_ids"] == 0, -100)
    given = {**batch, "labels": None, "shift_labels": chunked_loss.next_token_targets(masked)}
    assert_relatively_close(run(model, given), expected)
    across = {**given, "shift_labels": chunked_loss.next_token_targets(batch["input_ids"])}
    with pytest.raises(AssertionError, match="loss"):
        assert_relatively_close(run(model, across), expected)


def test_logits_come_back_only_when_asked_for(sequences):
    model, batch = prepared(), flat_batch(sequences)
    fused, full = model(**batch), model(**batch, return_logits=True)
    assert fused.logits is None and full.logits.shape == (1, sum(LENGTHS), 256)
    torch.testing.assert_close(fused.loss, full.loss, rtol=1e-6, atol=0)
    without_labels = model(**{k: v for k, v in batch.items() if k != "labels"})
    torch.testing.assert_close(without_labels.logits, full.logits)


def test_num_items_in_batch_makes_it_a_sum_over_the_step(sequences):
    model, batch = prepared(), flat_batch(sequences)
    mean = model(**batch).loss
    labelled = sum(n - 1 for n in LENGTHS)
    torch.testing.assert_close(model(**batch, num_items_in_batch=torch.tensor(100)).loss, mean * labelled / 100)
    full = model(**batch, num_items_in_batch=torch.tensor(100), return_logits=True).loss
    torch.testing.assert_close(model(**batch, num_items_in_batch=torch.tensor(100)).loss, full)


def test_lora_on_the_head_too(sequences, small_chunks, assert_relatively_close):
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj", "lm_head"], init_lora_weights=False)
    model = prepare_model_for_flattening(peft.get_peft_model(tiny_causal_lm("llama"), config), fused_loss=True)
    batch = flat_batch(sequences)
    expected = run(model, batch, return_logits=True)
    got = run(model, batch)
    assert any("lm_head.lora_A" in name for name in got[1])
    assert_relatively_close(got, expected)


def test_preparing_again_keeps_the_guard_in_front(sequences, small_chunks, per_sequence, assert_exact):
    model = prepare_model_for_flattening(tiny_causal_lm("llama"))
    prepare_model_for_flattening(model, fused_loss="chunked")
    prepare_model_for_flattening(model, fused_loss=True)
    expected = per_sequence(model, sequences)
    loss, grads = run(model, flat_batch(sequences))
    assert_exact((expected[0], loss, grads), expected)


@pytest.mark.slow
def test_under_torch_compile(sequences, small_chunks, assert_relatively_close):
    model, batch = prepared(), flat_batch(sequences)
    expected = run(model, batch, return_logits=True)
    compiled = torch.compile(model)
    model.zero_grad(set_to_none=True)
    out = compiled(**batch, use_cache=False)
    out.loss.backward()
    assert out.logits is None
    assert_relatively_close((out.loss.detach(), gradients(model)), expected)


def _reference_kernel(calls):
    """A stand-in for a fused kernel: the full logits, called as Cut Cross-Entropy and Liger are."""

    def kernel(hidden, weight, targets, *, bias, softcap, reduction):
        calls.append((tuple(hidden.shape), reduction))
        logits = chunked_loss.softcapped(torch.nn.functional.linear(hidden, weight, bias), softcap)
        return torch.nn.functional.cross_entropy(logits.float(), targets, reduction=reduction)

    return kernel


@pytest.mark.parametrize("name", ["cce", "liger"])
def test_an_installed_kernel_computes_the_loss_where_it_runs(name, sequences, monkeypatch, assert_relatively_close):
    calls = []
    monkeypatch.setattr(loss_kernels, "installed_kernels", lambda: {name: _reference_kernel(calls)})
    model, batch = prepared("gemma2", fused=name, final_logit_softcapping=0.5), flat_batch(sequences)
    expected = run(model, batch, return_logits=True)
    with pytest.raises(ValueError, match=f"fused_loss='{name}' runs on CUDA with a plain `torch.nn.Linear` head"):
        model(**batch)
    monkeypatch.setattr(loss_kernels, "runs_kernels", lambda hidden, head: True)  # as on CUDA
    assert_relatively_close(run(model, batch), expected)
    assert calls[-1] == ((sum(LENGTHS), model.config.hidden_size), "sum")


def test_auto_takes_the_chunked_path_where_no_kernel_runs(sequences, monkeypatch):
    calls = []
    monkeypatch.setattr(loss_kernels, "installed_kernels", lambda: {"liger": _reference_kernel(calls)})
    model, batch = prepared(fused=True), flat_batch(sequences)
    model(**batch)
    assert calls == []  # CPU tensors: the kernel is not called
    monkeypatch.setattr(loss_kernels, "runs_kernels", lambda hidden, head: True)
    model(**batch)
    assert len(calls) == 1


def test_a_kernel_that_is_not_installed_is_refused(monkeypatch):
    monkeypatch.setattr(loss_kernels, "installed_kernels", dict)
    model = tiny_causal_lm("llama")
    with pytest.raises(ValueError, match="pip install cut-cross-entropy"):
        prepare_model_for_flattening(model, fused_loss="cce")
    assert model.config._attn_implementation == "sdpa"  # refused before anything changed
    with pytest.raises(ValueError, match="fused_loss='fast' is not a backend"):
        prepare_model_for_flattening(model, fused_loss="fast")


@pytest.mark.parametrize(
    ("family", "overrides", "reason"),
    [
        ("cohere", {}, "scales the logits after the head"),
        ("mixtral", {"output_router_logits": True}, "load-balancing loss"),
    ],
)
def test_families_whose_forward_does_more_than_the_head_are_refused(family, overrides, reason):
    with pytest.raises(ValueError, match=reason):
        prepared(family, **overrides)


@pytest.mark.skipif(
    not torch.cuda.is_available() or not loss_kernels.KERNELS.keys() & set(loss_kernels.installed_kernels()),
    reason="needs CUDA and cut-cross-entropy or liger-kernel (neither runs on CPU; dispatch is tested above through "
    "patched detection)",
)
def test_the_real_kernel_agrees_with_the_chunked_path_on_cuda(sequences):
    kernel = next(name for name in loss_kernels.KERNELS if name in loss_kernels.installed_kernels())
    model = prepared(fused=kernel).cuda()
    batch = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in flat_batch(sequences).items()}
    expected = model(**batch, return_logits=True).loss
    torch.testing.assert_close(model(**batch).loss, expected, rtol=1e-3, atol=1e-3)
