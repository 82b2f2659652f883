"""SVI for any model/guide pair: [`fit`][] builds the step
([`SVIStep`][bnn_zoo._core.step.SVIStep]: minibatches, vectorised particles, KL weighting, the
NaN guard), resumes it from a checkpoint (`bnn_zoo._core.checkpoint`) and runs it
(`bnn_zoo._core.loop.run_steps`: progress, read-backs, checkpoints), seeded and with
Pyro's validation as asked; it returns a [`FitResult`][].
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pyro
import pyro.infer
from torch import Tensor, nn

from bnn_zoo._core.batch_step import LoaderStep
from bnn_zoo._core.batches import Batches, as_batches, is_loader
from bnn_zoo._core.checkpoint import checkpoint_path, resume
from bnn_zoo._core.checks import (
    check_bool,
    check_choice,
    check_positive_int,
    check_seed,
    check_values,
)
from bnn_zoo._core.loop import run_steps
from bnn_zoo._core.lr_schedule import LR_SCHEDULES
from bnn_zoo._core.step import SVIStep

__all__ = ["FitResult", "fit", "loader_batches"]


@dataclass
class FitResult:
    """What a fit returns: the loss history (negative ELBO per step, in nats),
    wall time, and throughput."""

    losses: list[float]
    seconds: float
    steps: int
    parameters: dict[str, Tensor] = field(repr=False, default_factory=dict)

    @property
    def steps_per_second(self) -> float:
        return self.steps / self.seconds if self.seconds > 0 else math.inf


def _named_parameters(modules: list[nn.Module]) -> dict[str, Tensor]:
    """The parameters of ``modules``, named ``"{index}.{name}"`` by module."""
    return {f"{i}.{name}": p for i, m in enumerate(modules) for name, p in m.named_parameters()}


def fit(model: Callable, guide: Callable, x: Tensor | Iterable, y: Tensor | None = None, *,
        steps: int,
        lr: float = 1e-2, lr_schedule: str = "constant", batch_size: int | None = None,
        num_particles: int = 1, elbo: type[pyro.infer.ELBO] = pyro.infer.Trace_ELBO,
        kl_weighting: str = "uniform", seed: int | None = None, progress: bool | None = None,
        checkpoint: str | Path | None = None, checkpoint_every: int = 1000,
        max_plate_nesting: int = 1, jit: bool = False, cuda_graph: bool | None = None,
        validate: bool | None = None, distributed: bool = False,
        check_every: int = 1, num_data: int | None = None) -> FitResult:
    """Fit ``guide`` to ``model`` by stochastic variational inference.

    Parameters
    ----------
    model, guide : Pyro model and guide, called as ``model(x, y)``; the model must
        put its data in ``pyro.plate("data", N)``.
    x, y : inputs (N, D) (or (N, ...) for a model that takes them, such as a
        [`BayesianModule`][bnn_zoo.models.BayesianModule]) and (N,) targets, on the device the fit
        should run on (one that holds data: ``meta`` tensors are refused). Or ``x`` a
        loader and ``y`` ``None``: a ``torch.utils.data.DataLoader`` (or any re-iterable
        of ``(x, y)`` batches) of a data set of ``num_data`` points (default
        ``len(loader.dataset)``), one batch per step (each batch's likelihood scaled by
        ``N / B``, an epoch one pass in the loader's order), used on the device its
        batches come on; the loader sets the batches, so ``batch_size`` stays ``None``,
        and ``distributed`` ``False``.
    steps : total number of optimiser steps (minibatches).
    lr : Adam learning rate; one fused ``torch.optim.Adam`` over all parameters
        of the model and the guide.
    lr_schedule : the learning rate of each step as a fraction of ``lr``: ``"constant"``
        or ``"cosine"`` (annealed to nearly 0 at the last step).
    batch_size : minibatch size ``B`` (``None``: the full data every step).
    num_particles : ELBO particles, vectorised (``vectorize_particles=True``).
    elbo : the ELBO class, e.g. ``Trace_ELBO`` or ``TraceMeanField_ELBO``.
    kl_weighting : ``"uniform"``, or ``"graves"``: minibatch ``i`` of ``M`` weights the KL
        by ``2^(M-i) / (2^M - 1)`` (Blundell et al. 2015, section 3.4).
    seed : seeds Pyro, torch and the minibatch order.
    progress : show a tqdm bar (default: only when stderr is a terminal).
    checkpoint : file holding the parameters, optimiser and data-order state as tensors
        and plain data, written atomically (a unique temporary file in the same folder,
        renamed over it) every ``checkpoint_every`` steps and at the end. If it exists,
        training resumes from it and runs up to ``steps`` in total: it is read with
        ``torch.load(weights_only=True)`` (no pickled code runs) and must come from the
        same run, i.e. the same model and guide tensors and shapes, data size, batch size,
        number of batches, ELBO class and KL weighting (a ``ValueError`` naming the file and
        what differs otherwise, as for a truncated or corrupt file). A different ``lr`` is
        applied to the resumed optimiser with a
        `CheckpointWarning`.
    max_plate_nesting : plates nested in the model (1: the data plate).
    jit : trace the loss once with ``torch.jit.trace``; for models without
        data-dependent Python control flow. On small nets this removes most of Pyro's
        per-step overhead.
    cuda_graph : record the traced step once as a CUDA graph and replay it
        (`bnn_zoo._core.graphs`: one launch a step, no Python). ``None`` (default): where
        it can be, a traced step (``jit=True``) on a CUDA device in one process; ``True``:
        the same, a ``ValueError`` elsewhere; ``False``: never. A step that cannot be
        recorded (an op that reads sizes back to the host) runs op by op and says so once
        (a [`GraphWarning`][bnn_zoo.GraphWarning]).
    validate : run Pyro's and torch's argument validation while training (it checks
        every distribution's arguments, so it slows training). ``None`` (default): on
        only when the environment variable ``BNN_ZOO_VALIDATE`` is ``1``, as the test
        suite sets it.
    distributed : data-parallel training in an initialised ``torch.distributed``
        process group (see [`bnn_zoo.distributed`][]): ``x``, ``y`` are this
        process's shard, ``batch_size`` is per process, the ELBO is that of the
        union of the shards, gradients are averaged over the processes before each
        step, and only rank 0 shows progress and writes ``checkpoint`` (which every
        process resumes from, so it must be on a file system they all see).
    check_every : steps between read-backs of the loss to the host. 1 (default): every
        step's loss is read back and checked before the step is applied, so a NaN/inf
        loss or gradient leaves exactly the last finite parameters. ``k > 1``: the losses
        stay on the device (a GPU step never waits for the host) and are read back, and
        the NaN guard checked, every ``k`` steps, before a checkpoint and at the end; a
        non-finite step's gradients are zeroed, and the parameters are restored to those
        of the last check.

    Raises
    ------
    ~bnn_zoo.TrainingDiverged : if the loss or a gradient turns NaN/inf; the
        parameters are restored to the last values whose loss and gradient were finite
        (with ``check_every > 1``, to those of the last check).
    ValueError : if ``y`` (or any observed value) does not have the shape of its
        likelihood (e.g. (N, 1) targets for an (N,) likelihood, which Pyro would
        broadcast), checked on the first trace; if ``checkpoint`` does not belong to this
        run, cannot be read, or has done more than ``steps`` steps.
    """
    for name, value in (("x", x), ("y", y)):  # the step itself runs on meta tensors too
        if isinstance(value, Tensor):
            check_values(name, value)
    batches = loader_batches(x, y, num_data, batch_size=batch_size, distributed=distributed)
    check_positive_int("steps", steps)
    check_choice("lr_schedule", lr_schedule, LR_SCHEDULES)
    check_positive_int("checkpoint_every", checkpoint_every)
    check_positive_int("check_every", check_every)
    seed = check_seed("seed", seed, allow_none=True)
    check_bool("progress", progress, allow_none=True)
    check_bool("validate", validate, allow_none=True)
    path = checkpoint_path(checkpoint)
    if seed is not None:
        pyro.set_rng_seed(seed)
    if validate is None:
        validate = os.environ.get("BNN_ZOO_VALIDATE") == "1"
    options = dict(lr=lr, num_particles=num_particles, elbo=elbo, kl_weighting=kl_weighting,
                   seed=seed, max_plate_nesting=max_plate_nesting, jit=jit,
                   cuda_graph=cuda_graph)
    with pyro.validation_enabled(validate):
        step = SVIStep(model, guide, x, y, batch_size=batch_size, distributed=distributed,
                       **options) if batches is None else LoaderStep(model, guide, batches,
                                                                     **options)
        return _fit(step, steps, progress, path, checkpoint_every, check_every, lr_schedule)


def loader_batches(x: object, y: object, num_data: int | None, *, batch_size: int | None,
                   distributed: bool) -> Batches | None:
    """``x`` checked as a loader ([`as_batches`][bnn_zoo._core.batches.as_batches]) where it is one,
    with what a loader fit refuses (``y``, ``batch_size``, ``distributed``) named; ``None``
    for tensors, which take no ``num_data``."""
    if not is_loader(x, y):
        if y is None:
            raise ValueError("Expected y, the targets of x; only a loader for x yields them "
                             "with the inputs.")
        if num_data is not None:
            raise ValueError("num_data is the size of a loader's data set; with tensors x, y "
                             "it is len(x): expected num_data=None.")
        return None
    for name, value, default, why in (
            ("y", y, None, "the loader yields the targets with the inputs"),
            ("batch_size", batch_size, None, "the loader sets the batches"),
            ("distributed", distributed, False, "a loader fit runs on one process")):
        if value is not default:
            raise ValueError(f"Expected {name}={default} with a loader for x ({why}), but got "
                             f"{name}={value!r}.")
    return as_batches(x, num_data)


def _fit(step: SVIStep, steps: int, progress: bool | None, path: Path | None,
         checkpoint_every: int, check_every: int, lr_schedule: str) -> FitResult:
    losses: list[float] = []
    if path is not None and path.exists():
        losses = resume(step, path, steps)
    start_step = step.step_count
    seconds = run_steps(step, steps, losses, progress=progress, path=path,
                        checkpoint_every=checkpoint_every, check_every=check_every,
                        lr_schedule=lr_schedule)
    return FitResult(losses=losses, seconds=seconds, steps=steps - start_step,
                     parameters=_named_parameters(step.modules))
