"""SVI for any model/guide pair: minibatches, vectorised particles, a NaN guard,
progress, seeding and checkpoints.

Minibatching goes through the model's ``pyro.plate("data", N)``:
:class:`subsample_data` sets the plate's subsample indices, so Pyro rescales the
likelihood by ``N / B`` and the minibatch ELBO is an unbiased estimate of the
full-batch ELBO. Each epoch visits every point once (a fresh permutation split
into ``M = ceil(N / B)`` minibatches).

The KL part of the objective can be reweighted per minibatch as in Blundell et
al. (2015, section 3.4): the loss of minibatch ``i`` is
``pi_i KL(q || p) - E_q[log p(D_i | w)]`` with ``sum_i pi_i = 1``. Relative to the
standard ``N / B`` scaling (uniform ``pi_i = 1/M``) that multiplies the KL by
``M pi_i``; :class:`scale_global_sites` applies that factor to every site outside
the data plate.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pyro
import pyro.infer
import torch
from pyro.poutine.messenger import Messenger
from pyro.poutine.subsample_messenger import _Subsample
from torch import Tensor, nn
from tqdm.auto import tqdm

from bnn_zoo._checks import check_choice, check_data, check_positive, check_positive_int

__all__ = ["FitResult", "TrainingDiverged", "fit", "kl_weights", "scale_global_sites",
           "subsample_data"]

KL_WEIGHTINGS = ("uniform", "graves")


class TrainingDiverged(FloatingPointError):
    """The loss or a gradient became NaN/inf; the parameters keep their last finite values."""


class subsample_data(Messenger):
    """Effect handler that sets the subsample indices of ``pyro.plate(name, N)``.

    Applied to model and guide alike, so both see the same minibatch.
    """

    def __init__(self, indices: Tensor, name: str = "data") -> None:
        super().__init__()
        self.indices = indices
        self.name = name

    def _pyro_sample(self, msg) -> None:
        if msg["name"] == self.name and isinstance(msg["fn"], _Subsample):
            msg["value"] = self.indices
            msg["done"] = True


class scale_global_sites(Messenger):
    """Multiply the log density of every sample site outside the data plate by ``weight``."""

    def __init__(self, weight: float, data_plate: str = "data") -> None:
        super().__init__()
        self.weight = weight
        self.data_plate = data_plate

    def _pyro_sample(self, msg) -> None:
        if isinstance(msg["fn"], _Subsample):
            return
        if not any(frame.name == self.data_plate for frame in msg["cond_indep_stack"]):
            msg["scale"] = msg["scale"] * self.weight


def kl_weights(num_batches: int, scheme: str = "uniform") -> list[float]:
    """Per-minibatch KL weights ``pi_i`` of Blundell et al. (2015), summing to one.

    ``uniform``: ``pi_i = 1 / M``. ``graves``: ``pi_i = 2^(M-i) / (2^M - 1)`` for
    ``i = 1..M``, which puts most of the KL on the first minibatches of an epoch.
    """
    check_positive_int("num_batches", num_batches)
    check_choice("kl_weighting", scheme, KL_WEIGHTINGS)
    if scheme == "uniform":
        return [1.0 / num_batches] * num_batches
    # 2^(M-i) / (2^M - 1) computed as 2^-i / (1 - 2^-M) to stay finite for large M.
    norm = -math.expm1(-num_batches * math.log(2.0))
    return [2.0 ** (-i) / norm for i in range(1, num_batches + 1)]


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


def _modules(model: Callable, guide: Callable) -> list[nn.Module]:
    seen: list[nn.Module] = []
    for obj in (model, guide):
        if isinstance(obj, nn.Module) and all(obj is not m for m in seen):
            seen.append(obj)
    return seen


def _named_parameters(modules: list[nn.Module]) -> dict[str, Tensor]:
    return {f"{i}.{name}": p for i, m in enumerate(modules) for name, p in m.named_parameters()}


def _save(path: Path, modules: list[nn.Module], optimizer: torch.optim.Optimizer,
          step: int, losses: list[float]) -> None:
    state = {"modules": [m.state_dict() for m in modules], "optimizer": optimizer.state_dict(),
             "step": step, "losses": losses}
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(state, tmp)
    tmp.replace(path)


def fit(model: Callable, guide: Callable, x: Tensor, y: Tensor, *, steps: int,
        lr: float = 1e-2, batch_size: int | None = None, num_particles: int = 1,
        elbo: type[pyro.infer.ELBO] = pyro.infer.Trace_ELBO, kl_weighting: str = "uniform",
        seed: int | None = None, progress: bool | None = None,
        checkpoint: str | Path | None = None, checkpoint_every: int = 1000,
        max_plate_nesting: int = 1) -> FitResult:
    """Fit ``guide`` to ``model`` by stochastic variational inference.

    Parameters
    ----------
    model, guide : Pyro model and guide, called as ``model(x_batch_indices..., y)``;
        the model must put its data in ``pyro.plate("data", N)``.
    x, y : (N, D) inputs and (N,) targets, on the device the fit should run on.
    steps : number of optimiser steps (minibatches).
    lr : Adam learning rate; one fused ``torch.optim.Adam`` over all parameters
        of the model and the guide.
    batch_size : minibatch size ``B`` (``None``: the full data every step).
    num_particles : ELBO particles, vectorised (``vectorize_particles=True``).
    elbo : the ELBO class, e.g. ``Trace_ELBO`` or ``TraceMeanField_ELBO``.
    kl_weighting : ``"uniform"`` or ``"graves"`` (see :func:`kl_weights`).
    seed : seeds Pyro, torch and the minibatch order.
    progress : show a tqdm bar (default: only when stderr is a terminal).
    checkpoint : file to save the parameters and optimiser state to every
        ``checkpoint_every`` steps and at the end; if it exists, training
        resumes from it.
    max_plate_nesting : plates nested in the model (1: the data plate).

    Raises
    ------
    TrainingDiverged : if the loss or a gradient turns NaN/inf; the parameters
        keep the values of the last finite step.
    """
    x, y = check_data(x, y)
    check_positive_int("steps", steps)
    check_positive("lr", lr)
    check_positive_int("num_particles", num_particles)
    check_positive_int("batch_size", batch_size, allow_none=True)
    check_positive_int("checkpoint_every", checkpoint_every)
    check_choice("kl_weighting", kl_weighting, KL_WEIGHTINGS)
    if not (isinstance(elbo, type) and issubclass(elbo, pyro.infer.ELBO)):
        raise TypeError(f"Expected elbo to be a pyro.infer.ELBO subclass, but got {elbo!r}.")
    if seed is not None:
        pyro.set_rng_seed(seed)
    n = x.shape[0]
    batch = n if batch_size is None else min(batch_size, n)
    num_batches = math.ceil(n / batch)
    weights = kl_weights(num_batches, kl_weighting)
    loss_fn = elbo(num_particles=num_particles, vectorize_particles=num_particles > 1,
                   max_plate_nesting=max_plate_nesting)
    order = torch.Generator().manual_seed(seed if seed is not None else 0)

    def batches():
        while True:
            perm = torch.randperm(n, generator=order).to(x.device)
            for i in range(num_batches):
                yield i, perm[i * batch:(i + 1) * batch]

    def loss_of(i: int, idx: Tensor) -> Tensor:
        with contextlib.ExitStack() as stack:
            if batch < n:
                stack.enter_context(subsample_data(idx))
            if kl_weighting != "uniform":
                stack.enter_context(scale_global_sites(num_batches * weights[i]))
            return loss_fn.differentiable_loss(model, guide, x, y)

    stream = batches()
    first = next(stream)
    loss_of(*first)  # creates lazily initialised parameters (autoguides)
    modules = _modules(model, guide)
    params = [p for m in modules for p in m.parameters() if p.requires_grad]
    if not params:
        raise ValueError("Expected the model or the guide to have trainable parameters.")
    optimizer = torch.optim.Adam(params, lr=lr)
    losses: list[float] = []
    start_step = 0
    path = Path(checkpoint) if checkpoint is not None else None
    if path is not None and path.exists():
        state = torch.load(path, map_location=x.device)
        for m, s in zip(modules, state["modules"]):
            m.load_state_dict(s)
        optimizer.load_state_dict(state["optimizer"])
        start_step, losses = state["step"], list(state["losses"])
    show = sys.stderr.isatty() if progress is None else progress
    started = time.perf_counter()
    bar = tqdm(range(start_step, steps), disable=not show, desc="SVI", leave=False)
    for step in bar:
        i, idx = first if step == start_step else next(stream)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_of(i, idx)
        loss.backward()
        grad_norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
        value = loss.item()
        if not math.isfinite(value) or not bool(torch.isfinite(grad_norm)):
            raise TrainingDiverged(
                f"The loss became {value} (gradient norm {grad_norm.item()}) at step {step}; "
                "the parameters keep their last finite values. Try a smaller lr or a "
                "narrower initial guide."
            )
        optimizer.step()
        losses.append(value)
        if show and step % 50 == 0:
            bar.set_postfix(loss=f"{value:.4g}")
        if path is not None and (step + 1) % checkpoint_every == 0:
            _save(path, modules, optimizer, step + 1, losses)
    seconds = time.perf_counter() - started
    if path is not None:
        _save(path, modules, optimizer, steps, losses)
    return FitResult(losses=losses, seconds=seconds, steps=steps - start_step,
                     parameters=_named_parameters(modules))
