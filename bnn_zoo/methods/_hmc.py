"""Hamiltonian Monte Carlo with many chains in one vectorised pass: the zoo's reference.

The chains are replicas of one model (`bnn_zoo._core.replicas`): chain ``c``'s weights are
index ``c`` of every site of ``model.replicated(C)``, so one full-batch evaluation of the
potential ``U_c(theta_c) = -log p(theta_c) - sum_n log p(y_n | x_n, theta_c)`` and its
gradient serves all ``C`` chains ([`ChainPotential`][], captured once as one graph and compiled
by ``torch.compile``).
The sampler, ChEES-HMC with SNAPER's trajectory criterion ([`bnn_zoo.methods._chees`][]),
moves all chains in the same passes of the potential, so a GPU runs 64 chains for little
more than the cost of one. The splits of a data set sample together in the same way
([`HMC.fit_many`][]): their chains in groups, each group with its own data, noise, step
size, trajectory length, mass matrix and number of leapfrog steps (a group that has taken
its steps stands still while the others go on).
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pyro
import torch
from pyro import poutine
from pyro.distributions import constraints
from pyro.distributions.transforms import Transform, biject_to
from pyro.poutine.util import site_is_subsample
from torch import Tensor
from torch.fx.experimental.proxy_tensor import make_fx

from bnn_zoo._core.checks import check_bool, check_fraction, check_positive, check_positive_int
from bnn_zoo._core.lbfgs import LBFGSResult, minimize_lbfgs
from bnn_zoo._core.tasks import task_named
from bnn_zoo.guides._flat_sites import flatten_sites, unflatten_sites
from bnn_zoo.methods._base import Budget, Method, ModelFactory, UnsupportedProblem
from bnn_zoo.methods._chees import HMCRun, chees_hmc
from bnn_zoo.methods._nuts import NUTSPosterior, map_start, pooled_posterior, restore_samples
from bnn_zoo.methods._svi import SVI

__all__ = ["HMC", "ChainPotential", "HeldOutNoise", "MapNoise", "SampledNoise", "draw_chunks",
           "full_batch_map"]


def _scored(site: dict) -> bool:
    """Whether a trace's site adds to the log joint: a sample site, not a plate's
    subsample site nor a ``pyro.deterministic`` record."""
    return (site["type"] == "sample" and not site_is_subsample(site)
            and not site["infer"].get("_deterministic"))


class ChainPotential:
    """``theta (C, P) -> (U (C,), grad U (C, P))``: the potential of ``C`` chains of
    ``model`` (a model with ``replicated``, such as
    [`BayesianMLP`][bnn_zoo.models.BayesianMLP]) on the full data ``x`` (N, D), ``y``.

    Data sets of one size in groups, ``x`` (G, N, D) and ``y`` (G, N), give ``chains``
    chains to each: ``C = G * chains`` rows, group ``g``'s the ``chains`` consecutive ones
    from ``g * chains``, each seeing only ``x[g]``, ``y[g]``; ``noise`` (G,) then fixes each
    group's noise scale in place of the model's (which must be fixed).

    ``theta`` holds every latent sample site of the model, flattened in the order of
    [`sites`][] (name and event shape), in Pyro's unconstrained space: a site of another
    support (a sampled noise scale, positive) is ``biject_to(support)`` of its coordinates,
    and the potential adds minus the log Jacobian of that map. [`values`][] and
    [`flatten`][] map to and from the sites' own values. The log density sums the sites'
    log densities except over the chain (replica) dimension.

    With ``jit=True`` the value and the gradient are captured at the first call as one
    graph of tensor operations (``make_fx`` runs Pyro's handlers and autograd's backward
    once) and compiled by ``torch.compile`` (on a CPU, fused C++ loops: on a small network
    the uncompiled potential is mostly per-operation overhead). It needs the C++ compiler
    (a GPU: Triton) that ``torch.compile`` needs; ``jit=False`` runs Pyro's trace and
    autograd at every call.
    """

    def __init__(self, model: Callable, x: Tensor, y: Tensor, chains: int, *,
                 noise: Tensor | None = None, jit: bool = True) -> None:
        check_positive_int("chains", chains)
        if not hasattr(model, "replicated"):
            raise TypeError(f"Expected a model with replicated() (a BayesianMLP), got "
                            f"{type(model).__name__}.")
        self.groups = x.shape[0] if x.dim() == 3 else 1
        self.chains = self.groups * chains
        self.model = model.replicated(self.chains)
        if x.dim() == 3:
            self.x, self.y = x.repeat_interleave(chains, 0), y.repeat_interleave(chains, 0)
        else:
            self.x, self.y = x.expand(chains, *x.shape), y.expand(chains, *y.shape)
        if noise is not None:
            if getattr(self.model, "learn_noise", True):
                raise ValueError("Expected a model with a fixed noise scale to take noise.")
            self.model.fixed_noise_scale = noise.to(x).repeat_interleave(chains)[:, None]
        with pyro.get_param_store().scope(), torch.no_grad():
            trace = poutine.trace(self.model).get_trace(self.x, self.y)
        self.sites: list[tuple[str, torch.Size]] = []
        #: The constrained sites' maps from their coordinates to their values.
        self.transforms: dict[str, Transform] = {}
        for name, site in trace.nodes.items():
            if not _scored(site) or site["is_observed"]:
                continue
            support = site["fn"].support
            while isinstance(support, constraints.independent):
                support = support.base_constraint
            if support is not constraints.real:
                self.transforms[name] = biject_to(site["fn"].support)
            self.sites.append((name, site["value"].shape[2:]))
        self.dim = sum(math.prod(shape) for _, shape in self.sites)
        self.jit = jit
        self._compiled: Callable[[Tensor], Tensor] | None = None

    def coordinates(self, theta: Tensor) -> dict[str, Tensor]:
        """The sites' unconstrained coordinates ``(*lead, *event)`` of flat ``theta``
        (*lead, P)."""
        return unflatten_sites(self.sites, theta)

    def values(self, theta: Tensor) -> dict[str, Tensor]:
        """The sites' values ``(*lead, *event)`` of flat ``theta`` (*lead, P)."""
        return {name: self.transforms[name](u) if name in self.transforms else u
                for name, u in self.coordinates(theta).items()}

    def unflatten(self, theta: Tensor) -> dict[str, Tensor]:
        """The sites' values ``(C, 1, *event)`` (the replica plate's shape) of ``theta``."""
        return {name: v.unsqueeze(1) for name, v in self.values(theta).items()}

    def flatten(self, values: dict[str, Tensor]) -> Tensor:
        """``theta`` (C, P) of per-chain site values ``name -> (C, *event)``."""
        return flatten_sites(self.sites, {
            name: self.transforms[name].inv(v) if name in self.transforms else v
            for name, v in values.items()})

    def energy(self, theta: Tensor) -> Tensor:
        """``U (C,)``: minus each chain's log joint density at ``theta``; ``inf`` or NaN
        where a chain's trajectory diverged (Pyro's validation, off here, would raise
        there, while the sampler rejects the proposal)."""
        conditioned = poutine.condition(self.model, data=self.unflatten(theta))
        with pyro.get_param_store().scope(), pyro.validation_enabled(False):
            trace = poutine.trace(conditioned).get_trace(self.x, self.y)
            trace.compute_log_prob()
        total = torch.zeros(self.chains, dtype=theta.dtype, device=theta.device)
        coordinates = self.coordinates(theta)
        for name, transform in self.transforms.items():
            u = coordinates[name]
            total = total + transform.log_abs_det_jacobian(u, transform(u)).reshape(
                self.chains, -1).sum(1)
        for name, site in trace.nodes.items():
            if not _scored(site):
                continue
            log_prob = site["log_prob"]
            if log_prob.dim() == 0 or log_prob.shape[0] != self.chains:
                raise ValueError(f"Expected site {name!r} inside the replica plate, with a "
                                 f"leading dimension {self.chains}, but its log density has "
                                 f"shape {tuple(log_prob.shape)}.")
            total = total + log_prob.reshape(self.chains, -1).sum(1)
        return -total

    def __call__(self, theta: Tensor) -> tuple[Tensor, Tensor]:
        if not self.jit:
            return self.value_and_grad(theta)
        if self._compiled is None:
            graph = make_fx(lambda theta: self.value_and_grad(theta))(theta)
            self._compiled = torch.compile(graph, dynamic=False, fullgraph=True)
            with warnings.catch_warnings():
                # torch.compile's first call imports torch.utils.mkldnn, whose
                # torch.jit.script_method is deprecated in torch itself.
                warnings.filterwarnings("ignore", ".*torch.jit.script_method.* is deprecated",
                                        DeprecationWarning)
                return self._compiled(theta)
        return self._compiled(theta)

    def value_and_grad(self, theta: Tensor) -> tuple[Tensor, Tensor]:
        """``U (C,)`` (`energy`) and ``grad U (C, P)`` at ``theta``, by autograd."""
        theta = theta.detach().requires_grad_(True)
        energy = self.energy(theta)
        grad, = torch.autograd.grad(energy.sum(), theta)
        return energy.detach(), grad


