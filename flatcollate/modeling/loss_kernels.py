"""Fused linear cross-entropy kernels (Cut Cross-Entropy, Liger) where installed, and the choice between them and the
chunked PyTorch path (`flatcollate.modeling.chunked_loss`).

Both kernels are Triton: they run on CUDA tensors only, and take the head as a weight and a bias, so they serve a
plain `torch.nn.Linear` head (tied or not) and nothing wrapped (a LoRA-adapted head goes through the chunked path).
What is installed is read once, from what the packages expose, the first time a fused loss is asked for; tests patch
`installed_kernels`. Neither kernel is bit-exact against the full logits (Cut Cross-Entropy skips gradients below a
threshold by default); the chunked path is, within fp32 summation order.
"""

import functools
import importlib
import importlib.util
from collections.abc import Callable

import torch

BACKENDS = ("auto", "chunked", "cce", "liger")
"""Values of `prepare_model_for_flattening(fused_loss=...)` besides True (`"auto"`) and False."""

KERNELS = {
    "cce": ("cut_cross_entropy", "cut_cross_entropy", "linear_cross_entropy", "cut-cross-entropy"),
    "liger": (
        "liger_kernel",
        "liger_kernel.transformers.functional",
        "liger_fused_linear_cross_entropy",
        "liger-kernel",
    ),
}
"""Kernel name -> (top-level package, module, function, PyPI name); "auto" prefers them in this order (Cut
Cross-Entropy holds less memory: TRL PR #6858 measured 3.09 GB against Liger's 6.05 GB at 16k tokens x 248k)."""


@functools.cache
def installed_kernels() -> dict[str, Callable]:
    """Kernel name -> its function, for the kernels whose package is installed and exposes it."""
    found = {}
    for name, (package, module, function, _) in KERNELS.items():
        if importlib.util.find_spec(package) is None:
            continue
        kernel = getattr(importlib.import_module(module), function, None)
        if kernel is not None:
            found[name] = kernel
    return found


def check_backend(backend: str) -> None:
    """Raise `ValueError` for a `fused_loss` backend that is unknown or not installed."""
    if backend not in BACKENDS:
        raise ValueError(
            f"fused_loss={backend!r} is not a backend; choose True, False or one of {', '.join(BACKENDS)}."
        )
    if backend in KERNELS and backend not in installed_kernels():
        _, module, function, pypi = KERNELS[backend]
        raise ValueError(
            f"fused_loss={backend!r} needs `{module}.{function}`, which is not installed: `pip install {pypi}` (it "
            "runs on CUDA), or pass fused_loss=True (the chunked PyTorch path where no kernel can run)."
        )


def runs_kernels(hidden: torch.Tensor, head: torch.nn.Module) -> bool:
    """Whether a Triton kernel can compute this loss: CUDA hidden states and a plain `Linear` head."""
    return hidden.is_cuda and type(head) is torch.nn.Linear


def kernel_for(backend: str, hidden: torch.Tensor, head: torch.nn.Module) -> str | None:
    """The kernel that computes this loss, or None for the chunked path: `"auto"` takes the first installed kernel
    when `hidden` is on CUDA and `head` a plain `Linear`; a named kernel that cannot run here raises."""
    runs_here = runs_kernels(hidden, head)
    if backend == "auto":
        return next((name for name in KERNELS if name in installed_kernels()), None) if runs_here else None
    if backend in KERNELS and not runs_here:
        raise ValueError(
            f"fused_loss={backend!r} runs on CUDA with a plain `torch.nn.Linear` head; here the hidden states are on "
            f"{hidden.device} and the head is a {type(head).__name__}. Pass fused_loss=True to use the kernel where it "
            "runs and the chunked PyTorch path elsewhere."
        )
    return backend if backend in KERNELS else None


def kernel_cross_entropy(
    name: str, hidden: torch.Tensor, head: torch.nn.Linear, targets: torch.Tensor, *, softcap: float | None
) -> torch.Tensor:
    """The summed cross-entropy of `head(hidden)` against `targets` by kernel `name`, fp32 `()`.

    Args:
        hidden (`torch.Tensor` of shape `(N, H)`), targets (`torch.Tensor` of shape `(N,)`, int64, -100 ignored):
            as for `chunked_cross_entropy`.
    """
    # Both take (input, weight, target) by position and bias, softcap, reduction by keyword.
    loss = installed_kernels()[name](hidden, head.weight, targets, bias=head.bias, softcap=softcap, reduction="sum")
    loss = loss[0] if isinstance(loss, tuple) else loss  # newer Liger returns (loss, z_loss, ...)
    return loss.float()
