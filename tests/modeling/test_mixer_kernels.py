"""Gated-delta-rule layers run once on the whole flattened row through their own kernels, where those take the row's
boundaries: fla's `chunk_gated_delta_rule(cu_seqlens=...)` and causal-conv1d's `causal_conv1d_fn(seq_idx=...)`.

Neither kernel runs on a CPU (fla's are Triton; causal-conv1d builds only with nvcc), so these tests install
stand-ins under the real module paths with the real signatures (fla 0.6.0, checked against the installed fla-core's
source; causal-conv1d 1.5, which does not install without nvcc). Each computes every sequence its boundaries name
through a library's own PyTorch reference: transformers' (the fallback of `use_kernel_func_from_hub_with_fallback`)
or, for the rule, fla's `naive_recurrent_gated_delta_rule` where fla-core is installed (its naive module needs no
Triton). The model's functions are re-resolved by that same transformers decorator, as importing the model with the
packages installed does. What is proven is flatcollate's side: the
boundaries reach the kernels, one call per layer, exact against every sequence alone; a kernel that ignores them is
caught; a missing kernel or one without the parameter keeps one call per sequence. `test_real_kernels_on_cuda` runs
the installed kernels themselves where a GPU has them.
"""

import ast
import collections
import copy
import importlib
import importlib.util
import inspect
import re
import sys
import types
from pathlib import Path

import pytest
import torch
from transformers.integrations.hub_kernels import use_kernel_func_from_hub_with_fallback

from flatcollate import prepare_model_for_flattening
from flatcollate.families import FAMILIES, family_of, is_mixer
from flatcollate.modeling.stateful_layers import missing_kernels, segment_mixers
from flatcollate.testing import tiny_causal_lm

from .test_forward_context import collate, flat, recut, sequences

LENGTHS = (9, 3, 1, 14)
KERNEL_FAMILIES = sorted(name for name, family in FAMILIES.items() if family.mixer_kernels)
"""Every family whose mixers hand boundaries to kernels; qwen3_next runs in the fast tier."""
SLOW = pytest.mark.slow


def fla_source() -> Path | None:
    """fla-core's `ops/gated_delta_rule` folder, found without importing fla (its package root imports Triton): the
    installed package's, or the copy `tools/setup_env.sh` keeps off the import path (`<venv>/references`); None
    where there is neither."""
    spec = importlib.util.find_spec("fla")
    roots = [Path(spec.submodule_search_locations[0])] if spec is not None else []
    roots.append(Path(sys.prefix) / "references" / "fla")
    folders = [root / "ops" / "gated_delta_rule" for root in roots]
    return next((folder for folder in folders if (folder / "naive.py").is_file()), None)


def fla_naive_recurrence():
    """fla's own `naive_recurrent_gated_delta_rule` (PyTorch and einops only), loaded from its file."""
    folder = fla_source()
    if folder is None:
        pytest.skip("fla-core is not installed (tools/setup_env.sh puts its naive PyTorch references, which need no "
                    "Triton, in <venv>/references)")
    spec = importlib.util.spec_from_file_location("fla_naive_gated_delta_rule", folder / "naive.py")
    naive = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(naive)
    return naive.naive_recurrent_gated_delta_rule


def fla_rule_through_naive(module):
    """`(q, k, v, g, beta, use_qk_l2norm_in_kernel)` of one sequence through fla's naive recurrence, with the
    normalisation and value-head grouping transformers' PyTorch path applies before its own rule."""
    naive = fla_naive_recurrence()

    def rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=False):
        if use_qk_l2norm_in_kernel:
            q, k = module.l2norm(q), module.l2norm(k)
        groups = v.shape[2] // q.shape[2]
        q, k = q.repeat_interleave(groups, dim=2), k.repeat_interleave(groups, dim=2)
        return naive(q, k, v, beta, g)[0].to(v.dtype), None

    return rule