def draw_chunks(run: HMCRun, potential: ChainPotential) -> Iterator[dict[str, Tensor]]:
    """Each chain's draws as site values ``name -> (S, *event)``."""
    for chain in run.draws:
        yield potential.values(chain)


def full_batch_map(model: Callable, init: dict[str, Tensor], x: Tensor, y: Tensor, *,
                   max_iter: int) -> tuple[dict[str, Tensor], dict[str, float], LBFGSResult]:
    """The MAP point of ``model`` on all of ``x``, ``y``, from the site values ``init``
    (``name -> event``): full-batch L-BFGS ([`minimize_lbfgs`][bnn_zoo._core.lbfgs.minimize_lbfgs])
    on ``-log p(theta, y | x)`` over the weights and, jointly, the model's learned
    parameters (a regression's noise scale). Returns the refined site values, the model
    options that fix the noise at its MAP value (empty for classification) and L-BFGS's
    result."""
    potential = ChainPotential(model, x, y, 1, jit=False)
    params = list(potential.model.parameters())
    theta = potential.flatten({k: v[None] for k, v in init.items()})
    start = torch.cat([theta.reshape(-1)] + [p.detach().reshape(-1) for p in params])
    sizes = [potential.dim] + [p.numel() for p in params]

    def objective(z: Tensor) -> tuple[Tensor, Tensor]:
        chunks = z.split(sizes)
        with torch.no_grad():
            for param, value in zip(params, chunks[1:]):
                param.copy_(value.reshape(param.shape))
        weights = chunks[0].reshape(1, -1).detach().requires_grad_(True)
        energy = potential.energy(weights).sum()
        grads = torch.autograd.grad(energy, [weights, *params])
        return energy.detach(), torch.cat([g.reshape(-1) for g in grads])

    result = minimize_lbfgs(objective, start, max_iter=max_iter, tolerance_grad=1e-5)
    objective(result.x)  # leave the parameters at the optimum
    values = potential.values(result.x[:potential.dim])
    noise = {}
    if _learns_noise(model):
        with pyro.get_param_store().scope(), torch.no_grad():
            noise["noise_scale"] = float(potential.model.observation_scale())
    return values, noise, result


