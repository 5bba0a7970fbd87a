"""Model-level proofs through every CUDA dispatch path, on CPU: each varlen library replaced by its reference
(`flatcollate.testing.reference_kernels`, `reference_flash_attn`), which computes what the real kernel documents
with its real signature and refuses what it refuses (fp16/bf16 relaxed to fp32 here, CUDA relaxed to CPU).

A flattened batch through the prepared model must give the logits, loss and gradients of each sequence run alone
through transformers' own eager attention (an independent implementation of windows, softcap, sinks and scale), to
1e-5. Sequences are longer than the sliding windows, so a window passed one key too wide or too narrow shows.
"""

import itertools

import pytest
import torch

from flatcollate import DataCollatorWithFlattening, prepare_model_for_flattening
from flatcollate._conventions import IGNORE_INDEX
from flatcollate.attention import capabilities, selection, varlen_kernels
from flatcollate.check.report import max_grad_diff
from flatcollate.testing import tiny_causal_lm
from flatcollate.testing.reference_flash_attn import (
    flash_attn_3_varlen_func,
    flash_attn_4_varlen_func,
    flash_attn_varlen_func,
)
from flatcollate.testing.reference_kernels import (
    KernelContract,
    varlen_attn,
    varlen_attn_2_10,
    varlen_attn_2_11,
    varlen_attn_like,
)

pytestmark = pytest.mark.slow

LENGTHS = [11, 1, 6, 17, 3]
HEAD_DIM = 32  # flash-attn-4 trains head dims that are multiples of 32 only (`features.wrong_gradients`)
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
    # Attention sinks (`s_aux`) and a sliding layer; weights at ten times the scale so the sinks matter.
    "gpt_oss_sinks": {"model": "gpt_oss", "sliding_window": 4, "initializer_range": 0.2},
}
SINKS, SOFTCAP = {"gpt_oss_sinks"}, {"gemma2_window_softcap"}

# kernel -> (what dispatch calls it, the capabilities attribute it is read from, its reference, families it computes)
PATHS = {
    "flash_attn_2": ("flash_attn_2", "flash_attn_varlen_func", flash_attn_varlen_func, set(FAMILIES) - SINKS),
    "flash_attn_3": ("flash_attn_3", "flash_attn_3_varlen_func", flash_attn_3_varlen_func, set(FAMILIES) - SINKS),
    "flash_attn_4": ("flash_attn_4", "flash_attn_4_varlen_func", flash_attn_4_varlen_func, set(FAMILIES)),
    "hub_fa3": ("hub", None, flash_attn_3_varlen_func, set(FAMILIES) - SINKS),
    "hub_fa4": ("hub", None, flash_attn_4_varlen_func, set(FAMILIES)),
    "torch_varlen_2_13": ("torch_varlen", "varlen_attn", varlen_attn, set(FAMILIES) - SINKS - SOFTCAP),
    "torch_varlen_2_11": ("torch_varlen", "varlen_attn", varlen_attn_2_11, set(FAMILIES) - SINKS - SOFTCAP),
    "torch_varlen_2_10": ("torch_varlen", "varlen_attn", varlen_attn_2_10, {"llama", "qwen2_gqa"}),  # no window, scale
}
CASES = [(path, family) for path, (*_, families) in PATHS.items() for family in FAMILIES if family in families]


class Counted:
    """Wraps a kernel and counts its calls, so a test knows the path it meant to take was taken."""

    def __init__(self, kernel):
        self.kernel, self.calls = kernel, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.kernel(*args, **kwargs)


@pytest.fixture
def reference_cuda(monkeypatch):
    """Make dispatch believe it runs on a Hopper GPU in half precision with one kernel installed: `use(path)` puts
    that path's reference in place (every other varlen library absent) and returns it, counted."""
    monkeypatch.setattr(capabilities, "HAS_CUDA", True)
    monkeypatch.setattr(capabilities, "is_cuda_tensor", lambda tensor: True)
    monkeypatch.setattr(capabilities, "compute_capability", lambda tensor: (9, 0))
    monkeypatch.setattr(selection, "HALF", (*selection.HALF, torch.float32))
    monkeypatch.setattr(capabilities, "HAS_FLEX_ATTENTION", False)
    for attribute in ("flash_attn_varlen_func", "flash_attn_3_varlen_func", "flash_attn_4_varlen_func", "varlen_attn"):
        monkeypatch.setattr(capabilities, attribute, None)
    monkeypatch.setattr(capabilities, "transformers_varlen", lambda: None)

    def use(path: str) -> Counted:
        _, attribute, reference, _ = PATHS[path]
        kernel = Counted(reference(CPU_FP32))
        if attribute is None:  # what transformers loaded for attn_implementation="kernels-community/..."
            monkeypatch.setattr(capabilities, "transformers_varlen", lambda: ("kernels-community/flash-attn", kernel))
        else:
            monkeypatch.setattr(capabilities, attribute, kernel)
        real_parameters = capabilities.parameters  # the counted wrapper has the reference's signature
        monkeypatch.setattr(capabilities, "parameters", lambda f: real_parameters(kernel.kernel if f is kernel else f))
        return kernel

    return use


