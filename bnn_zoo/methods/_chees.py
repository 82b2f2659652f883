"""ChEES-HMC with SNAPER's criterion: many chains of Hamiltonian Monte Carlo in one
vectorised pass, for the chains of [`HMC`][bnn_zoo.methods.HMC].

The trajectory length is adapted as in ChEES-HMC (Hoffman, Radul & Sountsov 2021, "An
Adaptive-MCMC Scheme for Setting Trajectory Lengths in Hamiltonian Monte Carlo"), the
adaptation made for many chains in lockstep: iteration ``t`` runs ``L_t = ceil(h_t T /
eps)`` leapfrog steps, ``h_t`` the van der Corput (Halton base 2) sequence in (0, 1), and
during warmup ``log T`` climbs a criterion by Adam on its acceptance-weighted gradient
estimate over the chains, in the coordinates ``q = L^-1 theta`` whitened by the mass matrix
(``L L^T`` its inverse, `Metric`; ``v`` the velocity). The criterion is SNAPER's (Sountsov &
Hoffman 2022, "Focusing on Difficult Directions for Learning HMC Trajectory Lengths"):
ChEES, the change in the squared distance from the mean, along the chains' leading principal
component ``z`` alone, ``SNAPER = E[((q' - E q') . z)^2 - ((q - E q) . z)^2)^2]``, with the
per-chain gradient ``h_t (a'_c^2 - a_c^2) a'_c (v'_c . z)``, ``a_c = (q_c - qbar) . z``.
ChEES over all coordinates is dominated by the many directions a diagonal mass matrix
whitens well, and on a network's posterior it settles on trajectories far too short for its
slowest direction (``T`` below 1 where that direction asks for 10 and more). Where the
trajectories it asks for pass ``max_leapfrog`` steps, every iteration runs that many: while
a longer trajectory still helps, the criterion averaged over the jitter,
``E_h[SNAPER(min(h T, max_leapfrog eps))]``, only grows with ``T``, so ``T`` climbs past the
cap and its value then says only that the cap binds. Holding ``T`` at the cap instead would
keep the jitter but halve the mean trajectory, and the slowest direction mixes the worse.

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
from bnn_zoo.methods._metric import Metric

__all__ = ["DIVERGENCE", "HMCRun", "Potential", "chees_hmc", "mass_windows",
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
    chain (C,) over the sampling iterations; for each of the G groups (G,) the final step
    size and trajectory length and the mean acceptance probability; the mean number of
    passes of the potential per sampling iteration (the most steps any group took) and the
    total number of gradient evaluations (each one of all chains)."""

    draws: Tensor
    divergences: Tensor
    step_size: Tensor
    trajectory_length: Tensor
    leapfrog_steps: float
    acceptance: Tensor
    gradients: int


