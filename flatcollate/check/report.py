"""What a check reports: one verdict per backend (`BackendResult`) and the report of a model (`CheckReport`)."""

from dataclasses import asdict, dataclass, field

import torch


@dataclass(frozen=True)
class BackendResult:
    """One backend's verdict: `exact`, `contaminated`, `unverified` or `unsupported` (with `reason`), and the
    measured gaps."""

    backend: str
    status: str
    logits_diff: float | None = None
    loss_diff: float | None = None
    grad_diff: float | None = None
    reason: str | None = None


@dataclass(frozen=True)
class CheckReport:
    """Results of `check_model` for one model; `passed` when every requested backend is exact."""

    model_type: str
    lengths: tuple[int, ...]
    tolerance: float
    results: list[BackendResult] = field(default_factory=list)
    exercised: dict = field(default_factory=dict)
    overrides: dict = field(default_factory=dict)
    tolerances: dict = field(default_factory=dict)
    device: str = "cpu"
    dtype: str = "float32"

    @property
    def passed(self) -> bool:
        return all(result.status == "exact" for result in self.results)

    def to_dict(self) -> dict:
        return {**asdict(self), "passed": self.passed}

    def to_markdown(self) -> str:
        """A table, one row per backend."""
        if len(set(self.tolerances.values())) > 1:
            tolerance = ", ".join(f"{k.removesuffix('_diff')} {v:.1e}" for k, v in self.tolerances.items())
            low = (self.device, self.dtype) != ("cpu", "float32")
            source = f"the {self.dtype} per-sequence run's own error" if low else "float32 resolution at each size"
            tolerance += f" (from {source})"
        else:
            tolerance = f"{self.tolerance:g}"
        where = f"{self.dtype} on {self.device}"
        rows = [f"{self.model_type} (lengths {list(self.lengths)}, {where}, tolerance {tolerance})", ""]
        rows += [
            "| backend | status | max logit diff | loss diff | max grad diff | reason |",
            "|---|---|---|---|---|---|",
        ]
        for r in self.results:
            cells = [_fmt(r.logits_diff), _fmt(r.loss_diff), _fmt(r.grad_diff)]
            rows.append(f"| {r.backend} | {r.status} | " + " | ".join(cells) + f" | {r.reason or ''} |")
        if self.exercised:
            rows += ["", "What the check exercised:"]
            rows += [f"- {mechanism}: {what}" for mechanism, what in self.exercised.items()]
        return "\n".join(rows)


def _fmt(value: float | None) -> str:
    return "" if value is None else f"{value:.2e}"


def on_host(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` as float64 on the CPU: every comparison of a check runs there, so a candidate on a GPU (in any dtype)
    meets the fp32 CPU reference without mixing devices, and the difference itself adds no rounding."""
    return tensor.detach().to("cpu", torch.float64)


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest absolute difference of two tensors of one shape, wherever each lives.

    >>> max_diff(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.5], dtype=torch.bfloat16))
    0.5
    """
    return (on_host(a) - on_host(b)).abs().max().item()


def max_grad_diff(a: dict, b: dict) -> float:
    """Largest absolute difference between two `{name: gradient}` dicts; a gradient one side lacks counts as zero."""
    names = a.keys() | b.keys()
    zero = torch.zeros(())
    return max(max_diff(a.get(n, zero), b.get(n, zero)) for n in names) if names else 0.0


def compared(backend: str, run: tuple, reference: tuple, tolerances: dict[str, float]) -> BackendResult:
    """A backend's `(logits, loss, grads)` against the reference's: exact when every gap is within its tolerance.
    The run may live on another device and dtype than the reference (`on_host`)."""
    (logits, loss, grads), (ref_logits, ref_loss, ref_grads) = run, reference
    diffs = {
        "logits_diff": max_diff(logits, ref_logits),
        "loss_diff": max_diff(loss, ref_loss),
        "grad_diff": max_grad_diff(grads, ref_grads),
    }
    exact = all(value <= tolerances[name] for name, value in diffs.items())
    return BackendResult(backend=backend, status="exact" if exact else "contaminated", **diffs)
