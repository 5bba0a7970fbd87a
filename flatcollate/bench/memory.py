"""Peak memory of one benchmark phase: the CUDA allocator's peak on a GPU, the process RSS high-water mark on a CPU.

On Linux the RSS high-water mark (`VmHWM` in `/proc/self/status`) can be reset by writing `5` to
`/proc/self/clear_refs`, so each phase gets its own peak; where that file cannot be written the peak is reported as
`None` rather than a figure that mixes phases. Memory freed by an earlier phase but kept by the C allocator would
hide this phase's growth, so with glibc `malloc_trim(0)` hands it back to the system before the reset.
"""

import ctypes
import ctypes.util
from pathlib import Path

import torch

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _can_reset_rss_peak() -> bool:
    """Whether this process may reset its own RSS high-water mark (Linux with a writable `clear_refs`)."""
    if not (_STATUS.is_file() and _CLEAR_REFS.is_file()):
        return False
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return True


CAN_RESET_RSS_PEAK: bool = _can_reset_rss_peak()
"""Detected once at import."""


def _malloc_trim():
    """glibc's `malloc_trim`, or `None` on other C libraries."""
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    return getattr(libc, "malloc_trim", None)


MALLOC_TRIM = _malloc_trim() if CAN_RESET_RSS_PEAK else None
"""Detected once at import."""


class PeakMemory:
    """`reset()` before a phase, `peak()` after it.

    >>> meter = PeakMemory(torch.device("cpu"))
    >>> meter.reset()
    >>> peak = meter.peak()
    >>> peak is None or peak > 0
    True
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.baseline: int | None = None
        """Bytes in use when `reset()` ran (allocated on CUDA, resident on CPU): `peak() - baseline` is what the
        phase itself added."""

    def reset(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.baseline = int(torch.cuda.memory_allocated(self.device))
        elif CAN_RESET_RSS_PEAK:
            if MALLOC_TRIM is not None:
                MALLOC_TRIM(0)
            _CLEAR_REFS.write_text("5")
            self.baseline = _status_bytes("VmRSS:")

    def peak(self) -> int | None:
        """Bytes: allocator peak on CUDA, RSS high-water on CPU, `None` where a per-phase peak is not measurable."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            return int(torch.cuda.max_memory_allocated(self.device))
        return _status_bytes("VmHWM:") if CAN_RESET_RSS_PEAK else None

    def figures(self) -> dict[str, int | None]:
        """`peak_memory_bytes` since `reset()` and `added_memory_bytes`, the peak over the baseline (None where not
        measurable)."""
        peak = self.peak()
        added = None if peak is None or self.baseline is None else peak - self.baseline
        return {"peak_memory_bytes": peak, "added_memory_bytes": added}


def _status_bytes(key: str) -> int | None:
    """A `kB` field of `/proc/self/status`, in bytes."""
    for line in _STATUS.read_text().splitlines():
        if line.startswith(key):
            return int(line.split()[1]) * 1024
    return None
