"""Timing of steps for the speed benchmarks: interleaved, on any device.

Speed is reported as ratios of steps timed in the same run (DESIGN.md), so every step is
timed within each repeat, one after the other: a change in machine load during the run
touches all of them alike, and the median over repeats drops the outliers.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping

import torch

from bnn_zoo.core.checks import check_positive_int

__all__ = ["interleaved_medians"]


def interleaved_medians(steps: Mapping[str, Callable[[], object]], *, repeats: int,
                        inner: int, device: torch.device | str = "cpu",
                        warmup: int = 5) -> dict[str, float]:
    """Median milliseconds per call of each step in ``steps`` over ``repeats`` rounds of
    ``inner`` calls, the steps interleaved within each round, after ``warmup`` calls each;
    on a CUDA ``device`` the clock waits for the device before it starts and stops."""
    for name, value in (("repeats", repeats), ("inner", inner), ("warmup", warmup)):
        check_positive_int(name, value)
    device = torch.device(device)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for fn in steps.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(repeats):
        for name, fn in steps.items():
            sync()
            start = time.perf_counter()
            for _ in range(inner):
                fn()
            sync()
            times[name].append((time.perf_counter() - start) / inner * 1e3)
    return {name: statistics.median(values) for name, values in times.items()}
