"""Kernel detection reads what an installed module exposes: flatcollate imports, prepares and stays exact with
flash-attn 2, 3 or 4 on the path, with none, and with a flash-attn that fails to load.

Each case is a folder of fake packages put first on `sys.path`. A fake kernel computes with the package's reference
(`flatcollate.testing.reference_flash_attn`, fp32 on the CPU); a broken one raises at import as a flash-attn built
against another torch does. Detection runs again for each case (`importlib.reload(capabilities)`: the code that
runs at import); the two cases that crashed `import flatcollate` also run in a fresh interpreter.
"""

import importlib
import itertools
import json
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

from flatcollate import DataCollatorWithFlattening, prepare_model_for_flattening
from flatcollate.attention import capabilities, select_kernel, selection
from flatcollate.testing import tiny_causal_lm


def _kernel(builder: str) -> str:
    return textwrap.dedent(f"""
        def flash_attn_varlen_func(*args, **kwargs):
            import torch
            from flatcollate.testing.reference_flash_attn import {builder}
            from flatcollate.testing.reference_kernels import KernelContract
            contract = KernelContract(dtypes=(torch.float32,), device_type="cpu")
            return {builder}(contract)(*args, **kwargs)
        """)


def _installed(name: str, version: str) -> dict[str, str]:
    """The distribution's metadata, as pip leaves it (transformers reads it before importing a package)."""
    folder = f"{name.replace('-', '_')}-{version}.dist-info"
    return {f"{folder}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"}


UNDEFINED_SYMBOL = 'raise ImportError("flash_attn_2_cuda.so: undefined symbol: _ZN3c104cuda9SetDeviceEi")\n'
FA2, FA3, FA4 = (
    _installed("flash-attn", "2.8.3"),
    _installed("flash-attn-3", "3.0.0"),
    _installed("flash-attn-4", "4.0.0b36"),
)
CASES = {
    "none": {},
    "flash_attn_2": {"flash_attn/__init__.py": _kernel("flash_attn_varlen_func"), **FA2},
    "flash_attn_3": {"flash_attn_interface.py": _kernel("flash_attn_3_varlen_func"), **FA3},
    # flash-attn-4 ships only flash_attn/cute/: `flash_attn` is a namespace package without flash_attn_varlen_func
    "flash_attn_4": {"flash_attn/cute/__init__.py": _kernel("flash_attn_4_varlen_func"), **FA4},
    "broken_flash_attn_2": {"flash_attn/__init__.py": UNDEFINED_SYMBOL, **FA2},
    "flash_attn_4_without_cutlass": {"flash_attn/cute/__init__.py": "import cutlass.cute\n", **FA4},
}
EXPECTED = {  # case -> (the kernel auto picks on a Hopper GPU, the modules reported broken: one warning for all)
    "none": ("torch_varlen", ()),
    "flash_attn_2": ("flash_attn_2", ()),
    "flash_attn_3": ("flash_attn_3", ()),
    "flash_attn_4": ("flash_attn_4", ()),
    "broken_flash_attn_2": ("torch_varlen", ("flash_attn", "flash_attn.cute")),
    "flash_attn_4_without_cutlass": ("torch_varlen", ("flash_attn.cute",)),
}


def write_case(root: Path, case: str) -> Path:
    folder = root / case
    for relative, text in CASES[case].items():
        (folder / relative).parent.mkdir(parents=True, exist_ok=True)
        (folder / relative).write_text(text)
    folder.mkdir(exist_ok=True)
    return folder


def _forget_flash_modules() -> None:
    for name in [n for n in sys.modules if n.split(".")[0] in {"flash_attn", "flash_attn_interface", "cutlass"}]:
        del sys.modules[name]


@pytest.fixture
def detect_with(tmp_path, monkeypatch):
    """`detect_with(case)`: detection re-run with the case's packages first on the path; restored afterwards."""

    def detect(case: str) -> list[warnings.WarningMessage]:
        monkeypatch.syspath_prepend(str(write_case(tmp_path, case)))
        _forget_flash_modules()
        importlib.invalidate_caches()
        capabilities.BROKEN.clear()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            importlib.reload(capabilities)
        return caught

    yield detect
    monkeypatch.undo()
    _forget_flash_modules()
    importlib.invalidate_caches()
    capabilities.BROKEN.clear()
    importlib.reload(capabilities)


def _on_reference_hopper(monkeypatch) -> None:
    monkeypatch.setattr(capabilities, "HAS_CUDA", True)
    monkeypatch.setattr(capabilities, "is_cuda_tensor", lambda tensor: True)
    monkeypatch.setattr(capabilities, "compute_capability", lambda tensor: (9, 0))
    monkeypatch.setattr(selection, "HALF", (*selection.HALF, torch.float32))


