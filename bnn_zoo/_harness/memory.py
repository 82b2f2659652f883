"""Peak memory of a block of code, in MiB above what was in use when the block started.

* On a CUDA device: ``torch.cuda.max_memory_allocated`` after
  ``torch.cuda.reset_peak_memory_stats``, less ``torch.cuda.memory_allocated`` at the start
  (tensor memory held by the caching allocator, not what it has reserved from the driver).
* On the CPU: the process's resident set size (RSS), read from Linux's ``/proc``. The
  kernel's high-water mark ``VmHWM`` is reset to the current RSS by writing ``5`` to
  ``/proc/self/clear_refs`` (Linux >= 4.0) and read at the end: to the page (4 KiB), up
  to the kernel's per-CPU counting (see ``tests/harness/test_memory.py``), with no thread and no
  cost inside the block. Where that file cannot be written, a thread
  reads ``/proc/self/statm`` every ``interval`` seconds instead, which can miss a spike
  shorter than the interval. ``resource.getrusage``'s maximum RSS cannot serve: it only
  ever grows over the life of the process, so it gives no block's peak.

Before a CPU block, Python's garbage collector runs and glibc's ``malloc_trim(0)`` hands the
memory freed earlier back to the system (where glibc is the C library): otherwise a block
that reuses freed heap, such as the second call of a training step, would show no growth
at all, and a collection inside the block that frees earlier garbage (tensors left in
reference cycles) would lower the resident size under the block's own allocations. What is
reported is then the block's working memory plus anything else the process touched
meanwhile (its other threads, code pages of a library used for the first time), and it is
an upper bound: a block that frees a chunk the allocator keeps and then allocates elsewhere
counts both (up to 2x when a large freed hole is reused at another address; `peak_mib`
measures each call alone for that reason).
"""

from __future__ import annotations

import ctypes
import functools
import gc
import os
import re
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType

import torch

from bnn_zoo._core.checks import check_positive, check_positive_int

__all__ = ["PeakMemory", "peak_mib", "retain_freed_memory", "step_peaks"]

MIB = 2**20
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_STATUS = Path("/proc/self/status")
_STATM = Path("/proc/self/statm")
_CLEAR_REFS = Path("/proc/self/clear_refs")
_CPU_METHODS = ("auto", "hwm", "sample")
_hwm_in_use = threading.Lock()  # VmHWM is one per process: one "hwm" block at a time


def _status_kib(field: str) -> int:
    match = re.search(rf"^{field}:\s+(\d+) kB", _STATUS.read_text(), flags=re.M)
    if match is None:
        raise RuntimeError(f"{_STATUS} has no {field} line.")
    return int(match[1])


def _rss_bytes() -> int:
    return int(_STATM.read_text().split()[1]) * PAGE


def _can_reset_hwm() -> bool:
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return True


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim`` among the process's symbols, or None (another C library)."""
    return getattr(ctypes.CDLL(None), "malloc_trim", None)


#: glibc's ``mallopt`` parameters (``malloc.h``) and the largest mmap threshold it accepts
#: on a 64-bit system (``DEFAULT_MMAP_THRESHOLD_MAX``).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MMAP_THRESHOLD_MAX = 32 * MIB
_INT_MAX = 2**31 - 1


def retain_freed_memory(limit_mib: int = 1024) -> bool:
    """Make glibc's ``malloc`` keep freed memory for reuse (up to ``limit_mib`` MiB at the top
    of its heap) instead of handing it back to the system; ``True`` if it took the settings,
    ``False`` where the C library is not glibc (nothing changes).

    Process-wide and for the life of the process: call it at the start of a script, never
    from a library (bnn-zoo itself never does). It equals starting the process with
    ``MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=<limit in bytes>``.

    Why: torch's CPU tensors come from ``malloc``. By default glibc serves a block of more
    than 128 KiB by ``mmap`` at first and, once such blocks are freed, from its heap, whose
    top it trims back to the system whenever more than twice the last freed block's size
    is free there, which the end of every training step makes true. The next step's
    tensors then fault their pages in afresh (one fault per 4 KiB page), a sizeable part
    of a small net's step when its tensors are of a few MiB, as many replicas' are
    (``benchmarks/replicas.py`` measures it). Here blocks of up to 32 MiB come from the
    heap, and its top is trimmed only beyond ``limit_mib``: the process keeps up to that
    much memory it no longer uses (its peak resident size is that much higher at most).
    """
    check_positive_int("limit_mib", limit_mib)
    if limit_mib * MIB > _INT_MAX:
        raise ValueError(f"Expected limit_mib at most {_INT_MAX // MIB} (mallopt takes a C int "
                         f"of bytes), but got {limit_mib}.")
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is None or _malloc_trim() is None:
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX)
                and mallopt(_M_TRIM_THRESHOLD, limit_mib * MIB))