@dataclass(frozen=True)
class MapNoise:
    """The chains' regression noise scale fixed at the full-batch MAP's, estimated jointly
    with the weights (`full_batch_map`): the chains sample ``p(w | D, sigma_MAP)``."""

    def start(self, build_model: ModelFactory, model: Callable, init: dict[str, Tensor],
              x: Tensor, y: Tensor, *, seed: int, max_iter: int
              ) -> tuple[dict[str, Tensor], dict[str, float], LBFGSResult]:
        """The chains' start on ``x``, ``y`` from the fit ``model`` at ``init``: the site
        values, the model options that fix the noise, and L-BFGS's result."""
        return full_batch_map(model, init, x, y, max_iter=max_iter)


@dataclass(frozen=True)
class HeldOutNoise:
    """The chains' noise scale fixed at the value tuned on held-out points, as the
    approximations' is (``entry.fit(..., validation=...)``): the full-batch MAP of all
    but a random ``fraction`` of the points (drawn from the fit's seed), then the ``sigma``
    that maximises the held-out log-likelihood of its predictions (the root mean squared
    held-out residual, as `bnn_zoo.evaluation.tune_noise` finds it).
    The chains sample ``p(w | D, sigma)`` on all the points, from the MAP of all of them at
    that ``sigma``. A model without a learned homoscedastic noise (a classifier, a fixed or
    a heteroscedastic noise) has no scale to tune: its chains start at the MAP, as with
    [`MapNoise`][bnn_zoo.methods.MapNoise]. The ``hmc`` entry's choice: its posterior is
    the one the approximations, whose noise is tuned on held-out points too, approximate."""

    fraction: float = 0.1

    def __post_init__(self) -> None:
        if check_fraction("fraction", self.fraction) == 0:
            raise ValueError("Expected fraction in (0, 1), but got 0.")

    def start(self, build_model: ModelFactory, model: Callable, init: dict[str, Tensor],
              x: Tensor, y: Tensor, *, seed: int, max_iter: int
              ) -> tuple[dict[str, Tensor], dict[str, float], LBFGSResult]:
        """As [`MapNoise.start`][bnn_zoo.methods.MapNoise.start], the noise tuned on
        held-out points."""
        if not _learns_noise(model):  # nothing to tune
            return MapNoise().start(build_model, model, init, x, y, seed=seed,
                                    max_iter=max_iter)
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
        held = order[:max(1, round(self.fraction * len(x)))].to(x.device)
        kept = order[len(held):].to(x.device)
        values, _, _ = full_batch_map(model, init, x[kept], y[kept], max_iter=max_iter)
        with pyro.get_param_store().scope(), torch.no_grad():
            outputs = poutine.trace(poutine.condition(model, data=values)).get_trace(x[held])
        residual = y[held] - outputs.nodes["f"]["value"].reshape(-1)
        sigma = float(residual.square().mean().sqrt())  # the held-out LL's maximiser
        values, _, result = full_batch_map(build_model(noise_scale=sigma), values, x, y,
                                           max_iter=max_iter)
        return values, {"noise_scale": sigma}, result