def flat_vs_alone(family: str) -> dict[str, float]:
    """Largest gaps of logits, loss and gradients: flattened batch (prepared model) vs each sequence alone (eager)."""
    options = {"head_dim": HEAD_DIM, **FAMILIES[family]}
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

    flat_grads = {n: p.grad for n, p in flat_model.named_parameters() if p.grad is not None}
    alone_grads = {n: p.grad for n, p in alone_model.named_parameters() if p.grad is not None}
    return {
        "logits": (out.logits - torch.cat(logits, dim=1)).abs().max().item(),
        "loss": (out.loss - loss).abs().item(),
        "grads": max_grad_diff(flat_grads, alone_grads),  # a gradient one side lacks counts against zero
    }


@pytest.mark.parametrize(("path", "family"), CASES)
def test_each_cuda_path_is_exact(reference_cuda, path, family):
    kernel = reference_cuda(path)
    gaps = flat_vs_alone(family)
    checked = path.startswith("hub")  # a Hub kernel trains once its backward checks out on a tiny row
    assert kernel.calls == 2 + checked, f"the {path} path was not taken (two layers, one forward)"
    assert max(gaps.values()) <= 1e-5, gaps


@pytest.mark.parametrize("path", [p for p in PATHS if p != "torch_varlen_2_10"])
@pytest.mark.parametrize("shift", [1, -1])
def test_a_window_off_by_one_is_caught(reference_cuda, monkeypatch, path, shift):
    reference_cuda(path)
    correct = varlen_kernels.keys_before
    monkeypatch.setattr(varlen_kernels, "keys_before", lambda window: correct(window) + shift)
    gaps = flat_vs_alone("mistral_window")
    assert gaps["logits"] > 1e-3, f"a window off by {shift} went unnoticed: {gaps}"


CALL_MUTATIONS = {
    "softcap dropped": ("gemma2_window_softcap", {"softcap": 0.0}),
    "default scale instead of the model's": ("gemma2_window_softcap", {"softmax_scale": None}),
    "not causal": ("gemma2_window_softcap", {"causal": False}),
    "no window": ("gemma2_window_softcap", {"window_size": (-1, -1)}),
}
FA4_MUTATIONS = {  # FA4 reads a window's right side 0 as causal by itself: dropping `causal` alone changes nothing
    "sinks dropped": ("gpt_oss_sinks", {"learnable_sink": None}),
    "not causal, no window": ("gemma2_window_softcap", {"causal": False, "window_size": (None, None)}),
    "FA2's (-1, 0) for causal, without causal=True": ("llama", {"causal": False, "window_size": (-1, 0)}),
}


@pytest.mark.parametrize(
    ("path", "mutation"),
    [(p, m) for p in ("flash_attn_2", "flash_attn_3") for m in CALL_MUTATIONS]
    + [("flash_attn_4", m) for m in CALL_MUTATIONS if m != "not causal"]
    + [("flash_attn_4", m) for m in FA4_MUTATIONS],
)
def test_each_argument_of_a_flash_attn_call_is_checked_by_meaning(reference_cuda, monkeypatch, path, mutation):
    kernel = reference_cuda(path)
    family, change = {**CALL_MUTATIONS, **FA4_MUTATIONS}[mutation]
    mutated = lambda *args, **kw: kernel(*args, **kw | change)  # noqa: E731
    monkeypatch.setattr(capabilities, PATHS[path][1], mutated)
    monkeypatch.setattr(capabilities, "parameters", lambda f: frozenset())
    gaps = flat_vs_alone(family)
    assert gaps["logits"] > 1e-3, f"{mutation} went unnoticed through {path}: {gaps}"


# On a CUDA machine: a bf16 model on each installed kernel, each call also run through the reference under the
# CUDA contract, so every precondition is checked on what the model really passes (devices of `cu_seqlens`, strides).
REAL_DEVICE = "cuda"
REAL_CONTRACT = KernelContract()
REAL_PATHS = {"flash_attn_2": flash_attn_varlen_func, "flash_attn_3": flash_attn_3_varlen_func}
REAL_PATHS |= {"flash_attn_4": flash_attn_4_varlen_func, "torch_varlen": None}