def _leapfrog(potential: Potential, theta: Tensor, p: Tensor, grad: Tensor,
              step_size: Tensor, metric: Metric, steps: list[int]
              ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Each group's ``steps`` (G values, as in `_per_chain`) leapfrog steps of sizes
    ``step_size`` (C, 1) from ``(theta, p)``; returns ``(theta', p', U', grad')``. Every
    pass moves the chains that have steps left; the others stand still until the last has
    taken its own. The number of passes is known on the host: no device sync."""
    counts = _per_chain(steps, theta)
    p = p - 0.5 * step_size * grad
    energy = None
    for step in range(max(steps)):
        moving = step < counts
        theta = torch.where(moving, theta + step_size * metric.velocity(p), theta)
        energy, grad = potential(theta)
        kick = torch.where(step < counts - 1, step_size, 0.5 * step_size)
        p = torch.where(moving, p - kick * grad, p)
    return theta, p, energy, grad


def _group_means(values: Tensor, groups: int) -> Tensor:
    """The mean of each group's consecutive values (C,) -> (G,)."""
    return values.reshape(groups, -1).mean(1)


def _per_chain(values: list[float], like: Tensor) -> Tensor:
    """Each group's value (G values) for each of its chains, as a column (C, 1) like ``like``
    (C, P)."""
    column = torch.tensor(values, dtype=like.dtype, device=like.device)
    return column.repeat_interleave(like.shape[0] // len(values))[:, None]


def _harmonic_means(values: Tensor, groups: int) -> list[float]:
    """Each group's harmonic mean of its chains' acceptance probabilities (C,)."""
    return (1.0 / _group_means(1.0 / values.double().clamp(min=1e-10), groups)).tolist()


@dataclass
class _Adaptation:
    """The warmup's state, one of each per group: the step size and its dual averaging,
    ``log T`` and its Adam; and the metric and the draws of its current window."""

    potential: Potential
    warmup: int
    target: float
    dense: bool
    generator: torch.Generator | None
    metric: Metric
    groups: int = 1
    step_size: list[float] = field(init=False)
    windows: frozenset[int] = field(init=False)
    first: int = field(init=False)
    window: list[Tensor] = field(init=False, default_factory=list)
    log_length: list[_LogAdam] = field(init=False)
    dual: list[_DualAveraging] = field(init=False)
    direction: _Direction = field(init=False)

    def __post_init__(self) -> None:
        self.windows = frozenset(mass_windows(self.warmup))
        self.first = int(0.15 * self.warmup)
        self.step_size = [1.0] * self.groups
        self.log_length = [_LogAdam(0.0) for _ in range(self.groups)]
        self.direction = _Direction.start(self.groups, self.metric.factor)

    def restart(self, theta: Tensor, energy: Tensor, grad: Tensor) -> None:
        """A new step size for the current metric (keeping each ``T / eps``), and its dual
        averaging started afresh."""
        steps = _initial_step_size(self.potential, theta, energy, grad, self.metric,
                                   self.generator, self.groups)
        for log_length, step, old in zip(self.log_length, steps, self.step_size):
            log_length.value += math.log(step / old)
        self.step_size = steps
        self.dual = [_DualAveraging.start(step, self.target) for step in steps]

    @property
    def length(self) -> list[float]:
        return [max(math.exp(log_length.value), step)
                for log_length, step in zip(self.log_length, self.step_size)]

    def leapfrog_steps(self, jitter: float, most: int) -> list[int]:
        """Each group's leapfrog steps ``ceil(h_t T / eps)`` for jitter ``h_t``, in
        [1, most]."""
        return [min(most, max(1, math.ceil(jitter * length / step)))
                for length, step in zip(self.length, self.step_size)]

    def learn(self, t: int, jitter: float, theta: Tensor, proposal: Tensor, p_new: Tensor,
              accept_prob: Tensor) -> None:
        """Warmup iteration ``t``'s updates of each group's step size and ``log T``."""
        self.step_size = [dual.update(accept) for dual, accept
                          in zip(self.dual, _harmonic_means(accept_prob, self.groups))]
        if theta.shape[0] == self.groups:
            return
        centred = _centred(self.metric.whiten(theta), self.groups)
        self.direction.update(centred)
        if t >= self.first:
            gradients = _snaper_gradients(
                jitter, centred, _centred(self.metric.whiten(proposal), self.groups),
                self.metric.whitened_velocity(p_new), accept_prob, self.direction.unit)
            for log_length, gradient in zip(self.log_length, gradients):
                if math.isfinite(gradient):
                    # The gradient with respect to log T is T times that with respect to T.
                    log_length.ascend(gradient * math.exp(log_length.value))

    def keep(self, t: int, theta: Tensor, energy: Tensor, grad: Tensor) -> None:
        """Add warmup iteration ``t``'s state to the window; at a window's end estimate the
        metric from it, and at the warmup's end fix the averaged step sizes."""
        self.window.append(theta)
        if t in self.windows:
            self.metric = Metric.estimate(torch.stack(self.window), dense=self.dense,
                                          groups=self.groups)
            self.window = []
            self.direction.restart()
            self.restart(theta, energy, grad)
        if t == self.warmup - 1:
            self.step_size = [dual.final for dual in self.dual]


def chees_hmc(potential: Potential, init: Tensor, *, warmup: int, samples: int,
              target_accept: float = 0.8, max_leapfrog: int = 256, dense: bool = False,
              progress: bool | None = None, generator: torch.Generator | None = None,
              groups: int = 1) -> HMCRun:
    """Run ``C`` chains of ChEES-HMC with SNAPER's criterion (module doc) from ``init``
    (C, P): ``warmup`` adapting iterations, then ``samples`` kept ones. Every iteration runs
    at most ``max_leapfrog`` leapfrog steps; ``dense``: a dense mass matrix (else diagonal).

    ``groups`` G: the chains are G groups of C/G consecutive chains, each group sampling a
    posterior of its own (the splits of a data set, fitted together) with its own step
    size, trajectory length and diagonal mass matrix, adapted from its own chains alone.
    Each group takes its own ``ceil(h_t T / eps)`` leapfrog steps, the pass costing the most
    any group asks for: a group that went on with the longest would measure SNAPER's
    gradient at another time than ``h_t T``, and its ``T`` would shrink towards one step."""
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
    acceptance = torch.zeros(groups, dtype=torch.float64, device=theta.device)
    show = sys.stderr.isatty() if progress is None else progress
    for t in tqdm(range(warmup + samples), desc="HMC", disable=not show, leave=False):
        jitter = van_der_corput(t + 1)
        steps = adapt.leapfrog_steps(jitter, max_leapfrog)
        passes = max(steps)
        p = adapt.metric.momentum(torch.randn(theta.shape, dtype=theta.dtype,
                                              device=theta.device, generator=generator))
        proposal, p_new, energy_new, grad_new = _leapfrog(
            potential, theta, p, grad, _per_chain(adapt.step_size, theta), adapt.metric, steps)
        gradients += passes
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
        steps_taken += passes
        acceptance += _group_means(accept_prob.double(), groups)
    return HMCRun(draws, divergences, torch.tensor(adapt.step_size, dtype=torch.float64),
                  torch.tensor(adapt.length, dtype=torch.float64), steps_taken / samples,
                  acceptance.cpu() / samples, gradients)


@dataclass
class _Direction:
    """SNAPER's estimate of each group's leading principal component in the whitened
    coordinates (G, P): power iteration on the chains' covariance, ``z <- C z / |C z|``, with
    ``C z`` averaged over the iterations since the metric last changed (weight
    ``1/(t + 1)``, at least ``1/100``), the unit direction before them its first term."""

    average: Tensor
    t: int = 0

    @classmethod
    def start(cls, groups: int, like: Tensor) -> _Direction:
        """The direction of ones in every group."""
        return cls(torch.ones(groups, like.shape[-1], dtype=like.dtype, device=like.device)
                   / math.sqrt(like.shape[-1]))

    @property
    def unit(self) -> Tensor:
        return self.average / self.average.norm(dim=-1, keepdim=True).clamp(min=1e-30)

    def restart(self) -> None:
        """Start averaging afresh from the current direction (the metric changed)."""
        self.average, self.t = self.unit, 0

    def update(self, centred: Tensor) -> None:
        """One iteration's centred whitened chains (G, n, P)."""
        product = ((centred @ self.unit[..., None]) * centred).mean(1)
        self.t += 1
        weight = 1.0 / min(self.t + 1, 100)
        self.average = (1 - weight) * self.average + weight * product


def _centred(q: Tensor, groups: int) -> Tensor:
    """Whitened chains (C, P) less their group's mean, as (G, C/G, P)."""
    by_group = q.reshape(groups, -1, q.shape[-1])
    return by_group - by_group.mean(1, keepdim=True)


def _snaper_gradients(jitter: float, centred: Tensor, centred_new: Tensor, velocity: Tensor,
                      accept_prob: Tensor, direction: Tensor) -> list[float]:
    """Each group's acceptance-weighted SNAPER gradient estimate with respect to ``T``
    (module doc) from the centred whitened chains before and after (G, n, P), the whitened
    velocities after and the unit directions (G, P); NaN for a group none of whose chains
    gives a usable estimate."""
    along, along_new = centred @ direction[..., None], centred_new @ direction[..., None]
    speed = velocity.reshape(centred.shape) @ direction[..., None]
    gradient = (jitter * (along_new.square() - along.square()) * along_new * speed)[..., 0]
    accept = accept_prob.reshape(gradient.shape)
    usable = torch.isfinite(gradient) & (accept > 0)
    weights = torch.where(usable, accept, torch.zeros_like(accept))
    weighted = weights * torch.where(usable, gradient, torch.zeros_like(gradient))
    return (weighted.sum(1).double() / weights.sum(1).double()).tolist()


def _initial_step_size(potential: Potential, theta: Tensor, energy: Tensor, grad: Tensor,
                       metric: Metric, generator: torch.Generator | None, groups: int
                       ) -> list[float]:
    """Hoffman & Gelman (2014), Algorithm 4, for each group: double or halve ``eps`` from 1
    until one leapfrog step's harmonic-mean acceptance probability crosses 1/2."""
    def accept(steps: list[float]) -> list[float]:
        p = metric.momentum(torch.randn(theta.shape, dtype=theta.dtype, device=theta.device,
                                        generator=generator))
        _, p_new, energy_new, _ = _leapfrog(potential, theta, p, grad,
                                            _per_chain(steps, theta), metric, [1] * groups)
        error = (energy_new + metric.kinetic(p_new)
                 - energy - metric.kinetic(p)).nan_to_num(math.inf, math.inf)
        return _harmonic_means(torch.exp(-error.clamp(min=0)), groups)

    step_size = [1.0] * groups
    direction = [1.0 if a > 0.5 else -1.0 for a in accept(step_size)]
    going = [True] * groups
    for _ in range(100):
        trial = [s * 2.0 ** d if g else s for s, d, g in zip(step_size, direction, going)]
        for group, a in enumerate(accept(trial)):
            if going[group] and (a > 0.5) != (direction[group] > 0):
                going[group] = False
            elif going[group]:
                step_size[group] = trial[group]
        if not any(going):
            break
    return [s if d > 0 else s / 2 for s, d in zip(step_size, direction)]
