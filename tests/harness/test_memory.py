"""``bnn_zoo._harness.memory``: a known tensor allocated in a block shows up in its peak, a
block that allocates nothing reports about zero, on the CPU by both methods and on CUDA."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import time

import pytest
import torch

from bnn_zoo._harness.memory import (
    PAGE,
    PeakMemory,
    _malloc_trim,
    peak_mib,
    retain_freed_memory,
    step_peaks,
)

SIZE_MIB = 64
# The CPU tolerance: 2 MiB for what the interpreter and torch touch around the tensor in
# the block (objects, and code pages of torch faulted in at first use: 1.7 MiB measured
# for the first .sum() of a process), plus the error of the kernel's RSS counters, which
# are kept per CPU and summed approximately for the high-water mark: up to a batch of
# max(32, 2 n) pages per CPU on n CPUs (percpu_counter's default batch). Page granularity
# (4 KiB) is within it. The sampling method reads every 2 ms: a tensor held 20 ms is seen.
CPUS = os.cpu_count() or 1
CPU_TOL = 2.0 + max(32, 2 * CPUS) * CPUS * PAGE / 2**20
METHODS = ["hwm", "sample"]


def allocate(mib: int, device: str = "cpu") -> torch.Tensor:
    """A float32 tensor of ``mib`` MiB, written so that its pages are resident."""
    return torch.empty(mib * 2**20 // 4, device=device).fill_(1.0)


@pytest.mark.parametrize("method", METHODS)
def test_a_tensor_kept_after_the_block_shows_up(method):
    with PeakMemory("cpu", method=method) as peak:
        kept = allocate(SIZE_MIB)
    assert peak.mib == pytest.approx(SIZE_MIB, abs=CPU_TOL)
    del kept


@pytest.mark.parametrize("method", METHODS)
def test_a_tensor_freed_inside_the_block_shows_up(method):
    with PeakMemory("cpu", method=method) as peak:
        transient = allocate(SIZE_MIB)
        time.sleep(0.02)  # ten sampling intervals
        del transient
    assert peak.mib == pytest.approx(SIZE_MIB, abs=CPU_TOL)


@pytest.mark.parametrize("method", METHODS)
def test_a_block_that_allocates_nothing_reports_about_zero(method):
    with PeakMemory("cpu", method=method) as peak:
        pass
    assert 0.0 <= peak.mib <= CPU_TOL


def heap_hole() -> torch.Tensor:
    """Free 50 MiB of heap (800 tensors of 64 KiB) below a tensor that stays (returned);
    the freed pages stay resident and the heap cannot shrink."""
    tensors = [torch.ones(2**14) for _ in range(800)]
    pin = torch.ones(2**10)
    del tensors
    return pin


def test_freed_heap_is_trimmed_so_a_repeated_step_still_shows_up():
    """The heap hole's 64 KiB tensors were below glibc's least mmap threshold (128 KiB), so
    on the heap; the same allocations again reuse its resident pages. Without malloc_trim
    the step would show ~0 MiB (2.3 and 0.02 MiB measured); with it, its 50 MiB (2 MiB more
    tolerance for the heap's own fragmentation and headers)."""

    def heap_step():
        tensors = [torch.ones(2**14) for _ in range(800)]
        return sum(t[0] for t in tensors)

    pin = heap_hole()
    assert peak_mib(heap_step) == pytest.approx(50, abs=CPU_TOL + 2)
    del pin


def test_garbage_left_before_the_block_does_not_offset_its_peak():
    """A 16 MiB tensor left in a reference cycle before the block is freed only when the
    garbage collector next runs; the interpreter may run it at any allocation inside the
    block (here explicitly), and its freed pages would lower the peak from 32 MiB to 16.
    The block starts after a collection, so the peak is the block's 32 MiB."""

    class Node:
        pass

    first, second = Node(), Node()
    first.other, second.other = second, first
    first.tensor = allocate(16)
    del first, second

    def step():
        gc.collect()
        return allocate(32).sum()

    assert peak_mib(step) == pytest.approx(32, abs=CPU_TOL)


def test_peak_over_calls_is_the_largest_call_not_the_sum():
    """Each call allocates and frees a 48 MiB tensor, which lands in the heap hole rather
    than in a fresh mapping; measured in one block, a later call's tensor can land
    elsewhere in the hole and the pages of both count (96 MiB seen after this file's other
    tests; not reproducible alone): each call is measured alone, after the freed heap is
    handed back, and the peak over calls is the largest call's, not their sum."""
    pin = heap_hole()
    assert peak_mib(lambda: allocate(48).sum(), calls=3) == pytest.approx(48, abs=CPU_TOL)
    peaks = step_peaks({"small": lambda: allocate(8).sum(), "none": lambda: None}, calls=2)
    assert peaks["small"] == pytest.approx(8, abs=CPU_TOL)
    assert peaks["none"] <= CPU_TOL
    del pin


def test_hwm_blocks_do_not_nest_and_auto_falls_back_to_sampling():
    with PeakMemory("cpu", method="hwm"):
        with pytest.raises(RuntimeError, match="another 'hwm' block"):
            with PeakMemory("cpu", method="hwm"):
                pass
        with PeakMemory("cpu") as inner:
            kept = allocate(16)
            time.sleep(0.02)
        assert inner.used_method == "sample"
        assert inner.mib == pytest.approx(16, abs=CPU_TOL)
    del kept


@pytest.mark.parametrize(("kwargs", "match"), [({"method": "rss"}, "method one of"),
                                               ({"interval": 0.0}, "interval")])
def test_bad_arguments_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PeakMemory("cpu", **kwargs)
    with pytest.raises(ValueError, match="calls"):
        peak_mib(lambda: None, calls=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_peak_is_the_allocators_exact_count():
    """The caching allocator rounds large blocks to 2 MiB, so 64 MiB is counted exactly."""
    with PeakMemory("cuda") as peak:
        transient = allocate(SIZE_MIB, "cuda")
        del transient
    assert peak.mib == SIZE_MIB
    with PeakMemory("cuda") as empty:
        pass
    assert empty.mib == 0.0


RSS_AFTER_FREE = """
import sys, torch
from bnn_zoo._harness.memory import MIB, _rss_bytes, retain_freed_memory
if sys.argv[1] == "retain":
    assert retain_freed_memory(256)
blocks = [torch.ones(2 * MIB) for _ in range(8)]  # eight blocks of 8 MiB, then all freed
held = _rss_bytes()
del blocks
print((held - _rss_bytes()) / MIB)
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads /proc (Linux)")
def test_retain_freed_memory_keeps_freed_blocks_resident():
    # In a fresh process each (the setting is process-wide). By default glibc serves a
    # process's first blocks of 8 MiB by mmap and unmaps each when it is freed: all 64 MiB
    # go back to the system (later such blocks come from the heap and go back when its top
    # is trimmed, which depends on what else lies above them). After retain_freed_memory
    # they come from the heap and stay (within the 256 MiB limit).
    if _malloc_trim() is None:
        pytest.skip("the C library is not glibc")
    returned = {mode: float(subprocess.run([sys.executable, "-c", RSS_AFTER_FREE, mode],
                                           capture_output=True, text=True, check=True).stdout)
                for mode in ("default", "retain")}
    assert returned["default"] > 60  # the 64 MiB, up to pages the interpreter moved
    assert returned["retain"] < 4


def test_retain_freed_memory_refuses_a_limit_mallopt_cannot_take():
    with pytest.raises(ValueError, match="limit_mib"):
        retain_freed_memory(0)
    with pytest.raises(ValueError, match="limit_mib at most 2047"):
        retain_freed_memory(4096)
