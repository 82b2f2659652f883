"""ChEES-HMC: many chains of Hamiltonian Monte Carlo in lockstep, for the vectorised
chains of [`HMC`][bnn_zoo.methods.HMC].

The trajectory length is set by ChEES-HMC (Hoffman, Radul & Sountsov 2021, "An Adaptive-MCMC
Scheme for Setting Trajectory Lengths in Hamiltonian Monte Carlo"), the adaptation made for
many chains in lockstep: iteration ``t`` runs ``L_t = ceil(h_t T / eps)`` leapfrog steps, ``h_t``
the van der Corput (Halton base 2) sequence in (0, 1), and during warmup ``log T`` climbs
the change in the estimated squared jump distance,
``ChEES = 1/4 E[(|q' - E q'|^2 - |q - E q|^2)^2]``, by Adam on the acceptance-weighted
gradient estimate over the chains (their eq. 6), ``h_t (|q'_c - qbar'|^2 - |q_c - qbar|^2)
(q'_c - qbar') . v'_c``, in the coordinates ``q = L^-1 theta`` whitened by the mass
matrix (``L L^T`` its inverse, [`Metric`][]; ``v`` the velocity).

The step size follows the dual averaging of Hoffman & Gelman (2014, "The No-U-Turn Sampler",
Algorithm 5) on the harmonic mean of the chains' acceptance probabilities (ChEES-HMC's
choice: one stuck chain pulls it down), and the inverse mass matrix is the variance (or
covariance) of the draws of all chains in Stan's expanding windows (Stan Reference Manual,
"HMC algorithm parameters"), regularised towards ``1e-3`` as Stan does; after each window
the step size restarts and the trajectory length keeps its leapfrog steps. A transition
whose energy error exceeds ``DIVERGENCE`` is divergent (Stan's threshold) and rejected.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor
from tqdm.auto import tqdm

from bnn_zoo._core.checks import check_fraction, check_positive_int

__all__ = ["DIVERGENCE", "HMCRun", "Metric", "Potential", "chees_hmc", "mass_windows",
           "van_der_corput"]

#: ``theta (C, P) -> (U (C,), grad U (C, P))``: the potential of C chains and its gradient.
Potential = Callable[[Tensor], tuple[Tensor, Tensor]]

#: An energy error above this many nats marks a divergent transition (Stan's threshold).
DIVERGENCE = 1000.0


def van_der_corput(n: int) -> float:
    """The ``n``-th (``n >= 1``) element of the base-2 van der Corput sequence in (0, 1):
    ``n``'s binary digits mirrored about the point (1 -> 0.5, 2 -> 0.25, 3 -> 0.75...)."""
    value, scale = 0.0, 0.5
    while n:
        value += scale * (n & 1)
        n >>= 1
        scale /= 2
    return value


def mass_windows(warmup: int) -> list[int]:
    """The iterations (0-based) after which the mass matrix is re-estimated: Stan's windows,
    a first 15% adapting the step size only, then windows of 25, 50, 100... iterations (the
    last stretched to the end), then a last 10% adapting the step size only. A short warmup
    (under 20 iterations) keeps the unit mass matrix."""
    first, last = int(0.15 * warmup), int(0.1 * warmup)
    ends, start, size = [], first, 25
    end_slow = warmup - last
    while start < end_slow and warmup >= 20:
        end = start + size
        if end + 2 * size > end_slow:
            end = end_slow
        ends.append(end - 1)
        start, size = end, 2 * size
    return ends


@dataclass
class _DualAveraging:
    """Nesterov's dual averaging of the log step size (Hoffman & Gelman 2014, Algorithm 5,
    with their ``gamma = 0.05``, ``t0 = 10``, ``kappa = 0.75``)."""

    target: float
    mu: float
    t: int = 0
    error_sum: float = 0.0
    log_average: float = 0.0

    @classmethod
    def start(cls, step_size: float, target: float) -> _DualAveraging:
        return cls(target=target, mu=math.log(10 * step_size))

    def update(self, accept: float) -> float:
        """Feed one iteration's acceptance statistic; return the next step size."""
        self.t += 1
        self.error_sum += self.target - accept
        log_step = self.mu - math.sqrt(self.t) / 0.05 * self.error_sum / (self.t + 10)
        weight = self.t ** -0.75
        self.log_average = weight * log_step + (1 - weight) * self.log_average
        return math.exp(log_step)

    @property
    def final(self) -> float:
        return math.exp(self.log_average)


