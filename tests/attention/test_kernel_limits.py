"""Limits of the real kernels that their signatures do not show, on simulated devices: `auto` passes a kernel over
where the real one would refuse the layer or compute it wrong, and takes the next one.

Each case is read from the kernel's source (flash-attention at 0251105a: `csrc/flash_attn/flash_api.cpp`,
`csrc/flash_attn/src/flash_bwd_launch_template.h`, `hopper/setup.py`, `flash_attn/cute/interface.py`); the table is
in `flatcollate.attention.selection` and docs/attention.md.
"""

import pytest
import torch

from flatcollate.attention import capabilities, select_kernel

from .test_dispatch import fake_cuda, without  # noqa: F401  (the fixture: every kernel installed, a recorder)

pytestmark = pytest.mark.usefixtures("fake_cuda")

# compute capability, and shared memory per block (opt-in) in KB as the CUDA programming guide lists it
SM = {
    "A100": ((8, 0), 163),
    "RTX 3090": ((8, 6), 99),
    "L40S": ((8, 9), 99),
    "H100": ((9, 0), 227),
    "B200": ((10, 0), 227),
    "RTX 5090": ((12, 0), 99),
}


def on(monkeypatch, gpu: str) -> None:
    capability, shared_kb = SM[gpu]
    monkeypatch.setattr(capabilities, "compute_capability", lambda tensor: capability)
    monkeypatch.setattr(capabilities, "shared_memory_per_block", lambda tensor: shared_kb * 1024)


def pick(head_dim=128, value_head_dim=None, **options):
    query = torch.zeros(4, 2, head_dim, dtype=torch.bfloat16)
    options = {"softcap": None, "dropout": 0.0} | options
    if value_head_dim is not None:
        options["value_head_dim"] = value_head_dim
    return select_kernel(query, **options)


@pytest.mark.parametrize("gpu", ["RTX 3090", "L40S", "RTX 5090"])
def test_fa2_is_passed_over_for_dropout_at_head_dims_over_192_with_under_144_kb_of_shared_memory(monkeypatch, gpu):
    """`run_mha_bwd_hdim256` launches no backward kernel with dropout below 144 KB per block: gradients unwritten."""
    on(monkeypatch, gpu)
    without(monkeypatch, "flash_attn_4")
    assert pick(head_dim=256, dropout=0.1) == "sdpa"
    assert pick(head_dim=192, dropout=0.1) == "flash_attn_2"  # the hdim192 kernel has its own launch
    assert pick(head_dim=256) != "sdpa"


@pytest.mark.parametrize("gpu", ["A100", "H100"])
def test_fa2_keeps_dropout_at_head_dim_256_with_enough_shared_memory(monkeypatch, gpu):
    on(monkeypatch, gpu)
    assert pick(head_dim=256, dropout=0.1) == "flash_attn_2"


def test_fa2_is_passed_over_for_soft_capping_with_dropout():
    """`flash_api.cpp`: "Softcapping does not support dropout for now"."""
    assert pick(softcap=30.0) == "flash_attn_3"
    assert pick(dropout=0.1) == "flash_attn_2"
    assert pick(softcap=30.0, dropout=0.1) == "sdpa"


def test_fa4_at_head_dim_256_on_sm100_is_passed_over_for_softcap_sinks_and_windows(monkeypatch):
    on(monkeypatch, "B200")
    without(monkeypatch, "flash_attn_3")
    assert pick(head_dim=256) == "flash_attn_4"
    assert pick(head_dim=256, softcap=30.0) == "flash_attn_2"
    assert pick(head_dim=256, window=64) == "flash_attn_2"
    assert pick(head_dim=256, sinks=True) == "sdpa"
    assert pick(head_dim=128, softcap=30.0, window=64, sinks=True) == "flash_attn_4"


def test_fa4_is_passed_over_for_sinks_on_sm120(monkeypatch):
    """FA4's sm120 kernel refuses `learnable_sink`; its sink backward covers sm90-sm110."""
    on(monkeypatch, "RTX 5090")
    assert pick(sinks=True) == "sdpa"
    assert pick() == "flash_attn_4"


@pytest.mark.parametrize("gpu", ["B200", "RTX 5090"])
def test_fa3_is_never_taken_off_ampere_and_hopper(monkeypatch, gpu):
    """`hopper/setup.py` builds sm_90a and sm_80 code only: on Blackwell the kernel fails to launch."""
    on(monkeypatch, gpu)
    assert pick(head_dim=192) == "flash_attn_2"  # FA4 refuses 192 on sm 10+, FA3 cannot run there
    without(monkeypatch, "flash_attn_4")
    assert pick() == "flash_attn_2"


@pytest.mark.parametrize(
    ("gpu", "expected"),
    [("H100", "flash_attn_3"), ("A100", "flex"), ("B200", "flash_attn_4"), ("RTX 5090", "flash_attn_4")],
)
def test_a_value_head_dim_other_than_the_querys_goes_where_it_is_computed(monkeypatch, gpu, expected):
    """Multi-head latent attention (DeepSeek V2/V3: query 192, value 128): FA2 and `varlen_attn` need equal head
    dims, FA3 takes them on Hopper only, FA4 on sm90 and as (192, 128) on sm100 and sm120."""
    on(monkeypatch, gpu)
    assert pick(head_dim=192, value_head_dim=128) == expected
    assert pick(head_dim=192, value_head_dim=192) != "flex"


def test_a_kernel_forced_onto_a_layer_it_refuses_names_the_rule_and_the_kernels_that_take_it(monkeypatch):
    from flatcollate.attention import packed_attention_forward

    from .test_dispatch import layer_inputs

    q, k, v, kwargs = layer_inputs()
    call = {"scaling": None, "dropout": 0.1, "softcap": 20.0, **kwargs}
    message = "`flash_attn_2` has no soft-capping together with dropout. Kernels that can, fastest first: sdpa"
    with pytest.raises(ValueError, match=message):
        packed_attention_forward(torch.nn.Module(), q, k, v, None, backend="flash_attn_2", **call)
    on(monkeypatch, "B200")
    refused = r"`flash_attn_3` has no kernel for sm 10 .* fastest first: flash_attn_2, "  # FA4 refuses head dim 16
    with pytest.raises(ValueError, match=refused):
        packed_attention_forward(torch.nn.Module(), q, k, v, None, backend="flash_attn_3", **kwargs)
