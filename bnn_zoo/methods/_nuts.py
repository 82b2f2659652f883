"""The No-U-Turn sampler (Hoffman & Gelman 2014) as a method, started from an SVI fit.

Steps:

1. ``start`` (an [`SVI`][bnn_zoo.methods.SVI] whose guide has a ``median()``, by
   default a MAP point mass) gives the starting point of every chain and, for regression,
   the observation noise ``sigma``, which is then fixed (type-II maximum likelihood, as
   the guides learn ``sigma`` as a point estimate);
2. ``chains`` independent NUTS chains (Pyro, JIT-compiled potential) of ``warmup``
   adaptation steps and ``samples`` draws each, over every weight tensor of a fresh model
   with that noise;
3. the predictive averages the likelihood over ``num_samples`` draws spread evenly over
   all chains: ``p(y|x) ~ 1/S sum_s p(y | x, w_s)``.

The posterior's diagnostics are the largest split R-hat and the smallest bulk effective
sample size over all weights and over the network outputs at training inputs (Gelman et al.,
BDA3 11.4-11.5; Vehtari et al. 2021; see [`chain_diagnostics`][]), the number of
divergent transitions, the
sampling time and the fixed noise;
[`NUTSPosterior.predictive_diagnostics`][bnn_zoo.methods._nuts.NUTSPosterior.predictive_diagnostics]
gives the same over the network outputs at any inputs (the test inputs, in the comparison). NUTS
costs up to ``2^max_tree_depth`` gradients per draw, so data sets above ``max_points`` training
points raise [`UnsupportedProblem`][bnn_zoo.methods.UnsupportedProblem].
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import pyro
import pyro.distributions as dist
import pyro.infer
import torch
from pyro.infer.autoguide.initialization import init_to_value
from pyro.ops.stats import effective_sample_size, split_gelman_rubin
from pyro.poutine.runtime import get_plates
from torch import Tensor

from bnn_zoo._core.checks import check_positive_int
from bnn_zoo._core.predictive import GaussianMixturePredictive, predict
from bnn_zoo._core.tasks import task_named
from bnn_zoo.methods._base import Budget, Method, ModelFactory, Predictive, UnsupportedProblem
from bnn_zoo.methods._state import module_state
from bnn_zoo.methods._svi import SVI, SVIPosterior

__all__ = ["NUTS", "ConvergenceGate", "NUTSPosterior", "PosteriorSamples", "bulk_ess",
           "chain_diagnostics", "output_draws", "pooled_posterior", "r_hat_ess", "rank_r_hat",
           "map_start", "restore_samples", "sampler_start"]


class PosteriorSamples:
    """A guide that replays stored posterior draws ``samples`` (site -> (T, *event)).

    Called as a guide it picks draws uniformly at random: one per call, or one per
    element of an enclosing sample plate (as ``pyro.infer.Predictive(...,
    parallel=True)`` and [`predict`][bnn_zoo.predict] set up), so
    ``pyro.infer.Predictive(model, guide=PosteriorSamples(samples))`` samples the
    posterior predictive. [`draws`][] gives the guide that spreads ``S`` draws evenly
    over the stored ones instead, for a predictive with less Monte Carlo noise.
    """

    def __init__(self, samples: Mapping[str, Tensor]) -> None:
        if not samples:
            raise ValueError("Expected at least one sample site in samples.")
        self.samples = dict(samples)
        self.total = next(iter(self.samples.values())).shape[0]

    def _replay(self, index: Tensor, batch_dims: int) -> None:
        for name, value in self.samples.items():
            chosen = value[index.to(value.device)]
            chosen = chosen.reshape(index.shape + (1,) * batch_dims + value.shape[1:])
            pyro.sample(name, dist.Delta(chosen, event_dim=value.dim() - 1))

    def __call__(self, x: Tensor, y: Tensor | None = None) -> None:
        outer = [f for f in get_plates() if f.dim is not None and f.dim < -1]
        if len(outer) > 1:
            raise ValueError("PosteriorSamples supports at most one sample plate around the "
                             f"model's plates, got {[f.name for f in outer]}.")
        if not outer:
            self._replay(torch.randint(self.total, ()), 0)
            return
        self._replay(torch.randint(self.total, (outer[0].size,)), -outer[0].dim - 1)

    def draws(self, num_samples: int) -> Callable:
        """The guide for ``predict(..., num_samples=num_samples)``: draws spread evenly."""
        index = torch.linspace(0, self.total - 1, num_samples).round().long()

        def guide(x: Tensor, y: Tensor | None = None) -> None:
            self._replay(index, 1)

        return guide


def _average_ranks(draws: Tensor) -> Tensor:
    """The ranks 1..M of ``draws`` (M, P) within each column, ties given their average."""
    m = draws.shape[0]
    order = draws.argsort(0)
    ordered = draws.gather(0, order)
    positions = torch.arange(1, m + 1, dtype=draws.dtype, device=draws.device)
    positions = positions[:, None].expand_as(draws)
    starts = torch.ones_like(draws, dtype=torch.bool)
    starts[1:] = ordered[1:] != ordered[:-1]
    group = starts.long().cumsum(0) - 1  # index of each sorted draw's run of equal values
    totals = torch.zeros_like(draws).scatter_add_(0, group, positions)
    counts = torch.zeros_like(draws).scatter_add_(0, group, torch.ones_like(draws))
    average = (totals / counts.clamp(min=1)).gather(0, group)
    return torch.empty_like(draws).scatter_(0, order, average)


def _normal_scores(stacked: Tensor) -> Tensor:
    """The draws ``stacked`` (C, S, P) replaced by their normal scores
    ``z = Phi^-1((r - 3/8) / (C S + 1/4))``, ``r`` the rank of a draw among all ``C S``
    draws of its quantity, ties averaged (Vehtari et al. 2021, eq. 14)."""
    c, s, p = stacked.shape
    ranks = _average_ranks(stacked.reshape(c * s, p)).reshape(c, s, p)
    return torch.special.ndtri((ranks - 0.375) / (c * s + 0.25))


def _split_halves(stacked: Tensor) -> Tensor:
    """Every chain of ``stacked`` (C, S, P) cut in halves: (2C, S // 2, P), the middle draw
    dropped for odd S."""
    half = stacked.shape[1] // 2
    return torch.cat([stacked[:, :half], stacked[:, stacked.shape[1] - half:]])


def bulk_ess(stacked: Tensor) -> Tensor:
    """Bulk effective sample size of every quantity of the draws ``stacked`` (C, S, P)
    (Vehtari et al. 2021, eq. 13): the ESS of the normal scores of the draws, every chain
    split in halves, ``2C n / (1 + 2 sum_t rho_t)`` with Geyer's initial positive sequence
    (BDA3 11.5; `pyro.ops.stats.effective_sample_size`). Unchanged by any increasing
    transform of the draws."""
    return effective_sample_size(_split_halves(_normal_scores(stacked)), chain_dim=0,
                                 sample_dim=1)


def rank_r_hat(stacked: Tensor) -> Tensor:
    """Rank-normalised split R-hat of every quantity of the draws ``stacked`` (C, S, P)
    (Vehtari et al. 2021, eq. 14-15): the larger of the split R-hat of the draws' normal
    scores (the bulk) and of the normal scores of their distances to the median (the
    folded draws: the tails). Split R-hat (BDA3 11.4): ``m = 2C`` half chains of ``n``
    draws with within-sequence variance ``W`` and between-sequence variance ``B``,
    ``R = sqrt(((n-1)/n W + B/n) / W)``, 1 for chains that agree."""
    folded = (stacked - stacked.flatten(0, 1).median(0).values).abs()
    return torch.maximum(
        split_gelman_rubin(_normal_scores(stacked), chain_dim=0, sample_dim=1),
        split_gelman_rubin(_normal_scores(folded), chain_dim=0, sample_dim=1))


def r_hat_ess(stacked: Tensor) -> tuple[float, float]:
    """Largest rank-normalised split R-hat ([`rank_r_hat`][]) and smallest bulk effective
    sample size ([`bulk_ess`][]) over the quantities of the draws ``stacked`` (C chains,
    S draws, P quantities)."""
    if stacked.dim() != 3 or stacked.shape[1] < 4:
        raise ValueError(f"Expected draws of shape (chains, draws >= 4, quantities), got "
                         f"{tuple(stacked.shape)}.")
    return float(rank_r_hat(stacked).max()), float(bulk_ess(stacked).min())


def output_draws(chains: list[dict[str, Tensor]], model: Callable, x: Tensor) -> Tensor:
    """The network output at ``x`` (N, D) under every draw of every chain: (C, S, N) (the
    Gaussian predictive's means; class probabilities flattened to (C, S, N * classes))."""
    outputs = []
    for chain in chains:
        draws = next(iter(chain.values())).shape[0]
        pred = predict(model, PosteriorSamples(chain).draws(draws), x, num_samples=draws)
        outputs.append(pred.loc if isinstance(pred, GaussianMixturePredictive)
                       else pred.probs.flatten(1))
    return torch.stack(outputs)


def chain_diagnostics(chains: list[dict[str, Tensor]], model: Callable,
                      x: Tensor) -> dict[str, float]:
    """Largest split R-hat and smallest effective sample size (`r_hat_ess`) over
    every weight, and over the network output ``f`` at (up to 50) training inputs.

    A BNN's posterior is symmetric under permutations of hidden units, so chains in
    permuted modes give a large R-hat on the weights while agreeing on the function;
    the ``_f`` diagnostics are the ones that say whether the predictive is sound.
    """
    per_site = [r_hat_ess(torch.stack([c[n].reshape(len(c[n]), -1) for c in chains]))
                for n in chains[0]]
    r_hat_f, ess_f = r_hat_ess(output_draws(chains, model, x[:50]))
    return {"r_hat_max": max(r for r, _ in per_site), "ess_min": min(e for _, e in per_site),
            "r_hat_f_max": r_hat_f, "ess_f_min": ess_f}


@dataclass(frozen=True)
class ConvergenceGate:
    """What a reference's chains must show before anything is measured against them
    (Vehtari et al. 2021, "Rank-normalization, folding, and localization"): at least
    ``chains`` chains, and over the network outputs at the test inputs
    (``NUTSPosterior.predictive_diagnostics``, as ``Fitted.diagnostics_at`` reports them)
    a rank-normalised split R-hat of at most ``r_hat`` and a bulk effective sample size of
    at least ``ess``. The weights' R-hat is not gated: a network's posterior is symmetric
    under permutations of its hidden units, so chains in permuted modes disagree on the
    weights and agree on the function."""

    r_hat: float = 1.01
    ess: float = 400.0
    chains: int = 4

    def failures(self, diagnostics: Mapping[str, float]) -> list[str]:
        """Why ``diagnostics`` (a sampler's, with ``chains``, ``r_hat_pred_max`` and
        ``ess_pred_min``) fail the gate: one phrase per failed gate, none when it passes."""
        chains = diagnostics.get("chains")
        r_hat = diagnostics.get("r_hat_pred_max")
        ess = diagnostics.get("ess_pred_min")
        out = []
        if chains is None:
            out.append("chains unknown")
        elif not chains >= self.chains:
            out.append(f"chains {int(chains)} < {self.chains}")
        if r_hat is None:
            out.append("R-hat unknown")
        elif not r_hat <= self.r_hat:
            out.append(f"R-hat {r_hat:.4f} > {self.r_hat:g}")
        if ess is None:
            out.append("ESS unknown")
        elif not ess >= self.ess:
            out.append(f"ESS {ess:.0f} < {self.ess:g}")
        return out


@dataclass
class NUTSPosterior:
    """The model (noise fixed at the start's) and the pooled draws of ``chains`` chains of
    equal length, chain after chain."""

    model: Callable
    samples: PosteriorSamples
    model_options: dict[str, float]
    diagnostics: dict[str, float] = field(default_factory=dict)
    result: None = None
    chains: int = 1

    def __post_init__(self) -> None:
        check_positive_int("chains", self.chains)
        if self.samples.total % self.chains:
            raise ValueError(f"Expected {self.chains} chains of equal length, but got "
                             f"{self.samples.total} draws in all.")

    @property
    def guide(self) -> PosteriorSamples:
        return self.samples

    def predict(self, x: Tensor, num_samples: int) -> Predictive:
        """The likelihood averaged over ``num_samples`` draws spread evenly over the chains."""
        return predict(self.model, self.samples.draws(num_samples), x, num_samples=num_samples)

    def predictive_diagnostics(self, x: Tensor) -> dict[str, float]:
        """Largest split R-hat (``r_hat_pred_max``) and smallest effective sample size
        (``ess_pred_min``) over the network outputs ``f(x_i)`` at standardised inputs ``x``
        (N, D), chain by chain (`r_hat_ess`): whether the chains agree on the
        predictive at those inputs."""
        per_chain = [dict(zip(self.samples.samples, values)) for values in
                     zip(*(v.chunk(self.chains) for v in self.samples.samples.values()))]
        r_hat, ess = r_hat_ess(output_draws(per_chain, self.model, x))
        return {"r_hat_pred_max": r_hat, "ess_pred_min": ess}

    def state_dict(self) -> dict:
        return {"model": module_state(self.model), "samples": self.samples.samples,
                "model_options": self.model_options, "diagnostics": self.diagnostics,
                "chains": self.chains}


def map_start(start: SVI, build_model: ModelFactory, x: Tensor, y: Tensor, *, task: str,
              seed: int, budget: Budget, progress: bool | None
              ) -> tuple[SVIPosterior, dict[str, Tensor]]:
    """The SVI fit ``start`` under ``budget`` and its guide's ``median()``, the sites'
    values a sampler's chains start from. Returns ``(fit, init)``."""
    fit = start.fit(build_model, x, y, task=task, seed=seed, budget=budget, progress=progress)
    # Read in a private parameter store: outside one, a PyroModule takes the values that
    # the global store holds under its parameters' names (a previous fit's, of another
    # data set) in place of its own.
    with pyro.get_param_store().scope():
        init = {k: v.detach() for k, v in fit.guide.median().items()}
    return fit, init


def sampler_start(start: SVI, build_model: ModelFactory, x: Tensor, y: Tensor, *, task: str,
                  seed: int, budget: Budget, progress: bool | None
                  ) -> tuple[Callable, dict[str, Tensor], dict[str, float]]:
    """What a sampler's chains start from: [`map_start`][]'s values, a regression's noise
    scale fixed at the fit's (type-II maximum likelihood), and a fresh model with that
    noise. Returns ``(model, init, noise)``, ``noise`` the model options that fix it."""
    fit, init = map_start(start, build_model, x, y, task=task, seed=seed, budget=budget,
                          progress=progress)
    noise = {}
    if task_named(task).noisy:
        with pyro.get_param_store().scope():  # as in map_start
            noise["noise_scale"] = float(fit.model.observation_scale().detach())
    return build_model(**noise), init, noise


def pooled_posterior(model: Callable, chains: list[dict[str, Tensor]], x: Tensor,
                     noise: dict[str, float], seconds: float, **diagnostics: float
                     ) -> NUTSPosterior:
    """The posterior of the draws of every chain of ``model`` pooled, with the chains'
    diagnostics ([`chain_diagnostics`][] at the training inputs ``x``), any other
    ``diagnostics``, the sampling ``seconds`` and the fixed ``noise``."""
    samples = PosteriorSamples({k: torch.cat([c[k] for c in chains]) for k in chains[0]})
    return NUTSPosterior(model, samples, noise, {
        **chain_diagnostics(chains, model, x), **diagnostics, "sampling_seconds": seconds,
        "chains": float(len(chains)), **noise}, chains=len(chains))


@dataclass(frozen=True)
class NUTS(Method):
    """NUTS chains on the entry's model, started from the SVI fit ``start`` (module doc).

    The budget trains the start, which honours every field as [`SVI`][] does; the
    chains run on one process, so ``distributed=True`` is refused."""

    start: SVI
    warmup: int = 300
    samples: int = 300
    chains: int = 2
    max_tree_depth: int = 8
    max_points: int = 1000

    def __post_init__(self) -> None:
        for name in ("warmup", "samples", "chains", "max_tree_depth", "max_points"):
            check_positive_int(name, getattr(self, name))

    def with_guide_options(self, options: Mapping[str, Any]) -> NUTS:
        """This method with ``options`` for the guide of its start."""
        return replace(self, start=self.start.with_guide_options(options))

    def fit(self, build_model: ModelFactory, x: Tensor, y: Tensor, *, task: str, seed: int,
            budget: Budget, progress: bool | None) -> NUTSPosterior:
        budget.check_supported("NUTS", distributed=False)
        if x.shape[0] > self.max_points:
            raise UnsupportedProblem(f"nuts runs on at most max_points={self.max_points} "
                                     f"training points, got {x.shape[0]}.")
        model, init, noise = sampler_start(self.start, build_model, x, y, task=task, seed=seed,
                                           budget=budget, progress=progress)
        chains, divergences = [], 0
        started = time.perf_counter()
        for chain in range(self.chains):
            pyro.set_rng_seed(seed * self.chains + chain)
            kernel = pyro.infer.NUTS(model, jit_compile=True, ignore_jit_warnings=True,
                                     max_tree_depth=self.max_tree_depth,
                                     init_strategy=init_to_value(values=init))
            mcmc = pyro.infer.MCMC(kernel, num_samples=self.samples, warmup_steps=self.warmup,
                                   disable_progbar=not progress)
            with warnings.catch_warnings():
                # Pyro's JIT potential uses torch.jit.trace, deprecated in favour of
                # torch.compile, which cannot trace through Pyro's effect handlers.
                warnings.filterwarnings("ignore", ".*torch.jit.trace.* is deprecated",
                                        DeprecationWarning)
                mcmc.run(x, y)
            chains.append({k: v.detach() for k, v in mcmc.get_samples().items()})
            divergences += len(mcmc.diagnostics()["divergences"]["chain 0"])
        return pooled_posterior(model, chains, x, noise, time.perf_counter() - started,
                                divergences=float(divergences))

    def restore(self, build_model: ModelFactory, state: dict, *, x: Tensor,
                y: Tensor) -> NUTSPosterior:
        """The posterior of `NUTSPosterior.state_dict`."""
        return restore_samples(build_model, state, x)


def restore_samples(build_model: ModelFactory, state: dict, x: Tensor) -> NUTSPosterior:
    """The posterior of a sampler's `NUTSPosterior.state_dict`, its draws on ``x``'s device."""
    model = build_model(**state["model_options"])
    model.load_state_dict(state["model"])
    samples = {k: v.to(device=x.device) for k, v in state["samples"].items()}
    # A state without "chains" holds its draws as one chain.
    return NUTSPosterior(model, PosteriorSamples(samples), state["model_options"],
                         state["diagnostics"], chains=state.get("chains", 1))
