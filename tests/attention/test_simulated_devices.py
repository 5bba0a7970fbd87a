"""Model-level proofs on simulated GPUs: each install set of varlen libraries on sm86, sm89, sm90, sm100 and sm120,
through references that do what the real kernel does on that architecture (`KernelContract.capability`: FA3 has no
kernel off sm 80/90, FA4 at head dim 256 on sm 100 refuses soft-capping, sinks and windows, FA4 on sm 120 refuses
sinks, FA4's query gradient is lost at head dims off a multiple of 32). `auto` must pick, for every layer, a kernel
the device runs right: the flattened batch's logits, loss and gradients equal the per-sequence run to 1e-5. The
control: without the limits, the same sweep fails.
"""

import dataclasses

import pytest

from flatcollate.attention import capabilities, features, selection
from flatcollate.testing.reference_flash_attn import (
    flash_attn_3_varlen_func,
    flash_attn_4_varlen_func,
    flash_attn_varlen_func,
)
from flatcollate.testing.reference_kernels import varlen_attn

from . import test_cuda_paths_model as paths

reference_cuda = paths.reference_cuda  # the fixture: a Hopper GPU in fp32, every varlen library absent

DEVICES = {"sm86": ((8, 6), 99), "sm89": ((8, 9), 99), "sm90": ((9, 0), 227), "sm100": ((10, 0), 227)}
DEVICES |= {"sm120": ((12, 0), 99)}
LIBRARIES = {
    "flash_attn_2": ("flash_attn_varlen_func", flash_attn_varlen_func),
    "flash_attn_3": ("flash_attn_3_varlen_func", flash_attn_3_varlen_func),
    "flash_attn_4": ("flash_attn_4_varlen_func", flash_attn_4_varlen_func),
    "torch_varlen": ("varlen_attn", varlen_attn),
}
INSTALLS = {"fa3": ["flash_attn_3"], "fa4": ["flash_attn_4"], "all": list(LIBRARIES)}
"""Where the limits bite (FA3 alone, FA4 alone) and all of them; test_cuda_paths_model proves FA2 and torch alone."""
FAMILIES = {
    "llama": {"model": "llama"},
    "llama_head_dim_16": {"model": "llama", "head_dim": 16},  # FA4 trains it wrong: passed over
    "gemma2_head_dim_256_window_softcap": {
        "model": "gemma2",
        "head_dim": 256,
        "sliding_window": 5,
        "attn_logit_softcapping": 1.0,
        "initializer_range": 0.2,
    },
    "gpt_oss_sinks": paths.FAMILIES["gpt_oss_sinks"],
}


def on_device(monkeypatch, device: str, install: str) -> dict[str, paths.Counted]:
    """Pretend to run on `device` with the libraries of `install`, each its reference under that device's rules."""
    capability, shared_kb = DEVICES[device]
    monkeypatch.setattr(capabilities, "compute_capability", lambda tensor: capability)
    monkeypatch.setattr(capabilities, "shared_memory_per_block", lambda tensor: shared_kb * 1024)
    contract = dataclasses.replace(paths.CPU_FP32, capability=capability)
    installed = {}
    for name in INSTALLS[install]:
        attribute, builder = LIBRARIES[name]
        installed[name] = paths.Counted(builder(contract))
        monkeypatch.setattr(capabilities, attribute, installed[name])
    known = capabilities.parameters
    kernels = {id(kernel): kernel.kernel for kernel in installed.values()}
    monkeypatch.setattr(capabilities, "parameters", lambda f: known(kernels.get(id(f), f)))
    takes = capabilities.takes
    monkeypatch.setattr(capabilities, "takes", lambda f, name: takes(kernels.get(id(f), f), name))
    for family, options in FAMILIES.items():
        monkeypatch.setitem(paths.FAMILIES, family, options)
    return installed


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("install", INSTALLS)
@pytest.mark.parametrize("device", DEVICES)
def test_every_device_and_install_set_is_exact(reference_cuda, monkeypatch, device, install, family):
    installed = on_device(monkeypatch, device, install)
    gaps = paths.flat_vs_alone(family)
    assert max(gaps.values()) <= 1e-5, (gaps, {name: kernel.calls for name, kernel in installed.items()})


@pytest.mark.parametrize(
    ("device", "install", "family"),
    [
        ("sm100", "fa3", "llama"),  # FA3 has no sm 100 kernel
        ("sm90", "fa4", "llama_head_dim_16"),  # FA4's lost query gradient
        ("sm100", "fa4", "gemma2_head_dim_256_window_softcap"),  # the hd256 kernel refuses soft-cap and window
        ("sm120", "fa4", "gpt_oss_sinks"),  # the sm 120 kernel refuses sinks
    ],
)
def test_without_the_limits_the_sweep_fails(reference_cuda, monkeypatch, device, install, family):
    on_device(monkeypatch, device, install)
    monkeypatch.setattr(selection, "_LIMITS", {})
    monkeypatch.setattr(selection, "wrong_gradients", lambda name, head_dim: None)
    monkeypatch.setattr(features, "wrong_gradients", lambda name, head_dim: None)
    try:
        gaps = paths.flat_vs_alone(family)
    except RuntimeError as refused:  # what the real kernel raises on that device
        assert "no kernel image" in str(refused) or "does not support" in str(refused) or "SM 12.0" in str(refused)
    else:
        assert max(gaps.values()) > 1e-5, gaps