def install_kernels(
    monkeypatch, model_type, *, honour=True, conv=True, rule=True, rule_takes_cu_seqlens=True, reference="transformers"
):
    """Stand-ins for causal-conv1d and fla (see the module docstring), resolved into `model_type`'s modeling module by
    transformers' own decorator. `honour=False`: kernels that take the boundaries and ignore them. `reference`: whose
    PyTorch rule computes each sequence (`"transformers"` or `"fla"`). Returns the list every call appends
    `(function, boundaries given)` to."""
    module = importlib.import_module(type(tiny_causal_lm(model_type)).__module__)
    conv_reference = module.causal_conv1d_fn.__wrapped__
    torch_rule = module.torch_chunk_gated_delta_rule.__wrapped__
    rule_reference = torch_rule if reference == "transformers" else fla_rule_through_naive(module)
    calls = []

    def causal_conv1d_fn(
        x, weight, bias=None, seq_idx=None, initial_states=None, return_final_states=False, final_states_out=None,
        activation=None,
    ):
        calls.append(("causal_conv1d_fn", seq_idx is not None))
        if seq_idx is None or not honour:
            return conv_reference(x, weight, bias, activation=activation)
        lengths = torch.unique_consecutive(seq_idx[0], return_counts=True)[1].tolist()
        return torch.cat([conv_reference(p, weight, bias, activation=activation) for p in x.split(lengths, -1)], -1)

    def chunk_gated_delta_rule(
        q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, use_qk_l2norm_in_kernel=False,
        use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, state_v_first=False, cu_seqlens=None,
        cu_seqlens_cpu=None, chunk_indices=None, cp_context=None, **kwargs,
    ):
        calls.append(("chunk_gated_delta_rule", cu_seqlens is not None))
        assert scale is None and initial_state is None and not output_final_state  # what training passes
        lengths = [q.shape[1]] if cu_seqlens is None or not honour else cu_seqlens.diff().tolist()
        outputs = [
            rule_reference(*parts, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)[0]
            for parts in zip(*(t.split(lengths, 1) for t in (q, k, v, g, beta)), strict=True)
        ]
        return torch.cat(outputs, 1), None

    def without_cu_seqlens(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, **kwargs):
        return chunk_gated_delta_rule(q, k, v, g, beta, scale, initial_state, output_final_state, **kwargs)

    packages = {}
    if conv:
        packages["causal_conv1d"] = {"causal_conv1d_fn": causal_conv1d_fn}
    if rule:
        packages["fla"] = {}
        packages["fla.ops"] = {}
        rule_function = chunk_gated_delta_rule if rule_takes_cu_seqlens else without_cu_seqlens
        packages["fla.ops.gated_delta_rule"] = {"chunk_gated_delta_rule": rule_function}
    for name, attributes in packages.items():
        package = types.ModuleType(name)
        vars(package).update(attributes)
        monkeypatch.setitem(sys.modules, name, package)
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, package)
    resolve = use_kernel_func_from_hub_with_fallback
    monkeypatch.setattr(module, "causal_conv1d_fn", resolve("causal_conv1d_fn", "causal_conv1d")(conv_reference))
    monkeypatch.setattr(module, "torch_chunk_gated_delta_rule", resolve("chunk_gated_delta_rule", "fla")(torch_rule))
    return calls


def test_the_rule_stand_in_takes_fla_s_real_parameters(monkeypatch):
    fla_naive_recurrence()  # skips where fla-core is not installed
    tree = ast.parse((fla_source() / "chunk.py").read_text())
    real = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "chunk_gated_delta_rule").args
    names = [a.arg for a in (*real.posonlyargs, *real.args, *real.kwonlyargs)] + [real.kwarg.arg] * bool(real.kwarg)
    install_kernels(monkeypatch, "qwen3_next")
    assert list(inspect.signature(sys.modules["fla.ops.gated_delta_rule"].chunk_gated_delta_rule).parameters) == names


def prepared_counting_calls(base):
    """A prepared copy of `base` (mixers in mode "auto") and the count of its mixers' forward calls, by layer: a
    forward set on each layer before preparing is what the wrapped layer calls, once per call it makes."""
    model, calls = copy.deepcopy(base), collections.Counter()
    for layer in (m for m in model.modules() if is_mixer(m)):

        def counting(*args, _layer=layer, _inner=layer.forward, **kwargs):
            calls[id(_layer)] += 1
            return _inner(*args, **kwargs)

        layer.forward = counting
    return prepare_model_for_flattening(model), calls


@pytest.mark.parametrize(  # fla's naive recurrence steps token by token: on the fast family only, the same op
    ("model_type", "reference"),
    [
        *(
            (family, "transformers") if family == "qwen3_next" else pytest.param(family, "transformers", marks=SLOW)
            for family in KERNEL_FAMILIES
        ),
        ("qwen3_next", "fla"),
    ],
)
def test_one_call_per_layer_on_the_row_through_its_kernels_exact_against_each_sequence_alone(
    model_type, reference, monkeypatch, per_sequence, assert_exact
):
    kernel_calls = install_kernels(monkeypatch, model_type, reference=reference)
    base = tiny_causal_lm(model_type, seed=0)
    model, layer_calls = prepared_counting_calls(base)  # mode "auto": the kernels are installed
    assert missing_kernels(model) == []
    parts = sequences(LENGTHS, vocab=base.config.vocab_size)
    got = flat(model, **collate(parts))
    assert layer_calls and set(layer_calls.values()) == {1}  # one call per layer, four sequences in the row
    assert kernel_calls and all(given for _, given in kernel_calls)  # every kernel call got the boundaries
    assert_exact(got, per_sequence(base, parts))
    with pytest.raises(AssertionError):  # negative control: the sequences cut one token elsewhere
        assert_exact(got, per_sequence(base, recut(parts)))


