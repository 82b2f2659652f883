"""Timing of steps for the speed benchmarks: interleaved, on any device.

Speed is reported as ratios of steps timed in the same run, never as absolute times
compared across runs or machines, so every step is timed within each repeat, one after
the other: a change in machine load during the run touches all of them alike, and the
median over repeats drops the outliers.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping

import torch
from torch import Tensor

from bnn_zoo._core.checks import check_positive_int

__all__ = ["epoch_batches", "interleaved_medians"]


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


def epoch_batches(n: int, batch: int, *, seed: int = 0,
                  device: torch.device | str = "cpu") -> Callable[[], Tensor]:
    """The minibatch indices a hand-written step visits, as
    `SVIStep` does: each call returns the next ``batch`` indices of
    a permutation of ``range(n)``, drawn afresh (on the CPU) every ``ceil(n / batch)`` calls, so
    that a
    hand-written step gathers its minibatches like the zoo's step it is compared with."""
    check_positive_int("n", n)
    check_positive_int("batch", batch)
    order = torch.Generator().manual_seed(seed)
    starts = range(0, n, batch)
    state = {"perm": torch.arange(n), "next": len(starts)}

    def next_batch() -> Tensor:
        if state["next"] == len(starts):
            state["perm"] = torch.randperm(n, generator=order).to(device)
            state["next"] = 0
        start = starts[state["next"]]
        state["next"] += 1
        return state["perm"][start:start + batch]

    return next_batch
