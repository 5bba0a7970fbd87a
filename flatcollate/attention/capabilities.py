"""Optional kernels for packed rows, detected once at import.

Every flag here is read by `flatcollate.attention.dispatch` at call time through this module, so tests can switch a
capability on or off with `monkeypatch.setattr(capabilities, "HAS_FLASH_ATTN", ...)` without touching the kernels.
"""

import importlib.util
import inspect

import torch

HAS_FLASH_ATTN: bool = importlib.util.find_spec("flash_attn") is not None
"""flash-attn (FA2) is installed; its varlen kernel needs CUDA tensors in fp16/bf16."""

flash_attn_varlen_func = importlib.import_module("flash_attn").flash_attn_varlen_func if HAS_FLASH_ATTN else None


def _varlen_attn():
    """PyTorch's built-in varlen kernel when its signature is the one this module calls (`window_size=`, 2.13)."""
    if importlib.util.find_spec("torch.nn.attention.varlen") is None:
        return None
    from torch.nn.attention.varlen import varlen_attn

    parameters = inspect.signature(varlen_attn).parameters
    return varlen_attn if {"window_size", "scale", "enable_gqa"} <= parameters.keys() else None


varlen_attn = _varlen_attn()
HAS_TORCH_VARLEN: bool = varlen_attn is not None
"""`torch.nn.attention.varlen.varlen_attn` with `window_size`/`scale`/`enable_gqa` (CUDA, fp16/bf16 only)."""

HAS_FLEX_ATTENTION: bool = importlib.util.find_spec("torch.nn.attention.flex_attention") is not None
"""`flex_attention` with block masks; trains on CUDA, forward only on CPU."""

HAS_CUDA: bool = torch.cuda.is_available()
"""A CUDA device is visible to this process."""


def is_cuda_tensor(tensor: torch.Tensor) -> bool:
    """Whether `tensor` lives on a CUDA device (the one place dispatch asks; tests patch it to reach CUDA paths)."""
    return tensor.is_cuda