@dataclass(frozen=True)
class SampledNoise:
    """The chains sample the noise scale with the weights, under the hyperprior
    ``sigma ~ HalfNormal(scale)`` (the model option ``noise_prior=scale``: a latent site
    ``"sigma"``): the posterior ``p(w, sigma | D)`` integrates the noise out. They start from
    the full-batch MAP of the weights and ``sigma`` together under that prior. Needs a
    learned homoscedastic noise in the entry's model (a ``ValueError`` otherwise)."""

    scale: float = 1.0

    def __post_init__(self) -> None:
        check_positive("scale", self.scale)

    def start(self, build_model: ModelFactory, model: Callable, init: dict[str, Tensor],
              x: Tensor, y: Tensor, *, seed: int, max_iter: int
              ) -> tuple[dict[str, Tensor], dict[str, float], LBFGSResult]:
        """As [`MapNoise.start`][bnn_zoo.methods.MapNoise.start], ``sigma`` a latent
        site started at the fit's noise scale."""
        _check_learned_noise(model, type(self).__name__)
        with pyro.get_param_store().scope(), torch.no_grad():
            sigma = model.observation_scale().detach().reshape(())
        values, _, result = full_batch_map(build_model(noise_prior=self.scale),
                                           {**init, "sigma": sigma}, x, y, max_iter=max_iter)
        return values, {"noise_prior": self.scale}, result