@pytest.mark.skipif(not capabilities.HAS_CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("backend", REAL_PATHS)
def test_real_kernels_in_a_bf16_model_get_what_they_accept(monkeypatch, backend):
    attribute = PATHS["torch_varlen_2_13" if backend == "torch_varlen" else backend][1]
    real = getattr(capabilities, attribute)
    if real is None:
        pytest.skip(f"{backend} is not installed")
    builder = REAL_PATHS[backend] or varlen_attn_like(real)
    reference, gaps = builder(REAL_CONTRACT), []

    def checked(*args, **kwargs):
        with torch.no_grad():
            expected = reference(*(a.detach() if torch.is_tensor(a) else a for a in args), **kwargs)
        result = real(*args, **kwargs)
        out, expected = (t[0] if isinstance(t, tuple) else t for t in (result, expected))
        gaps.append((out.double() - expected.double()).abs().max().item() / (1 + expected.abs().max().item()))
        return result

    for other in {"flash_attn_varlen_func", "flash_attn_3_varlen_func", "flash_attn_4_varlen_func"} - {attribute}:
        monkeypatch.setattr(capabilities, other, None)
    monkeypatch.setattr(capabilities, attribute, checked)
    monkeypatch.setattr(
        capabilities, "parameters", lambda f, known=capabilities.parameters: known(real if f is checked else f)
    )
    generator = torch.Generator().manual_seed(1)
    features = [{"input_ids": torch.randint(0, 256, (n,), generator=generator).tolist()} for n in LENGTHS]
    batch = {
        key: value.to(REAL_DEVICE) if torch.is_tensor(value) else value
        for key, value in DataCollatorWithFlattening()(features).items()
    }
    window = (
        {}
        if "window_size" not in capabilities.parameters(real) and backend == "torch_varlen"
        else {"sliding_window": 4}
    )
    model = tiny_causal_lm("mistral", dtype=torch.bfloat16, head_dim=HEAD_DIM, **window).to(REAL_DEVICE)
    prepare_model_for_flattening(model)(**batch).loss.backward()
    assert len(gaps) == 2, f"the {backend} path was not taken"
    assert max(gaps) <= 1e-2, gaps  # bf16 keeps about 3 significant digits


@pytest.mark.skipif(not capabilities.HAS_CUDA, reason="needs a CUDA device")
@pytest.mark.skipif(capabilities.flash_attn_4_varlen_func is None, reason="needs flash-attn-4")
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_transformers_own_flash_attention_4_path_and_flatcollate_agree(family):
    """transformers' padding-free path (its collator, `attn_implementation="flash_attention_4"`) and flatcollate's on
    the same sequences: the logits of each are within twice bf16's own error (the bf16 model run per sequence) of the
    fp32 per-sequence run of the same weights. The control: flatcollate's batch with one boundary moved by a token."""
    from transformers import DataCollatorWithFlattening as TransformersCollator

    generator = torch.Generator().manual_seed(2)
    lengths = [300, 7, 1, 129, 64]
    rows = [torch.randint(0, 256, (n,), generator=generator) for n in lengths]
    features = [{"input_ids": row.tolist()} for row in rows]
    moved = [{"input_ids": rows[0].tolist() + rows[1][:1].tolist()}, {"input_ids": rows[1][1:].tolist()}, *features[2:]]
    sizes = {"head_dim": HEAD_DIM}
    theirs = tiny_causal_lm(family, dtype=torch.bfloat16, attn_implementation="flash_attention_4", **sizes)
    ours = tiny_causal_lm(family, dtype=torch.bfloat16, **sizes).to(REAL_DEVICE)
    reference = tiny_causal_lm(family, attn_implementation="eager", **sizes).to(REAL_DEVICE)
    reference.load_state_dict(ours.state_dict())  # the same (bf16) weights in fp32
    theirs.to(REAL_DEVICE).load_state_dict(ours.state_dict())

    def logits(model, batch):
        batch = {key: value.to(REAL_DEVICE) if torch.is_tensor(value) else value for key, value in batch.items()}
        with torch.no_grad():
            return model(**batch).logits[0].float()

    def per_sequence(model):
        return torch.cat([logits(model, {"input_ids": row[None]}) for row in rows])

    expected = per_sequence(reference)
    bound = 2 * (per_sequence(ours) - expected).abs().max().item()
    prepare_model_for_flattening(ours)
    gaps = {
        "transformers": logits(theirs, TransformersCollator(return_flash_attn_kwargs=True)(features)),
        "flatcollate": logits(ours, DataCollatorWithFlattening()(features)),
        "flatcollate, a boundary moved": logits(ours, DataCollatorWithFlattening()(moved)),
    }
    gaps = {name: (got - expected).abs().max().item() for name, got in gaps.items()}
    print(f"{family} on {torch.cuda.get_device_name()}: bound {bound:.3g}, largest |logit diff| {gaps}")
    assert gaps["flatcollate"] <= bound, gaps
    assert gaps["transformers"] <= bound, gaps
    assert gaps["flatcollate, a boundary moved"] > bound, gaps