@pytest.mark.parametrize("case", CASES)
def test_detection_and_a_prepared_model_stay_exact(detect_with, monkeypatch, case):
    caught = detect_with(case)
    expected_kernel, broken = EXPECTED[case]
    assert tuple(capabilities.BROKEN) == broken
    assert capabilities.HAS_FLEX_FLASH is (case == "flash_attn_4")  # torch 2.10+ flex on the CuTe kernels of FA4
    assert len([w for w in caught if "cannot be imported" in str(w.message)]) == (1 if broken else 0)
    _on_reference_hopper(monkeypatch)
    if capabilities.varlen_attn is not None:  # on CPU torch's varlen_attn cannot run: its reference stands in
        from flatcollate.testing.reference_kernels import KernelContract, varlen_attn_like

        contract = KernelContract(dtypes=(torch.float32,), device_type="cpu")
        monkeypatch.setattr(capabilities, "varlen_attn", varlen_attn_like(capabilities.varlen_attn)(contract))
    assert select_kernel(torch.zeros(4, 2, 32), softcap=None, dropout=0.0) == expected_kernel

    generator = torch.Generator().manual_seed(0)
    features = [{"input_ids": torch.randint(0, 256, (n,), generator=generator).tolist()} for n in (7, 1, 12)]
    batch = DataCollatorWithFlattening()(features)
    sizes = {"num_key_value_heads": 1, "head_dim": 32}  # a head dim every kernel trains (FA4: multiples of 32)
    model = prepare_model_for_flattening(tiny_causal_lm("qwen2", **sizes))
    alone = tiny_causal_lm("qwen2", **sizes, attn_implementation="eager")
    flat_logits = model(**batch).logits
    bounds = itertools.pairwise(batch["cu_seq_lens_q"].tolist())
    alone_logits = torch.cat([alone(input_ids=batch["input_ids"][:, a:b]).logits for a, b in bounds], dim=1)
    assert (flat_logits - alone_logits).abs().max() <= 1e-5


def test_a_namespace_flash_attn_is_not_flash_attn_2(detect_with):
    detect_with("flash_attn_4")
    assert importlib.import_module("flash_attn").__file__ is None  # the namespace package is there ...
    assert capabilities.flash_attn_varlen_func is None  # ... without a kernel: not FA2
    assert capabilities.flash_attn_4_varlen_func is not None


SCRIPT = """
import json, warnings
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    from flatcollate import prepare_model_for_flattening
    from flatcollate.attention import capabilities
    from flatcollate.testing import tiny_causal_lm
prepare_model_for_flattening(tiny_causal_lm("llama"))
print(json.dumps({"detected": capabilities.detected(), "warnings": [str(w.message) for w in caught]}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("case", ["flash_attn_4", "broken_flash_attn_2"])
def test_a_fresh_interpreter_imports_and_prepares(tmp_path, case):
    folder = write_case(tmp_path, case)
    env_path = f"{folder}:{Path(__file__).resolve().parents[2]}"
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, env={"PYTHONPATH": env_path}, check=False
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    if case == "flash_attn_4":
        assert report["detected"]["flash_attn_4"] == "flash_attn.cute" and report["detected"]["flash_attn_2"] is None
        assert report["warnings"] == []
    else:
        assert report["detected"]["broken"]["flash_attn"] == UNDEFINED_SYMBOL.split('"')[1]
        assert [w for w in report["warnings"] if "cannot be imported" in w] != []


def test_the_hub_kernel_is_read_from_what_transformers_loaded(monkeypatch):
    """transformers keeps the flash implementation it loaded in module globals; a Hub kernel there is dispatched."""
    from transformers import modeling_flash_attention_utils as loaded

    from flatcollate.testing.reference_flash_attn import flash_attn_3_varlen_func

    hub = flash_attn_3_varlen_func()
    monkeypatch.setattr(loaded, "_loaded_implementation", "kernels-community/vllm-flash-attn3", raising=False)
    monkeypatch.setattr(loaded, "_flash_varlen_fn", hub, raising=False)
    assert capabilities.transformers_varlen() == ("kernels-community/vllm-flash-attn3", hub)
    _on_reference_hopper(monkeypatch)
    for attribute in ("flash_attn_varlen_func", "flash_attn_3_varlen_func", "flash_attn_4_varlen_func"):
        monkeypatch.setattr(capabilities, attribute, None)
    assert select_kernel(torch.zeros(4, 2, 16, dtype=torch.bfloat16), softcap=None, dropout=0.0) == "hub"
    assert select_kernel(torch.zeros(4, 2, 16, dtype=torch.bfloat16), softcap=None, dropout=0.1) != "hub"  # FA3 kind
    monkeypatch.setattr(loaded, "_loaded_implementation", "flash_attention_2")  # a local package: detected directly
    assert capabilities.transformers_varlen() is None


def test_the_compute_capability_is_asked_once_per_device(monkeypatch):
    """The one CUDA query of dispatch, run here with torch's answer stood in for (no GPU on this machine)."""
    asked = []
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: asked.append(index) or (9, 0))
    capabilities._capability.cache_clear()
    try:
        tensor = torch.zeros(1, device="meta")
        assert capabilities.compute_capability(tensor) == capabilities.compute_capability(tensor) == (9, 0)
        assert asked == [None]  # cached: not once per layer and forward
    finally:
        capabilities._capability.cache_clear()
