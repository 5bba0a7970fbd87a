"""Comparisons of a check are device-safe: the candidate may run on another device than the fp32 CPU reference.

There is no second device on a CPU-only machine, so `Elsewhere` stands in for one: a tensor holding CPU data that
refuses arithmetic with a CPU tensor of one or more dimensions, as a CUDA tensor does ("Expected all tensors to be on
the same device"), until it is brought back with `.cpu()` or `.to("cpu")`.
"""

import pytest
import torch
from torch.utils._pytree import tree_flatten

from flatcollate.check.report import compared, max_grad_diff

TOLERANCES = {"logits_diff": 1e-5, "loss_diff": 1e-5, "grad_diff": 1e-5}


class Elsewhere(torch.Tensor):
    """CPU data on an emulated second device (0-dim CPU tensors mix with it, as they do with CUDA tensors)."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.cpu or (func is torch.Tensor.to and "cpu" in map(str, (*args[1:], *kwargs.values()))):
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **kwargs).as_subclass(torch.Tensor)
        leaves, _ = tree_flatten((args, kwargs))
        here = [t for t in leaves if type(t) is torch.Tensor and t.dim() > 0]
        if here and any(isinstance(t, cls) for t in leaves):
            raise RuntimeError("Expected all tensors to be on the same device, but found at least two devices")
        return super().__torch_function__(func, types, args, kwargs)


def elsewhere(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.as_subclass(Elsewhere)


def test_the_emulated_device_refuses_to_mix_as_cuda_does():  # the stand-in must fail where CUDA fails
    with pytest.raises(RuntimeError, match="same device"):
        elsewhere(torch.ones(3)) - torch.ones(3)
    assert type(elsewhere(torch.ones(3)).cpu()) is torch.Tensor
    assert type(elsewhere(torch.ones(3)).to("cpu", torch.float64)) is torch.Tensor


def _outputs(shift: float = 0.0):
    logits = torch.linspace(-2, 2, 24).reshape(1, 4, 6) + shift
    return logits, logits.mean(), {"w": torch.full((2, 3), 0.5 + shift)}


def test_a_candidate_on_another_device_is_compared_with_the_cpu_reference():
    logits, loss, grads = _outputs()
    run = elsewhere(logits), elsewhere(loss), {n: elsewhere(g) for n, g in grads.items()}
    result = compared("flatcollate", run, _outputs(), TOLERANCES)
    assert result.status == "exact" and result.logits_diff == 0.0 and result.grad_diff == 0.0


def test_a_contaminated_candidate_on_another_device_is_still_caught():  # negative control
    logits, loss, grads = _outputs(shift=1e-3)
    run = elsewhere(logits), elsewhere(loss), {n: elsewhere(g) for n, g in grads.items()}
    result = compared("flatcollate", run, _outputs(), TOLERANCES)
    assert result.status == "contaminated"
    assert result.logits_diff == pytest.approx(1e-3, rel=1e-3) and result.grad_diff == pytest.approx(1e-3, rel=1e-3)


def test_gradients_on_two_devices_are_compared():
    assert max_grad_diff({"w": elsewhere(torch.ones(2))}, {"w": torch.zeros(2), "b": torch.ones(1)}) == 1.0
