"""Optional kernels for packed rows, detected once at import by what each installed module exposes.

A module counts only if it imports and has the function flatcollate calls: `flash-attn-4` alone makes `flash_attn` a
namespace package without `flash_attn_varlen_func`, so finding the package proves nothing. A module that is
installed but fails to load (an extension built against another torch: `undefined symbol`) is reported in one
warning and left out; flatcollate then runs without it, as transformers and TRL do.

Every name here is read by `flatcollate.attention.dispatch` at call time through this module, so tests switch a kernel
on or off with `monkeypatch.setattr(capabilities, "flash_attn_3_varlen_func", reference)` without touching the
kernels. A kernel function is `None` where it is not available.
"""

import functools
import importlib
import importlib.metadata
import inspect
import typing
import warnings
from collections.abc import Callable

import torch

BROKEN: dict[str, str] = {}
"""`{module: first line of its import error}` for installed modules that failed to load."""


def exposed(module: str, attribute: str) -> Callable | None:
    """`module.attribute` when the installed module imports and exposes it, else None.

    A missing module (or a missing parent package) is simply absent. A module that is installed but raises while
    loading, or misses one of its own dependencies, is recorded in `BROKEN` and warned about once.

    >>> exposed("math", "sqrt").__name__
    'sqrt'
    >>> exposed("math", "no_such_function") is None, exposed("no_such_module.sub", "f") is None
    (True, True)
    """
    try:
        loaded = importlib.import_module(module)
    except ModuleNotFoundError as error:
        if error.name is not None and (module == error.name or module.startswith(error.name + ".")):
            return None  # not installed
        _broken(module, error)
        return None
    except (ImportError, OSError) as error:  # an extension built against another torch or CUDA
        _broken(module, error)
        return None
    return getattr(loaded, attribute, None)


def _broken(module: str, error: BaseException) -> None:
    reason = (str(error).splitlines() or [type(error).__name__])[0]
    seen = reason in BROKEN.values()  # `flash_attn` and `flash_attn.cute` can fail for one cause: one warning
    BROKEN[module] = reason
    if seen:
        return
    warnings.warn(
        f"`{module}` is installed but cannot be imported ({type(error).__name__}: {reason}); flatcollate runs without "
        f"it. Reinstall it for torch {torch.__version__} (or uninstall it) to use its kernel.",
        RuntimeWarning,
        stacklevel=3,
    )


flash_attn_varlen_func = exposed("flash_attn", "flash_attn_varlen_func")
"""FA2 (`pip install flash-attn`): `(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
softmax_scale, causal, window_size, softcap, ...)`, returns the output."""

flash_attn_3_varlen_func = exposed("flash_attn_interface", "flash_attn_varlen_func")
"""FA3 (flash-attention's `hopper/` build): no dropout, returns the output (`(out, lse)` if asked)."""

flash_attn_4_varlen_func = exposed("flash_attn.cute", "flash_attn_varlen_func")
"""FA4 (`pip install flash-attn-4`, CuTe DSL): windows as `(left or None, right or None)`, attention sinks as
`learnable_sink`, returns `(out, lse)`."""


varlen_attn = exposed("torch.nn.attention.varlen", "varlen_attn")
"""`torch.nn.attention.varlen.varlen_attn` (CUDA, fp16/bf16, no softcap, no dropout). Its signature changed:
2.10 `is_causal` (scale fixed at `D ** -0.5`, no windows), 2.11 keyword-only `scale` and `window_size`, 2.12
`enable_gqa` (before it, the kernel took fewer key/value heads without being asked)."""


@functools.lru_cache(maxsize=64)  # dispatch asks once per layer and forward; a signature does not change
@functools.lru_cache(maxsize=64)  # read once per function: dispatch asks on every layer's call
def parameters(function: Callable | None) -> frozenset[str]:
    """Names of `function`'s parameters (empty for None): how a kernel is called depends on its version.

    >>> sorted(parameters(lambda q, k, *, scale=None: q))
    ['k', 'q', 'scale']
    """
    return frozenset() if function is None else frozenset(inspect.signature(function).parameters)


def installed_version(function: Callable) -> str:
    """The distribution and version `function`'s module was installed from (`flash-attn-3 3.0.0b1`), or what is known
    of it (`flash_attn_interface, version unknown`) for a module no installed distribution lists.

    >>> installed_version(importlib.import_module("torch").zeros).startswith("torch ")
    True
    """
    top = function.__module__.partition(".")[0]
    for distribution in importlib.metadata.packages_distributions().get(top, []):
        return f"{distribution} {importlib.metadata.version(distribution)}"
    return f"{function.__module__}, version unknown"