class PeakMemory:
    """Context manager measuring the peak memory of its block above the start, in MiB::

        with PeakMemory("cpu") as peak:
            step()
        peak.mib

    Parameters
    ----------
    device : the device whose memory is measured: ``"cuda"`` (or ``"cuda:k"``) for the
        CUDA allocator, anything else for the process's resident set size.
    method : on the CPU, ``"hwm"`` (reset and read the kernel's high-water mark; not
        nestable, as the mark is one per process), ``"sample"`` (a thread reading the RSS
        every ``interval`` seconds), or ``"auto"`` (``"hwm"`` where ``/proc/self/clear_refs``
        can be written and no other ``"hwm"`` block is open, else ``"sample"``).
    interval : seconds between two readings of ``"sample"``.
    trim : collect garbage and hand freed heap back to the system before a CPU block
        (see the module).
    """

    def __init__(self, device: torch.device | str = "cpu", *, method: str = "auto",
                 interval: float = 0.002, trim: bool = True) -> None:
        if method not in _CPU_METHODS:
            raise ValueError(f"Expected method one of {', '.join(_CPU_METHODS)}, but got "
                             f"{method!r}.")
        self.device = torch.device(device)
        self.method = method
        self.interval = check_positive("interval", interval)
        self.trim = trim
        self.mib: float | None = None  # set when the block ends
        #: the CPU method that measured the block ("hwm" or "sample"; None on CUDA)
        self.used_method: str | None = None
        self._start = 0
        self._peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self._start = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            return self
        if not _STATM.exists():
            raise RuntimeError("PeakMemory on the CPU reads /proc/self (Linux); it is not "
                               "available on this system.")
        if self.trim:
            gc.collect()
            if _malloc_trim() is not None:
                _malloc_trim()(0)
        method = self.method
        if method in ("auto", "hwm"):
            acquired = _hwm_in_use.acquire(blocking=False)
            if acquired and _can_reset_hwm():
                method = "hwm"
            else:
                if acquired:
                    _hwm_in_use.release()
                if method == "hwm":
                    raise RuntimeError(
                        "PeakMemory(method='hwm') cannot reset the peak RSS: another 'hwm' "
                        f"block is open or {_CLEAR_REFS} is not writable; use "
                        "method='sample'.")
                method = "sample"
        self.used_method = method
        self._start = _rss_bytes()
        self._peak = self._start
        if method == "sample":
            self._stop.clear()
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            self._peak = max(self._peak, _rss_bytes())

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            peak = torch.cuda.max_memory_allocated(self.device)
        elif self.used_method == "hwm":
            peak = _status_kib("VmHWM") * 1024
            _hwm_in_use.release()
        else:
            self._stop.set()
            self._thread.join()
            peak = max(self._peak, _rss_bytes())
        self.mib = max(peak - self._start, 0) / MIB


def peak_mib(fn: Callable[[], object], *, calls: int = 1,
             device: torch.device | str = "cpu") -> float:
    """The largest peak MiB of ``calls`` calls of ``fn``, each call measured alone
    (`PeakMemory`, so on the CPU freed heap is handed back before each): a call
    whose allocations land on pages the previous call freed but the allocator kept would
    otherwise count them again, and the peak would grow with ``calls``."""
    check_positive_int("calls", calls)
    peaks = []
    for _ in range(calls):
        with PeakMemory(device) as peak:
            fn()
        peaks.append(peak.mib)
    return max(peaks)


def step_peaks(steps: Mapping[str, Callable[[], object]], *, calls: int,
               device: torch.device | str = "cpu") -> dict[str, float]:
    """Each step's peak MiB over ``calls`` calls (`peak_mib`), one step after the
    other: the memory a step takes beyond its state (parameters, optimiser moments), which
    exists before."""
    return {name: peak_mib(fn, calls=calls, device=device) for name, fn in steps.items()}