def test_the_row_through_its_kernels_under_gradient_checkpointing(monkeypatch, per_sequence, assert_exact):
    install_kernels(monkeypatch, "qwen3_next")
    base = tiny_causal_lm("qwen3_next", seed=0)
    model = prepare_model_for_flattening(copy.deepcopy(base))
    model.train().gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    parts = sequences(LENGTHS, vocab=base.config.vocab_size)
    assert_exact(flat(model, **collate(parts)), per_sequence(base.train(), parts))


def test_a_kernel_that_takes_the_boundaries_and_ignores_them_fails_the_proof(monkeypatch, per_sequence, assert_exact):
    install_kernels(monkeypatch, "qwen3_next", honour=False)
    base = tiny_causal_lm("qwen3_next", seed=0)
    model = prepare_model_for_flattening(copy.deepcopy(base))
    parts = sequences(LENGTHS, vocab=base.config.vocab_size)
    with pytest.raises(AssertionError):
        assert_exact(flat(model, **collate(parts)), per_sequence(base, parts))


@pytest.mark.parametrize(
    ("installed", "missing"),
    [
        ({"conv": False}, ["causal_conv1d.causal_conv1d_fn(seq_idx)"]),
        ({"rule": False}, ["fla.ops.gated_delta_rule.chunk_gated_delta_rule(cu_seqlens)"]),
        ({"rule_takes_cu_seqlens": False}, ["fla.ops.gated_delta_rule.chunk_gated_delta_rule(cu_seqlens)"]),
    ],
    ids=["no causal-conv1d", "no fla", "a rule without cu_seqlens"],
)
def test_a_missing_kernel_keeps_one_call_per_sequence_and_kernels_mode_names_it(
    installed, missing, monkeypatch, per_sequence, assert_exact
):
    install_kernels(monkeypatch, "qwen3_next", **installed)
    base = tiny_causal_lm("qwen3_next", seed=0)
    assert missing_kernels(base) == missing
    with pytest.raises(ValueError, match=r"mode='kernels'.*lacks " + re.escape(missing[0])):
        segment_mixers(copy.deepcopy(base), mode="kernels")
    model, layer_calls = prepared_counting_calls(base)  # "auto": one call per sequence
    parts = sequences(LENGTHS, vocab=base.config.vocab_size)
    assert_exact(flat(model, **collate(parts)), per_sequence(base, parts))
    assert set(layer_calls.values()) == {len(LENGTHS)}


def test_without_the_packages_no_kernel_path_and_families_without_one_refuse_kernels_mode():
    qwen, mamba = tiny_causal_lm("qwen3_next"), tiny_causal_lm("mamba2")
    assert family_of(qwen).mixer_kernels and missing_kernels(qwen) == [  # this machine has neither package
        "causal_conv1d.causal_conv1d_fn(seq_idx)",
        "fla.ops.gated_delta_rule.chunk_gated_delta_rule(cu_seqlens)",
    ]
    assert missing_kernels(mamba) is None
    with pytest.raises(ValueError, match="hand no boundaries to kernels"):
        segment_mixers(mamba, mode="kernels")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="fla's Triton kernels and causal-conv1d need a CUDA GPU")
def test_real_kernels_on_cuda(per_sequence):
    pytest.importorskip("fla.ops.gated_delta_rule", reason="flash-linear-attention is not installed")
    pytest.importorskip("causal_conv1d", reason="causal-conv1d is not installed")
    base = tiny_causal_lm("qwen3_next", seed=0).cuda()
    model, layer_calls = prepared_counting_calls(base)
    assert missing_kernels(model) == []
    parts = [part.cuda() for part in sequences(LENGTHS, vocab=base.config.vocab_size)]
    batch = {key: value.cuda() for key, value in collate(parts).items()}
    got, expected = flat(model, **batch), per_sequence(base, parts)
    assert set(layer_calls.values()) == {1}
    torch.testing.assert_close(got[0], expected[0], atol=2e-3, rtol=2e-3)  # Triton's fp32 matmuls use TF32
    moved = per_sequence(base, recut(parts))[0]  # negative control
    assert not torch.allclose(got[0], moved, atol=2e-3, rtol=2e-3)
