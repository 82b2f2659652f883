"""Zoo entry ``ensemble``: a deep ensemble of MAP fits, the non-Bayesian yardstick.

``M`` (default 5) independently initialised MAP networks (the ``map`` entry's model,
guide and budget, seeds ``M * seed + m``); the predictive is their equal-weight
mixture (Lakshminarayanan et al. 2017, without adversarial training):

    p(y | x) = 1/M sum_m N(y; f_m(x), sigma_m^2)      (regression)
    p(y | x) = 1/M sum_m softmax(f_m(x))_y            (classification).
"""

from __future__ import annotations

import pyro
import torch
from torch import Tensor

from bnn_zoo.core.checks import check_positive_int
from bnn_zoo.core.predictive import CategoricalPredictive, GaussianMixturePredictive, predict
from bnn_zoo.core.scaling import Standardizer
from bnn_zoo.core.training import FitResult
from bnn_zoo.zoo import get, register
from bnn_zoo.zoo._entry import Budget, Entry, Fitted, Predictive, svi_fitter
from bnn_zoo.zoo.reference import MAP_BUDGET, fan_in_mlp, map_guide


def mixture(preds: list[Predictive]) -> Predictive:
    """Equal-weight mixture of the members' predictives (their samples stacked)."""
    if isinstance(preds[0], GaussianMixturePredictive):
        return GaussianMixturePredictive(torch.cat([p.loc for p in preds]),
                                         torch.cat([p.scale for p in preds]))
    return CategoricalPredictive(torch.cat([p.probs for p in preds]))


def ensemble_fitter(entry: Entry, x: Tensor, y: Tensor, *, task: str, out_dim: int, seed: int,
                    budget: Budget, progress: bool | None, options: dict) -> Fitted:
    """Fit ``members`` MAP networks by SVI, each from its own seed."""
    options = dict(options)
    members = check_positive_int("members", options.pop("members", 5))
    fits = []
    for m in range(members):
        pyro.set_rng_seed(members * seed + m)
        fits.append(svi_fitter(get("map"), x, y, task=task, out_dim=out_dim,
                               seed=members * seed + m, budget=budget, progress=progress,
                               options=options))
    losses = torch.tensor([f.result.losses for f in fits]).mean(0).tolist()
    result = FitResult(losses=losses, seconds=sum(f.result.seconds for f in fits),
                       steps=sum(f.result.steps for f in fits))

    def predict_standardized(z: Tensor, num_samples: int) -> Predictive:
        # One sample per member: a MAP guide has no posterior spread to sample.
        return mixture([predict(f.model, f.guide, z, num_samples=1) for f in fits])

    return Fitted(entry.name, task, fits[0].model, None, Standardizer.identity(x), None,
                  result.seconds, result, predict_standardized)


register(Entry(
    name="ensemble",
    description="deep ensemble: 5 MAP networks from different seeds (Lakshminarayanan 2017)",
    tasks=("regression", "classification"),
    model=fan_in_mlp,
    guide=map_guide,
    budget=MAP_BUDGET,
    tunable_noise=True,
    fitter=ensemble_fitter,
))
