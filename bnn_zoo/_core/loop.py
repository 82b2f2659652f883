"""The training loop: run an SVI step to a number of steps, with progress, the NaN guard's
read-backs and checkpoints.

Reading a loss back to the host makes a GPU step wait for the device. With
``check_every == 1`` every step's loss is read back and checked before the step is applied
(`SVIStep.__call__`); otherwise the losses stay
on the device ([`advance`][bnn_zoo._core.step.SVIStep.advance]) and are read back, and the NaN
guard checked ([`check`][bnn_zoo._core.step.SVIStep.check]), every ``check_every`` steps,
before a checkpoint and at the end.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from torch import Tensor
from tqdm.auto import tqdm

from bnn_zoo._core.checkpoint import save_checkpoint
from bnn_zoo._core.checks import check_choice
from bnn_zoo._core.distributed import is_main_process
from bnn_zoo._core.lr_schedule import LR_SCHEDULES, lr_factor, set_lr
from bnn_zoo._core.step import SVIStep

__all__ = ["run_steps"]


def run_steps(step: SVIStep, steps: int, losses: list, *, progress: bool | None,
              path: Path | None = None, checkpoint_every: int = 1000, check_every: int = 1,
              desc: str = "SVI", lr_schedule: str = "constant") -> float:
    """Run ``step`` until it has done ``steps`` steps, appending each step's loss to
    ``losses`` (a float, or what the step's [`check`][bnn_zoo._core.step.SVIStep.check] reads
    back), read back and checked every ``check_every`` steps (module doc); return the wall
    time. ``progress``: a tqdm bar named ``desc`` (``None``: only when stderr is a terminal;
    rank 0 only). Writes the checkpoint ``path`` every ``checkpoint_every`` steps and at
    the end (rank 0 only). ``lr_schedule``: the learning rate of each step, as a fraction
    of ``step.lr`` ([`bnn_zoo._core.lr_schedule`][])."""
    check_choice("lr_schedule", lr_schedule, LR_SCHEDULES)
    show = (sys.stderr.isatty() if progress is None else progress) and is_main_process()
    if not is_main_process():
        path = None  # every process resumes from the checkpoint; rank 0 alone writes it
    pending: list[Tensor] = []

    def flush() -> None:
        step.check()
        losses.extend(torch.stack(pending).tolist())
        pending.clear()

    started = time.perf_counter()
    with tqdm(total=steps, initial=step.step_count, disable=not show, desc=desc,
              leave=False) as bar:
        while step.step_count < steps:
            if lr_schedule != "constant":
                set_lr(step.optimizer, step.lr * lr_factor(lr_schedule, step.step_count, steps))
            if check_every == 1:
                losses.append(step())
            else:
                pending.append(step.advance())
                if step.step_count % check_every == 0 or step.step_count == steps:
                    flush()
            bar.update()
            if show and step.step_count % 50 == 0 and losses:
                bar.set_postfix(loss=f"{torch.tensor(losses[-1]).mean():.4g}")
            if path is not None and step.step_count % checkpoint_every == 0:
                if pending:
                    flush()
                save_checkpoint(step, losses, path)
    seconds = time.perf_counter() - started
    if path is not None:
        save_checkpoint(step, losses, path)
    return seconds
