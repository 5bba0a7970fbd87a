"""Model-level proofs through the CUDA dispatch paths, on CPU: the `flash_attn` and `torch_varlen` kernels replaced
by their references (`flatcollate.attention.reference_kernels`), which compute what the real kernels document and
refuse what they refuse (fp16/bf16 relaxed to fp32 here, CUDA relaxed to CPU).

A flattened batch through the prepared model must give the logits, loss and gradients of each sequence run alone
through transformers' own eager attention (an independent implementation of windows, softcap and scale), to 1e-5.
Sequences are longer than the sliding windows, so a window passed one key too wide or too narrow shows.
"""

import itertools

import pytest
import torch

from flatcollate import DataCollatorWithFlattening, prepare_model_for_flattening
from flatcollate._conventions import IGNORE_INDEX
from flatcollate.attention import capabilities, dispatch, kernels
from flatcollate.attention.reference_kernels import KernelContract, flash_attn_varlen_func, varlen_attn
from flatcollate.models import tiny_causal_lm

LENGTHS = [11, 1, 6, 17, 3]
CPU_FP32 = KernelContract(dtypes=(torch.float32,), device_type="cpu")
FAMILIES = {
    "llama": {},
    "qwen2_gqa": {"model": "qwen2", "num_key_value_heads": 1},
    "mistral_window": {"model": "mistral", "sliding_window": 4},
    # Random weights ten times the usual scale give attention scores of about 3, so a cap of 1 changes them.
    "gemma2_window_softcap": {
        "model": "gemma2",
        "sliding_window": 5,
        "attn_logit_softcapping": 1.0,
        "initializer_range": 0.2,
    },
    "gemma2_window": {"model": "gemma2", "sliding_window": 5, "attn_logit_softcapping": None},
}


class Counted:
    """Wraps a kernel and counts its calls, so a test knows the path it meant to take was taken."""

    def __init__(self, kernel):
        self.kernel, self.calls = kernel, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.kernel(*args, **kwargs)


@pytest.fixture
def reference_cuda(monkeypatch):
    """Make dispatch believe it runs on CUDA in half precision, with both varlen kernels being the references."""
    monkeypatch.setattr(capabilities, "HAS_CUDA", True)
    monkeypatch.setattr(capabilities, "is_cuda_tensor", lambda tensor: True)
    monkeypatch.setattr(dispatch, "_HALF", (*dispatch._HALF, torch.float32))
    kernels_by_name = {
        "flash_attn": Counted(flash_attn_varlen_func(CPU_FP32)),
        "torch_varlen": Counted(varlen_attn(CPU_FP32)),
    }
    monkeypatch.setattr(capabilities, "HAS_FLASH_ATTN", True)
    monkeypatch.setattr(capabilities, "flash_attn_varlen_func", kernels_by_name["flash_attn"])
    monkeypatch.setattr(capabilities, "HAS_TORCH_VARLEN", True)
    monkeypatch.setattr(capabilities, "varlen_attn", kernels_by_name["torch_varlen"])

    def use(backend: str) -> Counted:
        if backend == "torch_varlen":
            monkeypatch.setattr(capabilities, "HAS_FLASH_ATTN", False)
        return kernels_by_name[backend]

    return use


def flat_vs_alone(family: str) -> dict[str, float]:
    """Largest gaps of logits, loss and gradients: flattened batch (prepared model) vs each sequence alone (eager)."""
    options = dict(FAMILIES[family])
    model_type = options.pop("model", family)
    generator = torch.Generator().manual_seed(1)
    features = [{"input_ids": torch.randint(0, 256, (n,), generator=generator).tolist()} for n in LENGTHS]
    batch = DataCollatorWithFlattening()(features)
    flat_model = prepare_model_for_flattening(tiny_causal_lm(model_type, **options))
    alone_model = tiny_causal_lm(model_type, attn_implementation="eager", **options)
    alone_model.config.use_cache = False

    out = flat_model(**batch)
    out.loss.backward()

    logits, total = [], 0.0
    for start, end in itertools.pairwise(batch["cu_seq_lens_q"].tolist()):  # the slow route: one sequence a time
        seq_logits = alone_model(input_ids=batch["input_ids"][:, start:end]).logits
        labels = batch["labels"][0, start + 1 : end]
        total = total + torch.nn.functional.cross_entropy(seq_logits[0, :-1], labels, reduction="sum")
        logits.append(seq_logits)
    loss = total / (batch["labels"][0, 1:] != IGNORE_INDEX).sum()
    loss.backward()

    alone_params = dict(alone_model.named_parameters())
    return {
        "logits": (out.logits - torch.cat(logits, dim=1)).abs().max().item(),
        "loss": (out.loss - loss).abs().item(),
        "grads": max((p.grad - alone_params[n].grad).abs().max().item() for n, p in flat_model.named_parameters()),
    }


