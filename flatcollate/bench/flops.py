"""Model FLOPs of a training step and model FLOPs utilisation (MFU): the useful work of a step over the device's peak.

The FLOPs counted are those the sequences themselves need, whatever the batch layout: a padded batch computes on its
padding too, but that work is not counted, so MFU compares layouts on the same useful work (its ratio between modes
is their throughput ratio). For a dense decoder, per optimizer step (forward and backward: three times the forward):

    linear layers   6 * (parameters of every nn.Linear, the LM head included) * real tokens
    attention       6 * layers * heads * head_dim * sum over sequences of L**2      (QK^T and AV, causal: half of
                                                                                     2 * 2 * L**2 * heads * head_dim)

Embedding lookups, norms, activations and the loss are left out (a few percent at most). A mixture-of-experts layer
is counted with all its experts, so its MFU is underestimated.
"""

import re

import torch

PEAK_TFLOPS = {
    # dense fp16/bf16 tensor-core peak (TFLOP/s) by device name, most specific first
    r"H100.*PCIe": 756.0,
    r"H100|H200|GH200": 989.4,
    r"B200|GB200": 2250.0,
    r"A100": 312.0,
    r"L40S": 362.1,
    r"A10G|A10\b": 125.0,
    r"L4\b": 121.0,
}
"""Peak dense fp16/bf16 TFLOP/s of GPUs by name (the vendors' datasheet figures without sparsity)."""


def peak_flops(device_name: str, dtype: str) -> float | None:
    """Peak FLOP/s of `device_name` for `dtype`, or None where it is not known (CPUs, fp32, unlisted GPUs).

    >>> peak_flops("NVIDIA H100 80GB HBM3", "bfloat16")
    989400000000000.0
    >>> peak_flops("NVIDIA H100 80GB HBM3", "float32") is None, peak_flops("AMD EPYC 7B13", "bfloat16") is None
    (True, True)
    """
    if dtype not in ("bfloat16", "float16"):
        return None
    for pattern, tflops in PEAK_TFLOPS.items():
        if re.search(pattern, device_name):
            return tflops * 1e12
    return None


def linear_parameters(model: torch.nn.Module) -> int:
    """Parameters of every `nn.Linear` of `model` (weights and biases), the LM head included even when tied."""
    return sum(p.numel() for m in model.modules() if isinstance(m, torch.nn.Linear) for p in m.parameters())


def attention_width(config) -> tuple[int, int]:
    """`(layers, heads * head_dim)` of the text model of `config`; width 0 for a model without attention heads (Mamba:
    its layers count as their linear layers).

    >>> from flatcollate.testing import tiny_config
    >>> attention_width(tiny_config("mamba2"))[1]
    0
    """
    text = config.get_text_config()
    heads = getattr(text, "num_attention_heads", None)
    if not heads:
        return text.num_hidden_layers, 0
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    return text.num_hidden_layers, heads * head_dim


def training_flops(linear: int, layers: int, width: int, lengths) -> float:
    """Model FLOPs of one forward and backward over sequences of `lengths` (the table in the module docstring).

    >>> training_flops(linear=1000, layers=2, width=8, lengths=[3, 1])  # 6*1000*4 + 6*2*8*(9+1)
    24960.0
    """
    lengths = [int(n) for n in lengths]
    return 6.0 * linear * sum(lengths) + 6.0 * layers * width * sum(n * n for n in lengths)


def step_flops(model: torch.nn.Module, *, trained=(), scored=()) -> float:
    """Model FLOPs of a step of `model` (its text model's width and depth, every `nn.Linear`) that trains on sequences
    of lengths `trained` (forward and backward) and scores sequences of lengths `scored` (a forward without
    gradients: a third of a forward and backward), e.g. DPO's reference pass.

    >>> from flatcollate.testing import tiny_causal_lm
    >>> model = tiny_causal_lm("llama")
    >>> step_flops(model, trained=[3, 1], scored=[3, 1]) == 4 / 3 * step_flops(model, trained=[3, 1])
    True
    """
    layers, width = attention_width(model.config)
    linear = linear_parameters(model)
    return training_flops(linear, layers, width, trained) + training_flops(linear, layers, width, scored) / 3


def mfu(flops: float, seconds: float, peak: float | None) -> float | None:
    """Model FLOPs utilisation: `flops` done in `seconds` over the `peak` FLOP/s (None without a peak).

    >>> mfu(4e14, 1.0, 1e15)
    0.4
    """
    return None if peak is None or seconds <= 0 else flops / seconds / peak
