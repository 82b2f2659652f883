"""Zoo entry ``nuts``: the No-U-Turn sampler (Hoffman & Gelman 2014) on the zoo's
Bayesian MLP, the gold standard every guide is measured against.

Steps:

1. a MAP fit (the ``map`` entry's guide) gives the starting point of every chain
   and, for regression, the observation noise ``sigma``, which is then fixed
   (type-II maximum likelihood, as the guides learn ``sigma`` as a point estimate);
2. ``chains`` independent NUTS chains (Pyro, JIT-compiled potential) of
   ``warmup`` adaptation steps and ``samples`` draws each, over every weight tensor
   of the same ``BayesianMLP`` the guides use;
3. the predictive averages the likelihood over ``num_samples`` draws spread evenly
   over all chains: ``p(y|x) ~ 1/S sum_s p(y | x, w_s)``.

``Fitted.diagnostics`` reports the largest split R-hat and the smallest effective
sample size over all weights and over the network outputs at training inputs
(Gelman et al., BDA3 11.4-11.5; see :func:`chain_diagnostics`), the number of
divergent transitions and the sampling time. NUTS costs up to ``2^max_tree_depth``
gradients per draw, so data sets above ``max_points`` training points raise
:class:`~bnn_zoo.zoo.UnsupportedProblem` (benchmarks then skip the entry).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable

import pyro
import pyro.distributions as dist
import torch
from pyro.infer import MCMC, NUTS
from pyro.infer.autoguide.initialization import init_to_value
from pyro.ops.stats import effective_sample_size, split_gelman_rubin
from torch import Tensor

from bnn_zoo.core.checks import check_positive_int
from bnn_zoo.core.predictive import GaussianMixturePredictive, predict
from bnn_zoo.core.scaling import Standardizer
from bnn_zoo.zoo import get, register
from bnn_zoo.zoo._entry import (
    Budget,
    Entry,
    Fitted,
    Predictive,
    UnsupportedProblem,
    split_options,
    svi_fitter,
)
from bnn_zoo.zoo.reference import fan_in_mlp, map_guide

NUTS_OPTIONS = {"warmup": 300, "samples": 300, "chains": 2, "max_tree_depth": 8,
                "max_points": 1000}


class PosteriorSamples:
    """A guide that replays stored posterior draws: under ``predict``'s sample plate
    of size ``S`` it returns ``S`` draws spread evenly over all stored ones."""

    def __init__(self, samples: dict[str, Tensor]) -> None:
        self.samples = samples
        self.total = next(iter(samples.values())).shape[0]

    def draws(self, num_samples: int):
        """The guide for ``predict(..., num_samples=num_samples)``."""
        index = torch.linspace(0, self.total - 1, num_samples).round().long()

        def guide(x: Tensor, y: Tensor | None = None) -> None:
            for name, value in self.samples.items():
                event_dim = value.dim() - 1
                chosen = value[index.to(value.device)].unsqueeze(1)  # (S, 1, *event)
                pyro.sample(name, dist.Delta(chosen, event_dim=event_dim))

        return guide


def _r_hat_ess(stacked: Tensor) -> tuple[float, float]:
    """Largest split R-hat and smallest ESS of the draws ``stacked`` (C, S, P)."""
    return (float(split_gelman_rubin(stacked, chain_dim=0, sample_dim=1).max()),
            float(effective_sample_size(stacked, chain_dim=0, sample_dim=1).min()))


def chain_diagnostics(chains: list[dict[str, Tensor]], model: Callable,
                      x: Tensor) -> dict[str, float]:
    """Largest split R-hat and smallest effective sample size over every weight, and
    over the network output ``f`` at (up to 50) training inputs.

    A BNN's posterior is symmetric under permutations of hidden units, so chains in
    permuted modes give a large R-hat on the weights while agreeing on the function;
    the ``_f`` diagnostics are the ones that say whether the predictive is sound.
    """
    per_site = [_r_hat_ess(torch.stack([c[n] for c in chains]).flatten(2)) for n in chains[0]]
    outputs = []
    for chain in chains:
        draws = next(iter(chain.values())).shape[0]
        pred = predict(model, PosteriorSamples(chain).draws(draws), x[:50], num_samples=draws)
        outputs.append(pred.loc if isinstance(pred, GaussianMixturePredictive)
                       else pred.probs.flatten(1))
    r_hat_f, ess_f = _r_hat_ess(torch.stack(outputs))
    return {"r_hat_max": max(r for r, _ in per_site), "ess_min": min(e for _, e in per_site),
            "r_hat_f_max": r_hat_f, "ess_f_min": ess_f}


def nuts_fitter(entry: Entry, x: Tensor, y: Tensor, *, task: str, out_dim: int, seed: int,
                budget: Budget, progress: bool | None, options: dict) -> Fitted:
    """MAP start, then ``chains`` NUTS chains on the same model (see the module doc)."""
    opts = {k: check_positive_int(k, options.get(k, v)) for k, v in NUTS_OPTIONS.items()}
    model_kw = {k: v for k, v in options.items() if k not in NUTS_OPTIONS}
    split_options(model_kw, entry.model)  # unknown options fail here, before any work
    if x.shape[0] > opts["max_points"]:
        raise UnsupportedProblem(f"nuts runs on at most max_points={opts['max_points']} "
                                 f"training points, got {x.shape[0]}.")
    start = svi_fitter(get("map"), x, y, task=task, out_dim=out_dim, seed=seed, budget=budget,
                       progress=progress, options=model_kw)
    init = {k: v.detach() for k, v in start.guide.median().items()}
    noise = {}
    if task == "regression":
        noise["noise_scale"] = float(start.model.observation_scale().detach())
    model = entry.model(x.shape[1], out_dim, task=task, **model_kw, **noise).to(device=x.device)
    chains, divergences = [], 0
    started = time.perf_counter()
    for chain in range(opts["chains"]):
        pyro.set_rng_seed(seed * opts["chains"] + chain)
        kernel = NUTS(model, jit_compile=True, ignore_jit_warnings=True,
                      max_tree_depth=opts["max_tree_depth"], init_strategy=init_to_value(
                          values=init))
        mcmc = MCMC(kernel, num_samples=opts["samples"], warmup_steps=opts["warmup"],
                    disable_progbar=not progress)
        with warnings.catch_warnings():
            # Pyro's JIT potential uses torch.jit.trace, deprecated in favour of
            # torch.compile, which cannot trace through Pyro's effect handlers.
            warnings.filterwarnings("ignore", ".*torch.jit.trace.* is deprecated",
                                    DeprecationWarning)
            mcmc.run(x, y)
        chains.append({k: v.detach() for k, v in mcmc.get_samples().items()})
        divergences += len(mcmc.diagnostics()["divergences"]["chain 0"])
    seconds = time.perf_counter() - started
    posterior = PosteriorSamples({k: torch.cat([c[k] for c in chains]) for k in chains[0]})

    def predict_standardized(z: Tensor, num_samples: int) -> Predictive:
        return predict(model, posterior.draws(num_samples), z, num_samples=num_samples)

    diagnostics = {**chain_diagnostics(chains, model, x), "divergences": float(divergences),
                   "sampling_seconds": seconds, **{k: float(v) for k, v in noise.items()}}
    return Fitted(entry.name, task, model, None, Standardizer.identity(x), None, seconds, None,
                  predict_standardized, diagnostics)


register(Entry(
    name="nuts",
    description="NUTS (HMC) on the same MLP: MAP start and noise, 2 chains x 300 draws",
    tasks=("regression", "classification"),
    model=fan_in_mlp,
    guide=map_guide,
    budget=Budget(steps=2000, lr=3e-2, batch_size=256, jit=True),
    fitter=nuts_fitter,
))
