"""Stochastic-gradient MCMC over a Pyro model's potential: SGLD and SGHMC, with a constant
or a cyclical step size, burn-in and thinning.

The potential is the negative log joint ``U(theta) = -log p(theta) - sum_n log p(y_n | x_n,
theta)`` of any Pyro model whose likelihood sits in ``pyro.plate("data", N)`` (Pyro's
`initialize_model`, as NUTS takes it, in the unconstrained space
of every latent site). A minibatch of ``B`` points sets the plate's subsample indices
([`subsample_data`][bnn_zoo.handlers.subsample_data]), so Pyro scales its likelihood by
``N / B`` and ``grad U~`` is an unbiased estimate of ``grad U``.

Update rules (pure functions of the state, the gradient and a standard normal ``z``), with a
diagonal preconditioner ``P`` (1 without adaptation):

* SGLD (Welling & Teh 2011, "Bayesian Learning via Stochastic Gradient Langevin Dynamics",
  eq. 4), [`sgld_step`][]: ``theta <- theta - eta/2 P grad U~(theta) + sqrt(eta P) z``;
* SGHMC (Chen, Fox & Guestrin 2014, "Stochastic Gradient Hamiltonian Monte Carlo", eq. 15
  with ``beta_hat = 0``, in the parameterisation of Springenberg et al. 2016, "Bayesian
  Optimization with Robust Bayesian Neural Networks"), [`sghmc_step`][]:
  ``v <- (1 - alpha) v - eta P grad U~(theta) + sqrt(2 alpha eta P) z``,
  ``theta <- theta + v``, with the friction ``alpha`` (the momentum decay per step) and
  the learning rate ``eta`` (``epsilon^2`` of Chen et al., whose mass ``M`` is ``P^-1``).

With ``adapt=True`` the preconditioner is ``P = 1 / (V + H_prior + 0.1 mean(V))`` (the mean
over each site's entries), ``V`` an average of the squared stochastic gradient over the
burn-in, frozen after it: an estimate of the diagonal of the empirical Fisher information,
whose inverse preconditions the Langevin dynamics of Ahn, Korattikara & Welling (2012,
"Bayesian Posterior Sampling via Stochastic Gradient Fisher Scoring"), and ``H_prior`` the
prior's curvature (``_Potential.prior_curvature``: a Gaussian prior's precision), which
bounds the step where the likelihood's is small (a classifier that fits every training
point: there the squared gradients vanish, and without it the step would overshoot the
prior's scale). With a fixed ``P`` both rules sample ``exp(-U)`` as ``eta -> 0``; the step
``eta P grad U`` is then in units of the curvature, so one ``eta`` suits every data set and
noise scale (the ``P = V^-1/2`` of Springenberg et al. 2016 and of pSGLD, Li et al. 2016,
leaves a step that grows with the curvature's square root). The last term bounds ``P`` where
a weight's gradient vanishes (a dead unit). ``V`` starts at the spread of the gradients of
the two halves of the data (not at the squared full gradient, which vanishes at a mode), is
an exponential average over ``burn_in / 10`` steps in the first half of the burn-in and the
mean of that and every later step in the second half. Away from a mode the empirical Fisher
information overstates the curvature and the adapted steps are short: start the chain near
one (``init``, as [`SGMCMC`][] does from a MAP fit), or set ``adapt=False``.

Schedules: ``"constant"`` keeps ``eta``; ``"cyclical"`` (Zhang et al. 2020, "Cyclical
Stochastic Gradient MCMC for Bayesian Deep Learning", eq. 1), [`cyclical_step_size`][],
restarts ``eta_k = eta_0/2 (cos(pi mod(k-1, ceil(K/M)) / ceil(K/M)) + 1)`` in each of ``M``
cycles of the ``K`` steps after burn-in; the first part of each cycle explores (no noise, an
optimiser), draws are taken in the rest. Burn-in steps are dropped, and one step in
``thinning`` of the sampling steps is kept.

[`SGMCMC`][] is the zoo's method: it starts every chain at an SVI fit's median (a MAP
point by default), fixes the regression noise there (type-II maximum likelihood, as
[`NUTS`][bnn_zoo.methods.NUTS] does), and serves the draws through ``Predictive`` as
NUTS's are ([`PosteriorSamples`][bnn_zoo.methods.PosteriorSamples]).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

import torch
from pyro import poutine
from pyro.infer.autoguide.initialization import init_to_value
from pyro.infer.mcmc.util import initialize_model
from pyro.ops.integrator import potential_grad
from torch import Tensor

from bnn_zoo._core.checks import (
    check_bool,
    check_choice,
    check_fraction,
    check_positive,
    check_positive_int,
    check_seed,
)
from bnn_zoo._core.handlers import subsample_data
from bnn_zoo.methods._base import Budget, Method, ModelFactory
from bnn_zoo.methods._nuts import NUTS, NUTSPosterior, pooled_posterior, sampler_start
from bnn_zoo.methods._svi import SVI

__all__ = ["PRECONDITIONER_FLOOR", "RULES", "SCHEDULES", "SGMCMC", "check_settings",
           "cyclical_step_size", "sgld_step", "sghmc_step", "sgmcmc_samples", "step_plan"]

RULES = ("sgld", "sghmc")
SCHEDULES = ("constant", "cyclical")
#: The fraction of a site's mean ``V`` added to every ``V`` of the site in the adapted
#: preconditioner: it bounds ``P`` where a weight's gradient vanishes (a dead unit).
PRECONDITIONER_FLOOR = 0.1


def sgld_step(theta: Tensor, grad: Tensor, step_size: float, noise: Tensor,
              precondition: Tensor | float = 1.0) -> Tensor:
    """One SGLD step (Welling & Teh 2011, eq. 4, preconditioned by ``P``):
    ``theta - eta/2 P grad + sqrt(eta P) noise``, ``noise`` standard normal (or zero)."""
    return theta - 0.5 * step_size * precondition * grad + (
        step_size * precondition) ** 0.5 * noise


def sghmc_step(theta: Tensor, momentum: Tensor, grad: Tensor, step_size: float,
               friction: float, noise: Tensor, precondition: Tensor | float = 1.0
               ) -> tuple[Tensor, Tensor]:
    """One SGHMC step (Chen et al. 2014, eq. 15 with ``beta_hat = 0``; mass ``P^-1``):
    ``v' = (1 - alpha) v - eta P grad + sqrt(2 alpha eta P) noise``, ``theta' = theta + v'``.
    Returns ``(theta', v')``."""
    momentum = (1.0 - friction) * momentum - step_size * precondition * grad + (
        2.0 * friction * step_size * precondition) ** 0.5 * noise
    return theta + momentum, momentum


def cyclical_step_size(k: int, total: int, cycles: int, step_size: float) -> float:
    """Zhang et al. (2020), eq. 1: the step size of step ``k`` (1..``total``) in ``cycles``
    cosine cycles, ``eta_0/2 (cos(pi mod(k-1, ceil(K/M)) / ceil(K/M)) + 1)``."""
    length = math.ceil(total / cycles)
    return step_size / 2 * (math.cos(math.pi * ((k - 1) % length) / length) + 1)


def check_settings(*, rule: str, step_size: float, friction: float, burn_in: int, draws: int,
                   thinning: int, schedule: str, cycles: int, exploration: float,
                   adapt: bool) -> None:
    """Refuse a bad sampler setting, naming it (``ValueError`` or ``TypeError``)."""
    check_choice("rule", rule, RULES)
    check_positive("step_size", step_size)
    if check_positive("friction", friction) > 1:
        raise ValueError(f"Expected friction in (0, 1], but got {friction!r}.")
    check_seed("burn_in", burn_in)
    check_positive_int("draws", draws)
    check_positive_int("thinning", thinning)
    check_choice("schedule", schedule, SCHEDULES)
    check_positive_int("cycles", cycles)
    check_fraction("exploration", exploration)
    check_bool("adapt", adapt)
    if draws % cycles:
        raise ValueError(f"Expected draws to be a multiple of cycles (each cycle gives "
                         f"draws / cycles), but got draws={draws}, cycles={cycles}.")
    if schedule == "constant" and cycles != 1:
        raise ValueError(f"Expected cycles=1 with schedule='constant', but got cycles={cycles}.")


def step_plan(*, step_size: float, burn_in: int, draws: int, thinning: int, schedule: str,
              cycles: int, exploration: float) -> Iterator[tuple[float, bool, bool, bool]]:
    """``(step size, noise, burn-in, keep)`` for every step: ``burn_in`` steps at
    ``step_size``, then ``draws * thinning`` sampling steps, one in ``thinning`` kept.
    ``"cyclical"``: each of the ``cycles`` cycles of length ``L = ceil(s / (1 -
    exploration))`` (``s`` its sampling steps) explores (no noise) for its first ``L - s``
    steps and samples in the other ``s``, at [`cyclical_step_size`][] over ``K = cycles
    L``."""
    for _ in range(burn_in):
        yield step_size, True, True, False
    sampling = draws // cycles * thinning
    if schedule == "constant":
        for k in range(1, sampling + 1):
            yield step_size, True, False, k % thinning == 0
        return
    length = math.ceil(sampling / (1.0 - exploration))
    for k in range(1, cycles * length + 1):
        position = (k - 1) % length - (length - sampling)  # >= 0 in the sampling part
        yield (cyclical_step_size(k, cycles * length, cycles, step_size), position >= 0,
               False, position >= 0 and (position + 1) % thinning == 0)


class _Potential:
    """``U`` of ``model(x, y)`` and its gradient at the unconstrained ``params``, on the
    minibatch ``indices`` of the data plate (``None``: all the data)."""

    def __init__(self, model: Callable, x: Tensor, y: Tensor | None,
                 init: Mapping[str, Tensor] | None) -> None:
        self.subsample = subsample_data(torch.arange(x.shape[0], device=x.device))
        start = init_to_value(values=dict(init or {}))
        self.initial, self.potential_fn, self.transforms, _ = initialize_model(
            self.subsample(model), model_args=(x, y), init_strategy=start)
        self.initial = {k: v.detach() for k, v in self.initial.items()}
        self.size = x.shape[0]
        prior = poutine.block(model, hide_fn=lambda site: site.get("is_observed", False))
        self.prior_fn = initialize_model(prior, model_args=(x, y), init_strategy=start)[1]

    def prior_curvature(self, params: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """``|H 1|``, ``H`` the Hessian of the prior's part of ``U`` (``-log p(theta)`` with
        the Jacobians of the unconstrained space) at ``params``: the diagonal of ``H`` where
        the prior is independent across weights (a Gaussian prior's precision), which bounds
        the posterior's curvature from below where the likelihood's is small."""
        leaves = {k: v.detach().requires_grad_() for k, v in params.items()}
        grads = torch.autograd.grad(self.prior_fn(leaves), list(leaves.values()),
                                    create_graph=True)
        total = sum(g.sum() for g in grads)
        curvature = torch.autograd.grad(total, list(leaves.values()), allow_unused=True)
        return {k: torch.zeros_like(v) if h is None else h.detach().abs()
                for (k, v), h in zip(leaves.items(), curvature)}

    def grad(self, params: dict[str, Tensor], indices: Tensor) -> dict[str, Tensor]:
        self.subsample.indices = indices
        grads, energy = potential_grad(self.potential_fn, params)
        if not bool(torch.isfinite(energy)):
            raise ValueError(f"The potential became {float(energy)} while sampling: expected "
                             "a smaller step_size.")
        return grads

    def fisher_diagonal(self, params: dict[str, Tensor],
                        generator: torch.Generator) -> dict[str, Tensor]:
        """``((g_A - g_B) / 2)^2`` of the gradients ``g_A``, ``g_B`` of ``U~`` on the two
        halves of a random split of the data (each scaled by ``N / (N/2)``): an estimate of
        the diagonal of the empirical Fisher information ``sum_n (g_n - g_bar)^2`` that is
        not the squared full gradient, which vanishes at a mode (with a single point: the
        squared gradient)."""
        order = torch.randperm(self.size, generator=generator, device=generator.device)
        if self.size < 2:
            return {k: g.detach() ** 2 for k, g in self.grad(params, order).items()}
        first, second = (self.grad(params, half) for half in order.chunk(2))
        return {k: ((first[k] - second[k]).detach() / 2) ** 2 for k in params}

    def constrained(self, params: Mapping[str, Tensor]) -> dict[str, Tensor]:
        return {k: self.transforms[k].inv(v).detach() for k, v in params.items()}


def _update(rule: str, params: dict[str, Tensor], state: dict[str, Tensor],
            grads: Mapping[str, Tensor], step: float, friction: float, noisy: bool,
            precondition: Mapping[str, Tensor | float], generator: torch.Generator) -> None:
    """Move every site of ``params`` (and its momentum in ``state``) by one ``rule`` step."""
    for name, theta in params.items():
        noise = torch.randn(theta.shape, generator=generator, dtype=theta.dtype,
                            device=theta.device) if noisy else torch.zeros_like(theta)
        if rule == "sgld":
            params[name] = sgld_step(theta, grads[name], step, noise, precondition[name])
        else:
            params[name], state[name] = sghmc_step(theta, state[name], grads[name], step,
                                                   friction, noise, precondition[name])


def sgmcmc_samples(model: Callable, x: Tensor, y: Tensor | None = None, *,
                   rule: str = "sghmc", step_size: float = 1e-3, friction: float = 0.05,
                   burn_in: int = 1000, draws: int = 100, thinning: int = 10,
                   batch_size: int | None = None, schedule: str = "constant", cycles: int = 1,
                   exploration: float = 0.5, adapt: bool = True,
                   init: Mapping[str, Tensor] | None = None, seed: int = 0
                   ) -> dict[str, Tensor]:
    """Draws of ``model(x, y)``'s posterior by SGLD or SGHMC (module doc): site -> (draws,
    *shape), as ``pyro.infer.MCMC.get_samples`` gives them.

    ``model`` is a Pyro model whose likelihood sits in ``pyro.plate("data", len(x))`` and
    that indexes its data with the plate's indices (``with pyro.plate("data", N) as i:
    ... x[i]``), so that ``batch_size`` (``None``: all the points each step) draws a
    minibatch each step, the likelihood scaled by ``N / B``. ``rule`` is ``"sgld"`` or
    ``"sghmc"``, ``step_size`` the learning rate ``eta``, ``friction`` SGHMC's ``alpha`` in
    (0, 1]; ``burn_in`` steps are dropped, then ``draws`` kept, one every ``thinning``
    sampling steps; ``schedule`` ``"constant"`` or ``"cyclical"`` (``cycles`` cycles, each
    exploring for about the fraction ``exploration`` of its steps); ``adapt`` estimates the
    diagonal preconditioner over the burn-in. ``init`` gives starting values of sites
    (the others start as Pyro's ``init_to_uniform``); ``seed`` seeds the noise and the
    minibatches. Pass the draws to ``pyro.infer.Predictive(model,
    guide=PosteriorSamples(draws))`` for the posterior predictive.
    """
    settings = dict(step_size=step_size, burn_in=burn_in, draws=draws, thinning=thinning,
                    schedule=schedule, cycles=cycles, exploration=exploration)
    check_settings(rule=rule, friction=friction, adapt=adapt, **settings)
    check_seed("seed", seed)
    batch = x.shape[0] if batch_size is None else min(
        check_positive_int("batch_size", batch_size), x.shape[0])
    generator = torch.Generator(device=x.device).manual_seed(seed)
    potential = _Potential(model, x, y, init)
    params = dict(potential.initial)
    state = {k: torch.zeros_like(v) for k, v in params.items()}
    squares = potential.fisher_diagonal(params, generator)
    prior = potential.prior_curvature(params)
    precondition: dict[str, Tensor | float] = dict.fromkeys(params, 1.0)
    kept, window, half = [], max(2, burn_in // 10), burn_in // 2
    indices = torch.arange(x.shape[0], device=x.device)
    for k, (step, noisy, burning, keep) in enumerate(step_plan(**settings), start=1):
        if batch < x.shape[0]:
            indices = torch.randperm(x.shape[0], generator=generator, device=x.device)[:batch]
        grads = potential.grad(params, indices)
        if adapt and burning:
            weight = window if k <= half else window + k - half
            for name, g in grads.items():
                squares[name] += (g.detach() ** 2 - squares[name]) / weight
                precondition[name] = 1.0 / (squares[name] + prior[name]
                                            + PRECONDITIONER_FLOOR * squares[name].mean())
        _update(rule, params, state, grads, step, friction, noisy, precondition, generator)
        if keep:
            kept.append(potential.constrained(params))
    return {k: torch.stack([draw[k] for draw in kept]) for k in kept[0]}


@dataclass(frozen=True)
class SGMCMC(Method):
    """SGLD or SGHMC chains on the entry's model, started from the SVI fit ``start``.

    The budget trains the start (every field, as [`SVI`][]), and its ``batch_size``
    is the sampler's minibatch size (``None``: full batch); the other fields are those of
    `sgmcmc_samples`, and ``chains`` chains run one after the other, chain ``c``
    seeded ``seed * chains + c``. The draws of every chain are pooled in a
    `NUTSPosterior` (its R-hat and ESS diagnostics
    included). Fits from tensors only (each step draws a random minibatch of all the
    data), on one process.
    """

    start: SVI
    rule: str = "sghmc"
    step_size: float = 1e-3
    friction: float = 0.05
    burn_in: int = 1000
    draws: int = 100
    thinning: int = 10
    chains: int = 1
    schedule: str = "constant"
    cycles: int = 1
    exploration: float = 0.5
    adapt: bool = True

    def __post_init__(self) -> None:
        check_settings(**self.sampler_settings)
        check_positive_int("chains", self.chains)
        if self.draws < 4:
            raise ValueError(f"Expected draws >= 4 (the chain diagnostics split each chain), "
                             f"but got {self.draws}.")

    @property
    def sampler_settings(self) -> dict[str, Any]:
        """The fields that are keywords of `sgmcmc_samples` (all but ``start`` and
        ``chains``)."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name not in ("start", "chains")}

    def with_guide_options(self, options: Mapping[str, Any]) -> SGMCMC:
        """This method with ``options`` for the guide of its start."""
        return replace(self, start=self.start.with_guide_options(options))

    def fit(self, build_model: ModelFactory, x: Tensor, y: Tensor, *, task: str, seed: int,
            budget: Budget, progress: bool | None) -> NUTSPosterior:
        budget.check_supported(f"SG-MCMC ({self.rule})", distributed=False)
        model, init, noise = sampler_start(self.start, build_model, x, y, task=task, seed=seed,
                                           budget=budget, progress=progress)
        started = time.perf_counter()
        chains = [sgmcmc_samples(model, x, y, batch_size=budget.batch_size, init=init,
                                 seed=seed * self.chains + c, **self.sampler_settings)
                  for c in range(self.chains)]
        return pooled_posterior(model, chains, x, noise, time.perf_counter() - started)

    # The posterior is NUTS's (the model with the fixed noise and the pooled draws), and so
    # is its restoring, which reads none of the method's fields.
    restore = NUTS.restore
