"""Zoo entries ``nngp`` and ``nngp-erf``: the infinite-width limit of the one-hidden-layer
BNN as exact GP regression (seed 001, second half; Neal 1996)."""

from __future__ import annotations

from functools import partial

import torch
from torch import Tensor

from bnn_zoo.core.predictive import GaussianMixturePredictive
from bnn_zoo.core.scaling import Standardizer
from bnn_zoo.core.training import fit
from bnn_zoo.models.nngp import NNGPRegression
from bnn_zoo.zoo import register
from bnn_zoo.zoo._entry import Budget, Entry, Fitted, UnsupportedProblem, split_options

#: Exact GP regression costs O(N^3) per step; above this many training points the entry
#: declines (a benchmark lists it as skipped) instead of running for hours.
MAX_TRAINING_POINTS = 3000


def nngp(in_dim: int, out_dim: int, *, task: str = "regression", activation: str = "relu",
         noise_scale: float | None = None, num_features: int | None = None,
         **kernel_options: float) -> NNGPRegression:
    """The NNGP regression model; ``kernel_options`` are the initial kernel variances
    (``weight_variance``, ``bias_variance``, ``output_variance``, ``output_bias_variance``)."""
    if task != "regression" or out_dim != 1:
        raise ValueError(f"Expected task 'regression' with out_dim 1, got {task!r}, {out_dim}.")
    return NNGPRegression(in_dim, activation=activation, noise_scale=noise_scale,
                          num_features=num_features, **kernel_options)


def no_guide(x: Tensor, y: Tensor | None = None) -> None:
    """The empty guide: the model has no latent site, so SVI maximises the evidence."""


def evidence_fitter(entry: Entry, x: Tensor, y: Tensor, *, task: str, out_dim: int, seed: int,
                    budget: Budget, progress: bool | None, options: dict) -> Fitted:
    """Type-II maximum likelihood: maximise ``log p(y | x, theta)`` over the kernel
    variances and the noise by Adam on the full data (see :func:`bnn_zoo.fit`)."""
    if x.shape[0] > MAX_TRAINING_POINTS:
        raise UnsupportedProblem(f"{entry.name} is exact GP regression, O(N^3) per step: "
                                 f"{x.shape[0]} training points exceed {MAX_TRAINING_POINTS}.")
    if budget.batch_size is not None:
        raise ValueError(f"Expected batch_size=None for the exact GP entry {entry.name!r}, "
                         f"but got {budget.batch_size}.")
    (model_kw,) = split_options(options, entry.model)
    model = entry.model(x.shape[1], out_dim, task=task, **model_kw)
    # The GP works in float64: once the learned noise is small (yacht), the float32 kernel
    # K + sigma^2 I is no longer positive definite (factorising it alone in float64 does
    # not help). Predictions come back in the data's dtype.
    x64, y64 = x.double(), y.double()
    model = model.to(device=x.device, dtype=torch.float64)
    result = fit(model, no_guide, x64, y64, steps=budget.steps, lr=budget.lr, seed=seed,
                 progress=progress)

    def predict_standardized(z: Tensor, num_samples: int):
        pred = model.posterior(x64, y64, z.double())
        return GaussianMixturePredictive(pred.loc.to(z.dtype), pred.scale.to(z.dtype))

    return Fitted(entry.name, task, model, no_guide, Standardizer.identity(x), None,
                  result.seconds, result, predict_standardized=predict_standardized)


for _name, _activation in [("nngp", "relu"), ("nngp-erf", "erf")]:
    register(Entry(
        name=_name,
        description=f"infinite-width 1-hidden-layer {_activation} BNN: exact GP with the NNGP "
                    "kernel, hyperparameters by type-II maximum likelihood",
        tasks=("regression",),
        seed="001_c55daefe340e50b9.txt",
        model=partial(nngp, activation=_activation),
        guide=None,
        budget=Budget(steps=300, lr=0.05, batch_size=None),
        fitter=evidence_fitter,
    ))

__all__ = ["evidence_fitter", "nngp", "no_guide"]