@functools.lru_cache(maxsize=64)
def takes(function: Callable, name: str) -> bool:
    """Whether `function` can be called with keyword `name` (a parameter of that name, or `**kwargs`).

    >>> takes(lambda q, *, scale=None: q, "scale"), takes(lambda q: q, "scale"), takes(lambda **kw: 0, "scale")
    (True, False, True)
    """
    accepted = inspect.signature(function).parameters
    return name in accepted or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values())


def _flex_backends() -> tuple[str, ...]:
    flex_module = importlib.import_module("torch.nn.attention.flex_attention")
    return typing.get_args(getattr(flex_module, "_Backend", None)) or ()


HAS_FLEX_ATTENTION: bool = exposed("torch.nn.attention.flex_attention", "flex_attention") is not None
"""`flex_attention` with block masks; trains on CUDA, forward only on CPU."""

HAS_FLEX_FLASH: bool = HAS_FLEX_ATTENTION and "FLASH" in _flex_backends() and flash_attn_4_varlen_func is not None
"""Compiled `flex_attention` can run on FA4's CuTe kernels (`kernel_options={"BACKEND": "FLASH"}`, torch 2.10+ with
flash-attn-4 importable)."""

HAS_CUDA: bool = torch.cuda.is_available()
"""A CUDA device is visible to this process."""


def transformers_varlen() -> tuple[str, Callable] | None:
    """The varlen function transformers resolved from the Hub for a model (`attn_implementation=
    "kernels-community/flash-attn3"`, or `flash_attention_3` without a local build), with that implementation's name.

    transformers keeps one loaded flash implementation per process (`modeling_flash_attention_utils`); local
    packages (`flash_attn`, `flash_attn_interface`, `flash_attn.cute`) are detected above, so only a Hub kernel
    (a name with a `/`) is returned here.
    """
    from transformers import modeling_flash_attention_utils as loaded

    name = getattr(loaded, "_loaded_implementation", None)
    function = getattr(loaded, "_flash_varlen_fn", None)
    if not isinstance(name, str) or "/" not in name or function is None:
        return None
    return name, function


def is_cuda_tensor(tensor: torch.Tensor) -> bool:
    """Whether `tensor` lives on a CUDA device (the one place dispatch asks; tests patch it to reach CUDA paths)."""
    return tensor.is_cuda


def compute_capability(tensor: torch.Tensor) -> tuple[int, int]:
    """`(major, minor)` of the CUDA device of `tensor` (8 Ampere, 9 Hopper, 10 Blackwell); tests patch it."""
    return _capability(tensor.device.index)


@functools.lru_cache(maxsize=16)
def _capability(index: int | None) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def shared_memory_per_block(tensor: torch.Tensor) -> int:
    """Bytes of shared memory a block of the CUDA device of `tensor` may opt into (164 KB on an A100, 99 KB on
    sm86/sm89/sm120, 227 KB on H100 and B200): what flash-attn 2 picks its backward kernels by; tests patch it."""
    return _shared_memory(tensor.device.index)


@functools.lru_cache(maxsize=16)
def _shared_memory(index: int | None) -> int:
    return torch.cuda.get_device_properties(index).shared_memory_per_block_optin


def detected() -> dict[str, object]:
    """What this process can run, for reports: each varlen library (the module its function comes from, or None),
    the Hub kernel transformers loaded, the optional parameters of `varlen_attn`, flex's FLASH backend, CUDA, and the
    modules that failed to load.

    >>> sorted(detected())
    ['broken', 'cuda', 'flash_attn_2', 'flash_attn_3', 'flash_attn_4', 'flex_flash', 'hub', 'torch_varlen']
    """
    hub = transformers_varlen()
    functions = {
        "flash_attn_2": flash_attn_varlen_func,
        "flash_attn_3": flash_attn_3_varlen_func,
        "flash_attn_4": flash_attn_4_varlen_func,
    }
    optional = sorted(parameters(varlen_attn) & {"scale", "window_size", "enable_gqa", "is_causal"})
    return {
        **{name: None if f is None else getattr(f, "__module__", "?") for name, f in functions.items()},
        "hub": None if hub is None else hub[0],
        "torch_varlen": None if varlen_attn is None else f"varlen_attn({', '.join(optional)})",
        "flex_flash": HAS_FLEX_FLASH,
        "cuda": HAS_CUDA,
        "broken": dict(BROKEN),
    }