@dataclass
class _LogAdam:
    """Adam ascending ``log T`` (ChEES-HMC: learning rate 0.025, ``beta1 = 0``,
    ``beta2 = 0.95``)."""

    value: float
    lr: float = 0.025
    beta2: float = 0.95
    second: float = 0.0
    t: int = 0

    def ascend(self, gradient: float) -> float:
        self.t += 1
        self.second = self.beta2 * self.second + (1 - self.beta2) * gradient ** 2
        corrected = self.second / (1 - self.beta2 ** self.t)
        self.value += self.lr * gradient / (math.sqrt(corrected) + 1e-8)
        return self.value


@dataclass
class HMCRun:
    """What [`chees_hmc`][] returns: ``draws`` (C, S, P), the divergent transitions of each
    chain (C,) over the sampling iterations, the final step size and trajectory length, the
    mean number of leapfrog steps per sampling iteration, the mean acceptance probability
    and the total number of gradient evaluations (each one of all chains)."""

    draws: Tensor
    divergences: Tensor
    step_size: float
    trajectory_length: float
    leapfrog_steps: float
    acceptance: float
    gradients: int


@dataclass
class Metric:
    """The inverse mass matrix ``Sigma = L L^T`` of the kinetic energy ``p^T Sigma p / 2``:
    ``factor`` the scales ``(P,)`` of a diagonal one (or (C, P), one row per chain, for
    chains in groups) or, with ``dense``, the lower Cholesky factor ``L`` (P, P) of a dense
    one. Momenta are rows (C, P): ``p ~ N(0, Sigma^-1)``, velocity ``Sigma p``, whitened
    position ``q = L^-1 theta`` and velocity ``L^T p``."""

    factor: Tensor
    dense: bool = False

    @classmethod
    def unit(cls, like: Tensor) -> Metric:
        return cls(torch.ones(like.shape[-1], dtype=like.dtype, device=like.device))

    @classmethod
    def estimate(cls, window: Tensor, *, dense: bool, groups: int = 1) -> Metric:
        """The covariance (or variances) of a window of draws (W, C, P) of all chains
        pooled, regularised as Stan does, ``n/(n+5) S + 1e-3 * 5/(n+5) I`` over ``n``
        draws. Pooled over the chains, as ChEES-HMC's metric is: ChEES measures the chains'
        jumps against their spread, in the coordinates this metric whitens. With ``groups``
        G > 1 (diagonal only), the C chains are G groups of C/G consecutive ones, each
        sampling a posterior of its own: each group's variances pool its own chains, and
        ``factor`` is (C, P), each chain with its group's scales."""
        if groups > 1 and dense:
            raise ValueError("Expected a diagonal metric for chains in groups, but got "
                             "dense=True.")
        draws, chains, size = window.shape
        by_group = window.reshape(draws, groups, chains // groups, size).transpose(0, 1)
        n = draws * (chains // groups)
        centred = (by_group - by_group.mean((1, 2), keepdim=True)).reshape(groups, n, size)
        shrink, floor = n / (n + 5.0), 1e-3 * 5.0 / (n + 5.0)
        if not dense:
            scales = (shrink * centred.square().sum(1) / (n - 1) + floor).sqrt()
            return cls(scales[0] if groups == 1
                       else scales.repeat_interleave(chains // groups, 0))
        cov = shrink * centred[0].T @ centred[0] / (n - 1)
        cov.diagonal().add_(floor)
        return cls(torch.linalg.cholesky(cov), dense=True)

    def momentum(self, z: Tensor) -> Tensor:
        """``p = L^-T z`` of standard normal rows ``z``: a draw of ``N(0, Sigma^-1)``."""
        if not self.dense:
            return z / self.factor
        return torch.linalg.solve_triangular(self.factor, z, upper=False, left=False)

    def velocity(self, p: Tensor) -> Tensor:
        """``Sigma p``."""
        if not self.dense:
            return self.factor.square() * p
        return (p @ self.factor) @ self.factor.T

    def kinetic(self, p: Tensor) -> Tensor:
        """``p^T Sigma p / 2`` of every chain."""
        return 0.5 * (p * self.velocity(p)).sum(1)

    def whiten(self, theta: Tensor) -> Tensor:
        """``q = L^-1 theta``."""
        if not self.dense:
            return theta / self.factor
        return torch.linalg.solve_triangular(self.factor.T, theta, upper=True, left=False)

    def whitened_velocity(self, p: Tensor) -> Tensor:
        """``dq/dt = L^T p``."""
        return self.factor * p if not self.dense else p @ self.factor


def _leapfrog(potential: Potential, theta: Tensor, p: Tensor,
              grad: Tensor, step_size: float, metric: Metric, steps: int
              ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``steps`` leapfrog steps from ``(theta, p)``; returns ``(theta', p', U', grad')``."""
    p = p - 0.5 * step_size * grad
    energy = None
    for step in range(steps):
        theta = theta + step_size * metric.velocity(p)
        energy, grad = potential(theta)
        p = p - (step_size if step < steps - 1 else 0.5 * step_size) * grad
    return theta, p, energy, grad


def _harmonic_mean(values: Tensor) -> float:
    return float(values.numel() / (1.0 / values.clamp(min=1e-10)).sum())


@dataclass
class _Adaptation:
    """The warmup's state: the step size and its dual averaging, ``log T`` and its Adam,
    the metric and the draws of its current window."""

    potential: Potential
    warmup: int
    target: float
    dense: bool
    generator: torch.Generator | None
    metric: Metric
    groups: int = 1
    step_size: float = 1.0
    windows: frozenset[int] = field(init=False)
    first: int = field(init=False)
    window: list[Tensor] = field(init=False, default_factory=list)
    log_length: _LogAdam = field(init=False, default_factory=lambda: _LogAdam(0.0))
    dual: _DualAveraging = field(init=False)

    def __post_init__(self) -> None:
        self.windows = frozenset(mass_windows(self.warmup))
        self.first = int(0.15 * self.warmup)

    def restart(self, theta: Tensor, energy: Tensor, grad: Tensor) -> None:
        """A new step size for the current metric (keeping ``T / eps``), and its dual
        averaging started afresh."""
        step = _initial_step_size(self.potential, theta, energy, grad, self.metric,
                                  self.generator)
        self.log_length.value += math.log(step / self.step_size)
        self.step_size = step
        self.dual = _DualAveraging.start(step, self.target)

    @property
    def length(self) -> float:
        return max(math.exp(self.log_length.value), self.step_size)

    def learn(self, t: int, jitter: float, theta: Tensor, proposal: Tensor, p_new: Tensor,
              accept_prob: Tensor) -> None:
        """Warmup iteration ``t``'s updates of the step size and ``log T``."""
        self.step_size = self.dual.update(_harmonic_mean(accept_prob))
        if t >= self.first and theta.shape[0] > self.groups:
            _ascend_chees(self.log_length, jitter, theta, proposal, p_new, accept_prob,
                          self.metric, self.groups)

    def keep(self, t: int, theta: Tensor, energy: Tensor, grad: Tensor) -> None:
        """Add warmup iteration ``t``'s state to the window; at a window's end estimate the
        metric from it, and at the warmup's end fix the averaged step size."""
        self.window.append(theta)
        if t in self.windows:
            self.metric = Metric.estimate(torch.stack(self.window), dense=self.dense,
                                          groups=self.groups)
            self.window = []
            self.restart(theta, energy, grad)
        if t == self.warmup - 1:
            self.step_size = self.dual.final


def chees_hmc(potential: Potential, init: Tensor, *, warmup: int, samples: int,
              target_accept: float = 0.8, max_leapfrog: int = 256, dense: bool = False,
              progress: bool | None = None, generator: torch.Generator | None = None,
              groups: int = 1) -> HMCRun:
    """Run ``C`` chains of ChEES-HMC (module doc) from ``init`` (C, P): ``warmup`` adapting
    iterations, then ``samples`` kept ones. Every iteration runs at most ``max_leapfrog``
    leapfrog steps; ``dense``: a dense mass matrix (else diagonal).

    ``groups`` G: the chains are G groups of C/G consecutive chains, each group sampling a
    posterior of its own (the splits of a data set, fitted together): they share the step
    size and the trajectory length, while each group has its own diagonal mass matrix and
    ChEES centres each chain on its own group's mean."""
    check_positive_int("warmup", warmup)
    check_positive_int("groups", groups)
    if init.shape[0] % groups:
        raise ValueError(f"Expected the chains of init ({init.shape[0]}) to be a multiple of "
                         f"groups ({groups}).")
    check_positive_int("samples", samples)
    check_fraction("target_accept", target_accept)
    check_positive_int("max_leapfrog", max_leapfrog)
    theta = init.detach().clone()
    energy, grad = potential(theta)
    if not torch.isfinite(energy).all():
        raise ValueError("Expected a finite potential at every chain's start.")
    adapt = _Adaptation(potential, warmup, target_accept, dense, generator, Metric.unit(theta),
                        groups)
    adapt.restart(theta, energy, grad)
    draws = theta.new_empty(theta.shape[0], samples, theta.shape[1])
    divergences = torch.zeros(theta.shape[0], dtype=torch.long, device=theta.device)
    steps_taken, gradients = 0, 0
    # Summed on the device (in float64, as Python's floats would), read back once.
    acceptance = torch.zeros((), dtype=torch.float64, device=theta.device)
    show = sys.stderr.isatty() if progress is None else progress
    for t in tqdm(range(warmup + samples), desc="HMC", disable=not show, leave=False):
        jitter = van_der_corput(t + 1)
        steps = min(max_leapfrog, max(1, math.ceil(jitter * adapt.length / adapt.step_size)))
        p = adapt.metric.momentum(torch.randn(theta.shape, dtype=theta.dtype,
                                              device=theta.device, generator=generator))
        proposal, p_new, energy_new, grad_new = _leapfrog(
            potential, theta, p, grad, adapt.step_size, adapt.metric, steps)
        gradients += steps
        error = (energy_new + adapt.metric.kinetic(p_new)
                 - energy - adapt.metric.kinetic(p)).nan_to_num(math.inf, math.inf)
        accept_prob = torch.exp(-error.clamp(min=0))
        accepted = torch.rand(theta.shape[0], dtype=theta.dtype, device=theta.device,
                              generator=generator) < accept_prob
        if t < warmup:
            adapt.learn(t, jitter, theta, proposal, p_new, accept_prob)
        theta = torch.where(accepted[:, None], proposal, theta)
        energy = torch.where(accepted, energy_new, energy)
        grad = torch.where(accepted[:, None], grad_new, grad)
        if t < warmup:
            adapt.keep(t, theta, energy, grad)
            continue
        draws[:, t - warmup] = theta
        divergences += (error > DIVERGENCE).long()
        steps_taken += steps
        acceptance += accept_prob.mean().double()
    return HMCRun(draws, divergences, adapt.step_size, adapt.length, steps_taken / samples,
                  float(acceptance) / samples, gradients)


def _ascend_chees(log_length: _LogAdam, jitter: float, theta: Tensor, proposal: Tensor,
                  p_new: Tensor, accept_prob: Tensor, metric: Metric, groups: int = 1) -> None:
    """One Adam step of ``log T`` up the acceptance-weighted ChEES gradient estimate
    (module doc), in the coordinates whitened by the mass matrix, each chain centred on the
    mean of its group (`chees_hmc`)."""
    def centre(q: Tensor) -> Tensor:
        by_group = q.reshape(groups, -1, q.shape[-1])
        return (by_group - by_group.mean(1, keepdim=True)).reshape(q.shape)

    centred, centred_new = centre(metric.whiten(theta)), centre(metric.whiten(proposal))
    change = centred_new.square().sum(1) - centred.square().sum(1)
    gradient = jitter * change * (centred_new * metric.whitened_velocity(p_new)).sum(1)
    usable = torch.isfinite(gradient) & (accept_prob > 0)
    if not bool(usable.any()):
        return
    weights = torch.where(usable, accept_prob, torch.zeros_like(accept_prob))
    estimate = float((weights * gradient.nan_to_num(0.0)).sum() / weights.sum())
    # The gradient with respect to log T is T times that with respect to T.
    log_length.ascend(estimate * math.exp(log_length.value))


def _initial_step_size(potential: Potential, theta: Tensor,
                       energy: Tensor, grad: Tensor, metric: Metric,
                       generator: torch.Generator | None) -> float:
    """Hoffman & Gelman (2014), Algorithm 4: double or halve ``eps`` from 1 until one
    leapfrog step's harmonic-mean acceptance probability crosses 1/2."""
    step_size = 1.0

    def accept(step: float) -> float:
        p = metric.momentum(torch.randn(theta.shape, dtype=theta.dtype, device=theta.device,
                                        generator=generator))
        _, p_new, energy_new, _ = _leapfrog(potential, theta, p, grad, step, metric, 1)
        error = (energy_new + metric.kinetic(p_new)
                 - energy - metric.kinetic(p)).nan_to_num(math.inf, math.inf)
        return _harmonic_mean(torch.exp(-error.clamp(min=0)))

    direction = 1.0 if accept(step_size) > 0.5 else -1.0
    for _ in range(100):
        trial = step_size * 2.0 ** direction
        if (accept(trial) > 0.5) != (direction > 0):
            break
        step_size = trial
    return step_size if direction > 0 else step_size / 2


