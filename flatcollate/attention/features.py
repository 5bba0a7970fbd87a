"""What each packed kernel computes besides causal attention with sliding windows, a custom scale and GQA: the one
table both `selection` (which kernel `auto` picks) and the kernels themselves (which refuse what they cannot do) read.
"""

import functools
import math
import warnings

from . import capabilities

FEATURES: dict[str, frozenset[str]] = {
    "flash_attn_4": frozenset({"softcap", "sinks"}),
    "flash_attn_3": frozenset({"softcap"}),
    "flash_attn_2": frozenset({"dropout", "softcap"}),
    "torch_varlen": frozenset(),
    "flex": frozenset({"softcap"}),
    "sdpa": frozenset({"dropout", "softcap", "sinks"}),
}
"""Optional features per kernel; `hub` has those its signature has (`hub_features`)."""

WORDS = {"dropout": "dropout", "softcap": "soft-capping", "sinks": "attention sinks"}


def hub_features(function) -> frozenset[str]:
    """The features of a Hub varlen function, read off its parameters: `dropout_p`, `softcap`, and sinks as FA4's
    `learnable_sink` or vLLM's FA3 `s_aux`.

    >>> sorted(hub_features(lambda q, k, v, dropout_p=0.0, softcap=0.0: q))
    ['dropout', 'softcap']
    """
    accepted = capabilities.parameters(function)
    found = {"dropout": "dropout_p" in accepted, "softcap": "softcap" in accepted}
    found["sinks"] = bool({"learnable_sink", "s_aux"} & accepted)
    return frozenset(name for name, present in found.items() if present)


def features(name: str) -> frozenset[str]:
    """The optional features kernel `name` computes (`hub`: the Hub kernel transformers loaded, if any)."""
    if name == "hub":
        resolved = capabilities.transformers_varlen()
        return frozenset() if resolved is None else hub_features(resolved[1])
    function = capabilities.flash_attn_3_varlen_func
    if name == "flash_attn_3" and function is not None and not capabilities.takes(function, "softcap"):
        return FEATURES[name] - {"softcap"}  # builds before 2025-01
    return FEATURES[name]


@functools.cache
def _warn_older_build(name: str, missing: tuple[str, ...]) -> None:
    """Warn once that the installed `name` (flash-attn 3, the one kernel whose features depend on its build) lacks
    `missing`; the version is looked up here, once, not on every layer's selection."""
    version = capabilities.installed_version(capabilities.flash_attn_3_varlen_func)
    warnings.warn(
        f"The installed `{name}` ({version}) has no {' or '.join(missing)}: such layers run on the next kernel. "
        f"Update it to run them on `{name}`.",
        RuntimeWarning,
        stacklevel=4,
    )


def lacking(name: str, *, dropout: float, softcap: float | None, sinks: bool) -> list[str]:
    """What a layer asks for (`dropout > 0`, a `softcap`, `sinks`) that kernel `name` does not compute, in words.

    >>> lacking("flash_attn_3", dropout=0.1, softcap=30.0, sinks=True)
    ['dropout', 'attention sinks']
    """
    asked = {"dropout": bool(dropout), "softcap": softcap is not None, "sinks": sinks}
    have = features(name)
    missing = [feature for feature, on in asked.items() if on and feature not in have]
    older = [feature for feature in missing if feature in FEATURES.get(name, frozenset())]  # this build lacks it
    if older:
        _warn_older_build(name, tuple(WORDS[f] for f in older))
    return [WORDS[feature] for feature in missing]


def refuse_unless_computed(name: str, *, dropout: float, softcap: float | None, sinks) -> None:
    """Raise `ValueError` when kernel `name`, forced with `backend=`, cannot compute the layer (`sinks`: the tensor or
    None, as the kernels get it)."""
    missing = lacking(name, dropout=dropout, softcap=softcap, sinks=sinks is not None)
    if missing:
        raise ValueError(
            f"The `{name}` packed kernel has no {' or '.join(missing)}; leave `backend='auto'` (it picks a kernel "
            "that computes the layer) or force `backend='sdpa'`, which computes everything."
        )


def wrong_gradients(name: str, head_dim: int) -> str | None:
    """Why kernel `name` runs a layer of head dim `head_dim` but trains it wrong, in words, or None.

    flash-attn-4's backward accumulates the query gradient in blocks of 32 head dims (`head_dim_rounded` in
    `flash_attn/cute/interface.py`) and writes a wrong dq at other head dims, raising nothing: 4.0.0b36 on an NVIDIA
    H200 was off by 2.4 at head dim 16 and 2.8 at 48, and exact at 32, 64, 96 and 128
    (`tests/attention/test_reference_kernels.py::test_real_flash_attn_4_matches_the_reference`).

    >>> wrong_gradients("flash_attn_4", 16), wrong_gradients("flash_attn_4", 64), wrong_gradients("flash_attn_2", 16)
    ('writes wrong query gradients at head dim 16 (not a multiple of 32)', None, None)
    """
    if name == "flash_attn_4" and head_dim % 32:
        return f"writes wrong query gradients at head dim {head_dim} (not a multiple of 32)"
    return None


def is_default_scale(scale: float | None, head_dim: int) -> bool:
    """Whether `scale` is `head_dim ** -0.5` (or unset): all a kernel without a `scale` parameter computes.

    >>> is_default_scale(None, 64), is_default_scale(0.125, 64), is_default_scale(0.2, 64)
    (True, True, False)
    """
    return scale is None or math.isclose(scale, head_dim**-0.5, rel_tol=1e-6)
