"""Replicas: R independent fits of one model and guide in one vectorised pass.

On small networks an SVI step costs per-operation overhead, not arithmetic, so R fits
run one after the other pay that overhead R times. Run as replicas they pay it once:

* the data are stacked, ``x`` of shape (R, N, D) and ``y`` of shape (R, N) (R training
  sets of equal size, or one set repeated with R seeds);
* the model puts everything it samples in an outer ``pyro.plate("replicas", R, dim=-2)``
  (`replica_plate`; the data plate stays at ``dim=-1``), so every weight gets a
  leading replica dimension, exactly as it gets the leading dimension of vectorised
  particles, which go further left;
* the guide holds its parameters per replica, with a leading dimension R (Pyro's
  autoguides do so by themselves for sites in the plate; the zoo's guides follow a model's
  ``replicas`` attribute);
* the objective is the sum of the R ELBOs, whose gradient with respect to replica
  ``r``'s parameters is that of ELBO ``r`` alone, and one ``torch.optim.Adam`` over the
  stacked parameters is R independent Adams, since Adam updates each element from that
  element's gradient history only.

So replica ``r`` follows the same trajectory as a separate fit with the same initial
values, minibatch indices and noise, up to round-off. Every replica takes the same
minibatch indices (each from its own data). Per-replica losses come out of the same
backward pass: every site in the replica plate has its log density multiplied by a weight
``u_r = 1`` ([`weight_replicas`][]), so ``d loss / d u_r`` is replica ``r``'s loss.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from typing import Any

import pyro
import pyro.infer
import torch
from pyro.poutine.messenger import Messenger
from torch import Tensor, nn

from bnn_zoo._core.checks import (
    as_data_tensor,
    check_bool,
    check_positive_int,
    check_seed,
    check_tensor,
)
from bnn_zoo._core.handlers import weight_points
from bnn_zoo._core.loop import run_steps
from bnn_zoo._core.predictive import (
    GaussianMixturePredictive,
    Predictive,
    sample_predictive,
)
from bnn_zoo._core.step import SVIStep
from bnn_zoo._core.training import FitResult

__all__ = ["REPLICA_CHECK_EVERY", "REPLICA_DIM", "REPLICA_PLATE", "ReplicaSVIStep",
           "check_replica_data", "fit_replicas", "fit_single_pairs", "predict_replicas",
           "replica_plate", "split_replicas", "stack_replicas", "weight_replicas"]

#: The name and dimension of the replica plate: left of the data plate (``dim=-1``).
REPLICA_PLATE = "replicas"
REPLICA_DIM = -2
#: Steps between read-backs of the replicas' losses (and checks of the NaN guard).
REPLICA_CHECK_EVERY = 100


def replica_plate(replicas: int | None, device: torch.device | None = None
                  ) -> contextlib.AbstractContextManager:
    """``pyro.plate("replicas", replicas, dim=-2)``, or a context that does nothing when
    ``replicas`` is ``None`` (a single fit)."""
    if replicas is None:
        return contextlib.nullcontext()
    return pyro.plate(REPLICA_PLATE, replicas, dim=REPLICA_DIM, device=device)


def check_replica_data(x: object, y: object) -> tuple[Tensor, Tensor]:
    """Check stacked training sets: ``x`` of shape (R, N, D) (floating) and ``y`` of shape
    (R, N) on the same device; return them as tensors (numpy arrays converted)."""
    x = check_tensor("x", as_data_tensor("x", x), ndim=3, floating=True)
    y = check_tensor("y", as_data_tensor("y", y), ndim=2)
    if y.shape != x.shape[:2]:
        raise ValueError(f"Expected y of shape (R, N) = {tuple(x.shape[:2])} to match x of "
                         f"shape (R, N, D) = {tuple(x.shape)}, but got {tuple(y.shape)}.")
    if y.device != x.device:
        raise ValueError(f"Expected x and y on the same device, but got {x.device} and {y.device}.")
    return x, y


def weight_replicas(weights: Tensor) -> weight_points:
    """Multiply the log density of every sample site in the replica plate by ``weights``
    (shape (R, 1), one per replica): [`weight_points`][bnn_zoo.handlers.weight_points] on the
    replica plate.

    With weights of one that require gradients, the loss is unchanged and the gradient of
    the loss with respect to ``weights[r]`` is replica ``r``'s loss (the loss is linear in
    each weight), for any ELBO whose surrogate equals its loss (reparameterised guides).
    """
    return weight_points(weights.reshape(-1), plate=REPLICA_PLATE)


class ReplicaSVIStep(SVIStep):
    """One optimiser step of R independent SVI fits (see the module doc).

    ``x`` (R, N, D), ``y`` (R, N); ``max_plate_nesting`` counts the model's plates without
    the replica plate, as for a single fit. Every trainable parameter of the model and the
    guide must have a leading dimension R (a parameter shared by the replicas would couple
    the fits: a ``ValueError`` naming it).

    A call ([`advance`][bnn_zoo._core.step.SVIStep.advance]) returns the R losses of the
    step as a tensor on the device, without reading anything back to the host; it records
    whether every replica's loss and gradient norm stayed finite, and sets the gradient of
    a replica where they did not to zero (so its parameters stay finite, and Pyro's
    validation quiet, until the check). `check` reads that back (every few steps and at
    the end, in [`fit_replicas`][]): if some replica diverged, the parameters of all of them
    are restored to those of the last check and
    [`TrainingDiverged`][bnn_zoo.TrainingDiverged] names the replicas.
    """

    data_dim = 1  # x (R, N, D), y (R, N)

    def __init__(self, model: Callable, guide: Callable, x: Tensor, y: Tensor, *,
                 max_plate_nesting: int = 1, **options) -> None:
        x, y = check_replica_data(x, y)
        check_positive_int("max_plate_nesting", max_plate_nesting)
        self.replicas = x.shape[0]
        self.replica_weights = torch.ones(self.replicas, 1, dtype=x.dtype, device=x.device,
                                          requires_grad=True)
        super().__init__(model, guide, x, y, max_plate_nesting=max_plate_nesting + 1,
                         **options)
        names = {id(p): name for m in self.modules for name, p in m.named_parameters()}
        shared = [f"{names[id(p)]} {tuple(p.shape)}" for p in self.params
                  if p.dim() == 0 or p.shape[0] != self.replicas]
        if shared:
            raise ValueError(f"Expected every parameter to have a leading replica dimension "
                             f"{self.replicas}, but {', '.join(shared)} would be shared by "
                             "the replicas; put the model's sites in replica_plate(R) and give "
                             "the guide parameters per replica.")
        self.finite = torch.ones(self.replicas, dtype=torch.bool, device=x.device)

    def check_data(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        return check_replica_data(x, y)

    def handlers(self) -> list[Messenger]:
        return [weight_replicas(self.replica_weights)]

    def trace_inputs(self) -> tuple[Tensor, ...]:
        return (self.replica_weights,)

    def update(self, i: int, idx: Tensor, weights: Tensor | None) -> Tensor:
        """[`SVIStep.update`][bnn_zoo._core.step.SVIStep.update] for R replicas:
        returns the (R,) losses of the step (each replica's own, read from the replica
        weights' gradient) and keeps finiteness, and zeroes the gradients, per replica."""
        self.replica_weights.grad = None
        self.backpropagate(i, idx, weights)
        losses = self.replica_weights.grad.detach().reshape(self.replicas)
        grads = [p.grad for p in self.params if p.grad is not None]
        squares = sum(g.reshape(self.replicas, -1).square().sum(1) for g in grads)
        finite = torch.isfinite(losses) & torch.isfinite(squares)
        self.finite &= finite
        for g in grads:
            g.masked_fill_(~finite.view(-1, *[1] * (g.dim() - 1)), 0.0)
        self.optimizer.step()
        return losses

    def __call__(self) -> list[float]:
        """A step, then `check`: the R losses, read back."""
        losses = self.advance()
        self.check()
        return losses.tolist()

    def divergence_message(self, bad: list[int]) -> str:
        return (f"Replica {', '.join(map(str, bad))} of {self.replicas}: the loss or gradient "
                f"became NaN/inf between steps {self.checked_step} and {self.step_count}; the "
                f"parameters are restored to step {self.checked_step}, the last check with "
                "finite losses. Try a smaller lr or a narrower initial guide.")


def fit_replicas(model: Callable, guide: Callable, x: Tensor, y: Tensor, *, steps: int,
                 lr: float = 1e-2, lr_schedule: str = "constant",
                 batch_size: int | None = None, num_particles: int = 1,
                 elbo: type[pyro.infer.ELBO] = pyro.infer.Trace_ELBO,
                 kl_weighting: str = "uniform", seed: int | None = None,
                 progress: bool | None = None, max_plate_nesting: int = 1, jit: bool = False,
                 cuda_graph: bool | None = None, validate: bool | None = None,
                 check_every: int = REPLICA_CHECK_EVERY) -> list[FitResult]:
    """R independent SVI fits in one vectorised pass: [`bnn_zoo._core.training.fit`][]
    for a replica-batched model and guide (see the module doc).

    ``x`` (R, N, D), ``y`` (R, N): replica ``r`` trains on ``x[r]``, ``y[r]``. The model
    must put its sites in `replica_plate` ``(R)`` and broadcast over the leading
    replica dimension of its weights and data ([`bnn_zoo.models.BayesianMLP`][] does so
    after ``.replicated(R)``); the guide must hold its parameters per replica. Every replica
    takes the same minibatch indices, drawn from ``seed``. Losses stay on the device and
    are read back, and the NaN guard checked, every ``check_every`` steps and at the end
    (see `check`; 1: every step). The other arguments are
    those of ``fit``.

    Returns one [`FitResult`][] per replica: its loss history, and as ``seconds`` the
    batch's wall time shared equally by the R fits (so sums over fits are wall times).
    """
    check_positive_int("steps", steps)
    check_positive_int("check_every", check_every)
    seed = check_seed("seed", seed, allow_none=True)
    check_bool("progress", progress, allow_none=True)
    check_bool("validate", validate, allow_none=True)
    if seed is not None:
        pyro.set_rng_seed(seed)
    if validate is None:
        validate = os.environ.get("BNN_ZOO_VALIDATE") == "1"
    with pyro.validation_enabled(validate):
        step = ReplicaSVIStep(model, guide, x, y, lr=lr, batch_size=batch_size,
                              num_particles=num_particles, elbo=elbo,
                              kl_weighting=kl_weighting, seed=seed,
                              max_plate_nesting=max_plate_nesting, jit=jit,
                              cuda_graph=cuda_graph)
        history: list[list[float]] = []
        seconds = run_steps(step, steps, history, progress=progress, check_every=check_every,
                            desc=f"SVI x{step.replicas}",
                            lr_schedule=lr_schedule) / step.replicas
    by_replica = [list(column) for column in zip(*history)]
    return [FitResult(losses=losses, seconds=seconds, steps=steps) for losses in by_replica]


def fit_single_pairs(models: Sequence[nn.Module], guides: Sequence[nn.Module],
                     build_guide: Callable[[nn.Module], nn.Module], x: Tensor, y: Tensor,
                     **options: Any) -> list[FitResult]:
    """Train R single-fit pairs ``(models[r], guides[r])`` as the replicas of one pass and
    write the trained values back into them: the batched model is
    ``models[0].replicated(R)``, its guide ``build_guide(batched_model)`` (with its
    parameters created), both take the singles' values ([`stack_replicas`][]), train by
    [`fit_replicas`][] on ``x`` (R, N, D), ``y`` (R, N) with ``options``, and give the
    results back ([`split_replicas`][]). Returns the R [`FitResult`][]."""
    model = models[0].replicated(len(models))
    guide = build_guide(model)
    stack_replicas(model, models)
    stack_replicas(guide, guides)
    results = fit_replicas(model, guide, x, y, **options)
    split_replicas(model, models)
    split_replicas(guide, guides)
    return results


def predict_replicas(model: Callable, guide: Callable, x: Tensor, *, num_samples: int = 100,
                     max_plate_nesting: int = 1) -> list[Predictive]:
    """The posterior predictive of every replica of a replica-batched pair at inputs ``x``
    (R, N, D), replica ``r`` at ``x[r]``: R predictives, each as
    [`bnn_zoo._core.predictive.predict`][] gives it for one fit, all drawn in one pass.
    ``max_plate_nesting`` counts the model's plates without the replica plate."""
    x = check_tensor("x", as_data_tensor("x", x), ndim=3, floating=True)
    check_positive_int("max_plate_nesting", max_plate_nesting)
    pred = sample_predictive(model, guide, x, num_samples=num_samples,
                             max_plate_nesting=max_plate_nesting + 1)
    if isinstance(pred, GaussianMixturePredictive):
        # (S, R, N); a pair without latent weights gives (R, N), the same for every sample
        loc, scale = (t.expand(num_samples, *x.shape[:2]) for t in (pred.loc, pred.scale))
        return [GaussianMixturePredictive(loc[:, r], scale[:, r]) for r in range(x.shape[0])]
    return [pred.replica(r) for r in range(x.shape[0])]


def _is_replicated(batched: Tensor, single: Tensor, replicas: int) -> bool:
    return (batched.dim() > 0 and batched.shape[0] == replicas
            and batched.numel() == replicas * single.numel())


def stack_replicas(batched: nn.Module, singles: Sequence[nn.Module]) -> None:
    """Copy the state of each single-fit module ``singles[r]`` into replica ``r`` of the
    replica-batched module ``batched``, in place: a tensor of ``batched`` with a leading
    dimension R and R times the elements of the single one takes each single's values in
    its slice ``r``; any other tensor is shared by the replicas and must be equal in every
    single module (a ``ValueError`` otherwise). Both must have the same state names."""
    states = [m.state_dict() for m in singles]
    with torch.no_grad():
        for name, tensor in _matching_state(batched, states):
            if _is_replicated(tensor, states[0][name], len(states)):
                for r, state in enumerate(states):
                    tensor[r].copy_(state[name].reshape(tensor[r].shape))
            elif any(not torch.equal(state[name], states[0][name]) for state in states):
                raise ValueError(f"{name!r} is shared by the replicas but differs between the "
                                 "single fits.")
            else:
                tensor.copy_(states[0][name])


def split_replicas(batched: nn.Module, singles: Sequence[nn.Module]) -> None:
    """The inverse of [`stack_replicas`][]: load replica ``r`` of ``batched`` into
    ``singles[r]``."""
    states = [m.state_dict() for m in singles]
    for r, single in enumerate(singles):
        single.load_state_dict({
            name: (tensor[r].reshape(states[r][name].shape).clone()
                   if _is_replicated(tensor, states[r][name], len(singles)) else tensor.clone())
            for name, tensor in _matching_state(batched, states)})


def _matching_state(batched: nn.Module, states: list[dict]) -> list[tuple[str, Tensor]]:
    state = batched.state_dict()
    if state.keys() != states[0].keys():
        raise ValueError(f"Expected the replica-batched and single modules to hold the same "
                         f"tensors, but got {sorted(state)[:5]} and {sorted(states[0])[:5]}.")
    return list(state.items())
