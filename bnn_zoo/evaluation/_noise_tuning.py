"""Observation noise tuned on a validation part of the training data.

A network whose weights are (nearly) point estimates (MAP, an ensemble member, a
mean-field guide still close to its narrow start) can fit the training targets more
closely than new ones, and the noise scale learned jointly with it by maximum
likelihood then shrinks below the test error: the predictive is over-confident and
its test log-likelihood poor. The UCI protocol (Hernandez-Lobato & Adams 2015;
Gal & Ghahramani 2016) allows the noise to be tuned on held-out training data
instead. [`holdout`][bnn_zoo.data.holdout] keeps a random ``fraction`` of the training
points aside; after fitting on the rest, [`validated_noise_scale`][] picks the noise scale

    sigma* = argmax_sigma  1/V sum_v log 1/S sum_s N(y_v; mu_s(x_v), sigma^2)

of the predictive mixture's means ``mu_s`` on the ``V`` validation points, by a
search over ``log sigma``, and [`with_noise_scale`][] puts it in place of the
learned one. [`tune_noise`][] does both for a fitted posterior and returns a
[`NoiseTunedPosterior`][], whose model has the tuned noise too, so that
``pyro.infer.Predictive(model, guide=guide)`` samples the same predictive.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import pyro.distributions as dist
import torch
from pyro.poutine.messenger import Messenger
from torch import Tensor, nn

from bnn_zoo._core import distributed as distributed_module
from bnn_zoo._core.checks import check_positive
from bnn_zoo._core.predictive import GaussianMixturePredictive
from bnn_zoo._core.training import FitResult
from bnn_zoo.methods._base import Posterior

__all__ = ["NoiseTunedPosterior", "ObservationScale", "tune_noise",
           "validated_noise_scale", "with_noise_scale"]


def validated_noise_scale(loc: Tensor, y: Tensor, *, lower: float = 1e-4, upper: float = 1e2,
                          iterations: int = 60, distributed: bool = False) -> float:
    """The ``sigma`` maximising the mean log-likelihood of ``y`` (V,) under the equal-weight
    mixture ``1/S sum_s N(loc_s, sigma^2)`` with ``loc`` of shape (S, V).

    Golden-section search on ``log sigma`` in ``[lower, upper]``: for one component the
    objective is concave in ``log sigma`` with its maximum at the root-mean-square
    residual; for a mixture it is unimodal in practice and the search returns a local
    maximum, checked against the ends of the interval. With ``distributed=True`` each
    process passes its own validation points and the mean is over all of them, so every
    process makes the same choices and returns the same ``sigma``.
    """
    check_positive("lower", lower)
    check_positive("upper", upper)
    if loc.dim() != 2 or y.dim() != 1 or loc.shape[1] != y.shape[0]:
        raise ValueError(f"Expected loc (S, V) and y (V,), got {tuple(loc.shape)} and "
                         f"{tuple(y.shape)}.")

    def mean_ll(log_sigma: float) -> float:
        sigma = math.exp(log_sigma)
        lp = torch.distributions.Normal(loc, sigma).log_prob(y)
        total = torch.stack([(torch.logsumexp(lp, 0) - math.log(loc.shape[0])).sum(),
                             torch.tensor(float(y.shape[0]), dtype=lp.dtype, device=lp.device)])
        if distributed:
            total = distributed_module.global_sum(total)
        return float(total[0] / total[1])

    ratio = (math.sqrt(5) - 1) / 2
    a, b = math.log(lower), math.log(upper)
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = mean_ll(c), mean_ll(d)
    for _ in range(iterations):
        if fc >= fd:
            b, d, fd = d, c, fc
            c = b - ratio * (b - a)
            fc = mean_ll(c)
        else:
            a, c, fc = c, d, fd
            d = a + ratio * (b - a)
            fd = mean_ll(d)
    candidates = [(a + b) / 2, math.log(lower), math.log(upper)]
    return math.exp(max(candidates, key=mean_ll))


def with_noise_scale(pred: GaussianMixturePredictive, sigma: float) -> GaussianMixturePredictive:
    """The same mixture means with every component's scale set to ``sigma``."""
    return GaussianMixturePredictive(pred.loc, torch.full_like(pred.scale, sigma))


class _set_obs_scale(Messenger):
    """Replace the scale of the Normal likelihood at site ``obs`` by ``scale``."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = scale

    def _pyro_sample(self, msg) -> None:
        if msg["name"] != "obs":
            return
        fn = msg["fn"]
        if not isinstance(fn, dist.Normal):
            raise TypeError(f"Expected a Normal likelihood at site 'obs', got {fn!r}.")
        msg["fn"] = dist.Normal(fn.loc, torch.full_like(fn.loc, self.scale))


class ObservationScale(nn.Module):
    """``model`` with the scale of its Normal likelihood at ``obs`` set to ``scale``."""

    def __init__(self, model: Callable, scale: float) -> None:
        super().__init__()
        self.model = model
        self.scale = check_positive("scale", scale)

    def forward(self, x: Tensor, y: Tensor | None = None):
        with _set_obs_scale(self.scale):
            return self.model(x, y)


@dataclass
class NoiseTunedPosterior:
    """``inner`` with every predictive component's noise scale set to ``noise_scale``
    (standardised units), in `predict` and in the Pyro model alike."""

    inner: Posterior
    noise_scale: float

    def __post_init__(self) -> None:
        self.model = ObservationScale(self.inner.model, self.noise_scale)

    @property
    def guide(self) -> Callable | None:
        return self.inner.guide

    @property
    def result(self) -> FitResult | None:
        return self.inner.result

    @property
    def diagnostics(self) -> dict[str, float]:
        return {**self.inner.diagnostics, "validated_noise_scale": self.noise_scale}

    def predict(self, x: Tensor, num_samples: int) -> GaussianMixturePredictive:
        return with_noise_scale(self.inner.predict(x, num_samples), self.noise_scale)

    def state_dict(self) -> dict:
        return {"inner": self.inner.state_dict(), "noise_scale": self.noise_scale}


def tune_noise(posterior: Posterior, x_val: Tensor, y_val: Tensor, *, num_samples: int = 200,
               distributed: bool = False) -> NoiseTunedPosterior:
    """``posterior`` with its noise scale tuned on held-out standardised ``x_val``, ``y_val``
    (with ``distributed=True``, on the held-out rows of every process together)."""
    sigma = validated_noise_scale(posterior.predict(x_val, num_samples).loc, y_val,
                                  distributed=distributed)
    return NoiseTunedPosterior(posterior, sigma)