def _learns_noise(model: Callable) -> bool:
    """Whether ``model`` learns one homoscedastic regression noise scale (not a classifier,
    a fixed or a heteroscedastic noise)."""
    return getattr(model, "learn_noise", False)


def _check_learned_noise(model: Callable, choice: str) -> None:
    if not _learns_noise(model):
        raise ValueError(f"{choice} needs a learned homoscedastic noise scale; this model has "
                         "none (classification, a fixed or a heteroscedastic noise).")


@dataclass(frozen=True)
class HMC(Method):
    """``chains`` chains of ChEES-HMC (Hoffman, Radul & Sountsov 2021, "An Adaptive-MCMC
    Scheme for Setting Trajectory Lengths in Hamiltonian Monte Carlo") with SNAPER's
    trajectory criterion (Sountsov & Hoffman 2022) on the entry's model,
    run as the replicas of one vectorised, JIT-traced full-batch potential
    ``U_c(w_c) = -log p(w_c) - sum_n log p(y_n | x_n, w_c)``, so that many chains cost
    little more than one on a GPU.

    ``start`` (an [`SVI`][bnn_zoo.methods.SVI] MAP fit under the budget) is refined by
    full-batch L-BFGS over the weights and, with ``noise=MapNoise()`` (the default),
    jointly the regression noise scale, which the chains then keep
    (``noise=HeldOutNoise()``: tuned on held-out points instead,
    [`HeldOutNoise`][bnn_zoo.methods.HeldOutNoise]; ``noise=SampledNoise(scale)``: sampled
    with the weights under a hyperprior, [`SampledNoise`][bnn_zoo.methods.SampledNoise]);
    every chain starts at the MAP weights, running
    ``warmup`` adapting iterations (step size by dual averaging to ``target_accept``,
    trajectory length by SNAPER, mass matrix in Stan's windows: diagonal, or dense with
    ``dense=True``) and then ``samples`` kept draws, at most ``max_leapfrog`` leapfrog steps
    each. The posterior replays the pooled draws
    ([`PosteriorSamples`][bnn_zoo.methods.PosteriorSamples]); its diagnostics add to those
    of [`chain_diagnostics`][bnn_zoo.methods.chain_diagnostics] the divergent transitions,
    the step size, the trajectory length, the leapfrog steps per draw, the acceptance rate
    and the MAP's L-BFGS iterations, and the fitted entry's ``diagnostics_at(x_test)`` the
    rank-normalised R-hat and bulk ESS that [`ConvergenceGate`][bnn_zoo.methods.ConvergenceGate]
    judges.

    ``replicas=True`` declares that [`fit_many`][] samples the data sets (a data set's
    splits) together, their chains the replicas of one potential, as a GPU runs them best;
    the harness's sweeps then fit the splits of a data set in one pass.
    """

    start: SVI
    warmup: int = 500
    samples: int = 2000
    chains: int = 8
    target_accept: float = 0.8
    max_leapfrog: int = 256
    dense: bool = False
    map_iterations: int = 2000
    jit: bool = True
    replicas: bool = False
    noise: MapNoise | HeldOutNoise | SampledNoise = MapNoise()

    def __post_init__(self) -> None:
        if not isinstance(self.noise, (MapNoise, HeldOutNoise, SampledNoise)):
            raise TypeError(f"Expected noise to be a MapNoise, HeldOutNoise or SampledNoise, "
                            f"got {self.noise!r}.")
        for name in ("warmup", "samples", "chains", "max_leapfrog", "map_iterations"):
            check_positive_int(name, getattr(self, name))
        check_fraction("target_accept", self.target_accept)
        for name in ("dense", "jit", "replicas"):
            check_bool(name, getattr(self, name))
        if self.replicas and self.dense:
            raise ValueError("Expected dense=False with replicas=True: data sets sampled "
                             "together each have a diagonal mass matrix.")

    def with_guide_options(self, options: Mapping[str, Any]) -> HMC:
        """This method with ``options`` for the guide of its start."""
        return replace(self, start=self.start.with_guide_options(options))

    def fit(self, build_model: ModelFactory, x: Tensor, y: Tensor, *, task: str, seed: int,
            budget: Budget, progress: bool | None) -> NUTSPosterior:
        return self.fit_many(build_model, x[None], y[None], task=task, seeds=[seed],
                             budget=budget, progress=progress)[0]

    def fit_many(self, build_model: ModelFactory, x: Tensor, y: Tensor, *, task: str,
                 seeds: Sequence[int], budget: Budget, progress: bool | None
                 ) -> list[NUTSPosterior]:
        """R data sets ``x`` (R, N, D), ``y`` (R, N) sampled together: each has its own MAP
        start (from its seed), noise and ``chains`` chains, and all the chains run as the
        replicas of one potential (`ChainPotential` in groups), each data set adapting its
        own step size, trajectory length and diagonal mass matrix (`chees_hmc` with
        ``groups``). The noise is drawn from ``seeds[0]``."""
        budget.check_supported("HMC", distributed=False)
        if task_named(task).noisy and y.dim() > 2:
            raise UnsupportedProblem(f"hmc fixes one noise scale at its MAP value and takes "
                                     f"regression targets of shape (N,), got "
                                     f"{tuple(y.shape[1:])}.")
        started = time.perf_counter()
        starts = [self._map(build_model, x[r], y[r], task, seed, budget, progress)
                  for r, seed in enumerate(seeds)]
        map_seconds = (time.perf_counter() - started) / len(seeds)
        noises = [n for _, n, _ in starts]
        scales = (torch.tensor([n["noise_scale"] for n in noises])
                  if "noise_scale" in noises[0] else None)
        potential = ChainPotential(build_model(**noises[0]), x, y, self.chains, noise=scales,
                                   jit=self.jit)
        theta = potential.flatten({k: torch.cat([v[k].expand(self.chains, *v[k].shape)
                                                 for v, _, _ in starts]) for k in starts[0][0]})
        started = time.perf_counter()
        run = chees_hmc(potential, theta, warmup=self.warmup, samples=self.samples,
                        target_accept=self.target_accept, max_leapfrog=self.max_leapfrog,
                        dense=self.dense, progress=progress, groups=len(seeds),
                        generator=torch.Generator(x.device).manual_seed(seeds[0]))
        seconds = (time.perf_counter() - started) / len(seeds)
        chains = list(draw_chunks(run, potential))
        per_group = [chains[i:i + self.chains] for i in range(0, len(chains), self.chains)]
        groups = zip(starts, per_group, run.divergences.split(self.chains), x,
                     run.step_size.tolist(), run.trajectory_length.tolist(),
                     run.acceptance.tolist())
        return [pooled_posterior(
            build_model(**noise), own, x_r, noise, seconds, divergences=float(divergent.sum()),
            step_size=step, trajectory_length=length, leapfrog_steps=run.leapfrog_steps,
            acceptance=acceptance, map_iterations=float(result.iterations),
            map_seconds=map_seconds)
            for (_, noise, result), own, divergent, x_r, step, length, acceptance in groups]

    def _map(self, build_model: ModelFactory, x: Tensor, y: Tensor, task: str, seed: int,
             budget: Budget, progress: bool | None
             ) -> tuple[dict[str, Tensor], dict[str, float], LBFGSResult]:
        """The chains' start on one data set: the SVI fit ``start``, refined by full-batch
        L-BFGS, with the noise of ``noise``: its values, noise and L-BFGS result."""
        fit, init = map_start(self.start, build_model, x, y, task=task, seed=seed,
                              budget=budget, progress=progress)
        return self.noise.start(build_model, fit.model, init, x, y, seed=seed,
                                max_iter=self.map_iterations)

    def restore(self, build_model: ModelFactory, state: dict, *, x: Tensor,
                y: Tensor) -> NUTSPosterior:
        """The posterior of `NUTSPosterior.state_dict`."""
        return restore_samples(build_model, state, x)
