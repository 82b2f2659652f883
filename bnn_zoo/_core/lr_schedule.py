"""Learning-rate schedules of the SVI runner.

A schedule gives the learning rate of step ``t`` of a run of ``T`` steps as a fraction of
the run's ``lr``; the loop (`bnn_zoo._core.loop.run_steps`) sets it on the optimiser
before each step. It is a function of the step count and the run's length alone, so a run
resumed from a checkpoint (to the same number of steps) goes on with exactly the rates of an
uninterrupted one.

- ``"constant"``: ``lr`` at every step.
- ``"cosine"``: ``lr (1 + cos(pi t / T)) / 2``, cosine annealing (Loshchilov and Hutter
  2017, "SGDR: Stochastic Gradient Descent with Warm Restarts", without restarts): ``lr`` at
  the first step, falling smoothly to nearly 0 at the last. With minibatches and sampled
  weights, a constant rate leaves the last iterate moving about the optimum in the
  gradient noise; the annealed rate lets it settle, which is what a point-mass guide keeps.
- ``"stable_decay"``: ``lr`` for the first ``1 - DECAY`` of the steps, then the cosine over
  the last `DECAY` of them (the warmup-stable-decay schedule of Hu et al. 2024, "MiniCPM:
  Unveiling the Potential of Small Language Models with Scalable Training Strategies",
  without warmup): the last iterate settles as under ``"cosine"``, while a short run, a
  budget cut by the caller, keeps nearly all of the constant rate's progress (the cosine
  halves the rate summed over the run).
"""

from __future__ import annotations

import math

import torch

from bnn_zoo._core.checks import check_choice

__all__ = ["DECAY", "LR_SCHEDULES", "lr_factor", "set_lr"]

#: The schedules [`lr_factor`][] knows.
LR_SCHEDULES = ("constant", "cosine", "stable_decay")
#: The fraction of a run over which ``"stable_decay"`` decays.
DECAY = 0.25


def lr_factor(schedule: str, step: int, steps: int) -> float:
    """The learning rate of step ``step`` (0-based) of ``steps`` under ``schedule``, as a
    fraction of the base rate (module doc)."""
    check_choice("lr_schedule", schedule, LR_SCHEDULES)
    if schedule == "constant":
        return 1.0
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * step / steps))
    stable = steps - DECAY * steps
    return 1.0 if step < stable else 0.5 * (1.0 + math.cos(math.pi * (step - stable)
                                                          / (steps - stable)))


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Set the learning rate of every parameter group of ``optimizer`` to ``lr``: in place
    where it is a tensor (the rate a recorded CUDA graph reads, `bnn_zoo._core.graphs`)."""
    for group in optimizer.param_groups:
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].fill_(lr)
        else:
            group["lr"] = lr