@pytest.mark.parametrize("family", FAMILIES)
def test_flash_attn_path_is_exact(reference_cuda, family):
    kernel = reference_cuda("flash_attn")
    gaps = flat_vs_alone(family)
    assert kernel.calls == 2, "the flash_attn path was not taken (two layers, one forward)"
    assert max(gaps.values()) <= 1e-5, gaps


@pytest.mark.parametrize("family", [name for name, options in FAMILIES.items() if "softcap" not in name])
def test_torch_varlen_path_is_exact(reference_cuda, family):
    kernel = reference_cuda("torch_varlen")
    gaps = flat_vs_alone(family)
    assert kernel.calls == 2, "the torch_varlen path was not taken (two layers, one forward)"
    assert max(gaps.values()) <= 1e-5, gaps


@pytest.mark.parametrize("backend", ["flash_attn", "torch_varlen"])
@pytest.mark.parametrize("shift", [1, -1])
def test_a_window_off_by_one_is_caught(reference_cuda, monkeypatch, backend, shift):
    reference_cuda(backend)
    correct = kernels.keys_before
    monkeypatch.setattr(kernels, "keys_before", lambda window: correct(window) + shift)
    gaps = flat_vs_alone("mistral_window")
    assert gaps["logits"] > 1e-3, f"a window off by {shift} went unnoticed: {gaps}"


CALL_MUTATIONS = {
    "softcap dropped": {"softcap": 0.0},
    "default scale instead of the model's": {"softmax_scale": None},
    "not causal": {"causal": False},
    "no window": {"window_size": (-1, -1)},
}


@pytest.mark.parametrize("mutation", CALL_MUTATIONS)
def test_each_argument_of_the_flash_attn_call_is_checked_by_meaning(reference_cuda, monkeypatch, mutation):
    kernel = reference_cuda("flash_attn")
    monkeypatch.setattr(capabilities, "flash_attn_varlen_func", lambda **kw: kernel(**kw | CALL_MUTATIONS[mutation]))
    gaps = flat_vs_alone("gemma2_window_softcap")  # Gemma 2 scales by query_pre_attn_scalar, not the head dim
    assert gaps["logits"] > 1e-3, f"{mutation} went unnoticed: {gaps}"


# On a CUDA machine: a bf16 model on the real kernels, each call also run through the reference under the CUDA
# contract, so every precondition is checked on what the model really passes (devices of `cu_seqlens`, strides).
REAL_DEVICE = "cuda"
REAL_CONTRACT = KernelContract()
REFERENCES = {"flash_attn": flash_attn_varlen_func, "torch_varlen": varlen_attn}
ATTRIBUTES = {"flash_attn": "flash_attn_varlen_func", "torch_varlen": "varlen_attn"}


@pytest.mark.skipif(not capabilities.HAS_CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("backend", ["flash_attn", "torch_varlen"])
def test_real_kernels_in_a_bf16_model_get_what_they_accept(monkeypatch, backend):
    real = getattr(capabilities, ATTRIBUTES[backend])
    if real is None:
        pytest.skip(f"{backend} is not installed")
    reference, gaps = REFERENCES[backend](REAL_CONTRACT), []

    def checked(*args, **kwargs):
        with torch.no_grad():
            expected = reference(*(a.detach() if torch.is_tensor(a) else a for a in args), **kwargs)
        out = real(*args, **kwargs)
        gaps.append((out.double() - expected.double()).abs().max().item() / (1 + expected.abs().max().item()))
        return out

    monkeypatch.setattr(capabilities, ATTRIBUTES[backend], checked)
    if backend == "torch_varlen":
        monkeypatch.setattr(capabilities, "HAS_FLASH_ATTN", False)
    generator = torch.Generator().manual_seed(1)
    features = [{"input_ids": torch.randint(0, 256, (n,), generator=generator).tolist()} for n in LENGTHS]
    batch = {
        key: value.to(REAL_DEVICE) if torch.is_tensor(value) else value
        for key, value in DataCollatorWithFlattening()(features).items()
    }
    model = tiny_causal_lm("mistral", sliding_window=4, dtype=torch.bfloat16).to(REAL_DEVICE)
    prepare_model_for_flattening(model)(**batch).loss.backward()
    assert len(gaps) == 2, f"the {backend} path was not taken"
    assert max(gaps) <= 1e-2, gaps  # bf16 keeps about 3 significant digits
