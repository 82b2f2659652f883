"""Posterior predictive distributions, vectorised over posterior samples.

[`predict`][] draws ``S`` samples from the guide in one vectorised pass
(a plate over samples, outside the model's plates), replays the model on them
and reads the likelihood at the site ``obs``. The result is an equally weighted
mixture over the samples:

* regression, a Gaussian mixture ``p(y|x) = 1/S sum_s N(y; mu_s(x), sigma_s(x)^2)``
  ([`GaussianMixturePredictive`][]; with D outputs each component is the product of
  D independent Gaussians, ``prod_d N(y_d; mu_sd(x), sigma_sd(x)^2)``);
* classification, the Monte Carlo average of class probabilities
  ``p(y|x) = 1/S sum_s softmax(f_s(x))`` ([`CategoricalPredictive`][]) -- the
  average of the probabilities, not the probabilities of the average weights.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial

import pyro
import pyro.distributions as dist
import torch
from pyro import poutine
from torch import Tensor

from bnn_zoo._core.batches import as_batches, is_loader
from bnn_zoo._core.checks import check_data, check_module_device, check_positive_int

__all__ = ["CategoricalPredictive", "GaussianMixturePredictive", "concatenate", "predict",
           "predict_batches"]


@dataclass(frozen=True)
class GaussianMixturePredictive:
    """Equal-weight mixture of Gaussians: ``loc`` and ``scale`` of shape (S, N), or (S, N, D)
    for D outputs (component ``s`` the product of D independent Gaussians). ``mean``,
    ``variance``, ``cdf``, ``quantile`` and ``interval`` are per output, (N,) or (N, D);
    [`log_prob`][] is the joint density of a point's D outputs, (N,)."""

    loc: Tensor
    scale: Tensor

    task = "regression"

    @staticmethod
    def mixture(preds: Sequence[GaussianMixturePredictive]) -> GaussianMixturePredictive:
        """The equal-weight mixture of ``preds`` (their components stacked)."""
        return GaussianMixturePredictive(torch.cat([p.loc for p in preds]),
                                         torch.cat([p.scale for p in preds]))

    @property
    def mean(self) -> Tensor:
        """(N,) (or (N, D)) predictive mean."""
        return self.loc.mean(0)

    @property
    def variance(self) -> Tensor:
        """(N,) (or (N, D)) predictive variance: mean of ``sigma_s^2`` plus variance of
        ``mu_s``."""
        return (self.scale**2).mean(0) + self.loc.var(0, unbiased=False)

    @property
    def stddev(self) -> Tensor:
        return self.variance.sqrt()

    def log_prob(self, y: Tensor) -> Tensor:
        """(N,) ``log 1/S sum_s N(y_n; mu_sn, sigma_sn^2)`` (log-mean-exp over samples); for
        D outputs, ``y`` (N, D) and ``log 1/S sum_s prod_d N(y_nd; mu_snd, sigma_snd^2)``,
        the outputs' log densities summed inside each component."""
        lp = dist.Normal(self.loc, self.scale).log_prob(y)
        if self.loc.dim() == 3:
            lp = lp.sum(-1)
        return torch.logsumexp(lp, 0) - math.log(self.loc.shape[0])

    def cdf(self, y: Tensor) -> Tensor:
        return dist.Normal(self.loc, self.scale).cdf(y).mean(0)

    def quantile(self, q: float, iterations: int = 60) -> Tensor:
        """(N,) (or (N, D), per output) the ``q`` quantile of the mixture, by bisection on
        its CDF between the smallest and the largest of the components' ``q`` quantiles
        ``mu_s + sigma_s Phi^-1(q)`` (the mixture's CDF, the mean of the components', is at
        most ``q`` at the first and at least ``q`` at the second), until the dtype resolves
        no midpoint or after ``iterations`` halvings."""
        if not 0.0 < q < 1.0:
            raise ValueError(f"Expected 0 < q < 1, but got {q!r}.")
        components = self.loc + self.scale * math.sqrt(2.0) * torch.erfinv(
            torch.tensor(2.0 * q - 1.0, dtype=self.loc.dtype, device=self.loc.device))
        lo, hi = components.min(0).values, components.max(0).values
        for _ in range(iterations):
            mid = (lo + hi) / 2
            if not ((mid > lo) & (mid < hi)).any():
                break
            below = self.cdf(mid) < q
            lo = torch.where(below, mid, lo)
            hi = torch.where(below, hi, mid)
        return (lo + hi) / 2

    def interval(self, mass: float) -> tuple[Tensor, Tensor]:
        """Central interval holding ``mass`` of the predictive probability."""
        tail = (1.0 - mass) / 2
        return self.quantile(tail), self.quantile(1.0 - tail)

    def affine(self, shift: Tensor | float, scale: Tensor | float) -> GaussianMixturePredictive:
        """The predictive of ``shift + scale * y`` (used to undo standardisation)."""
        return GaussianMixturePredictive(shift + scale * self.loc, abs(scale) * self.scale)


@dataclass(frozen=True)
class CategoricalPredictive:
    """Per-sample class probabilities ``probs`` of shape (S, N, C) and, where the
    likelihood has them, their logarithms ``log_probs`` (normalised logits, the same
    shape). With them [`log_prob`][] works in log space, so it stays finite where every
    sample gives the observed class a probability below the dtype's smallest (a confident
    error: the log of the averaged float32 probabilities is then ``-inf``)."""

    probs: Tensor
    log_probs: Tensor | None = None

    task = "classification"

    def __post_init__(self) -> None:
        if self.log_probs is not None and self.log_probs.shape != self.probs.shape:
            raise ValueError(f"Expected log_probs of the shape of probs "
                             f"{tuple(self.probs.shape)}, got {tuple(self.log_probs.shape)}.")

    @staticmethod
    def mixture(preds: Sequence[CategoricalPredictive]) -> CategoricalPredictive:
        """The equal-weight mixture of ``preds`` (their samples stacked)."""
        logs = [p.log_probs for p in preds]
        return CategoricalPredictive(torch.cat([p.probs for p in preds]),
                                     None if any(t is None for t in logs) else torch.cat(logs))

    def replica(self, r: int) -> CategoricalPredictive:
        """Replica ``r`` of a replica-batched predictive (S, R, N, C)."""
        return CategoricalPredictive(self.probs[:, r],
                                     None if self.log_probs is None else self.log_probs[:, r])

    @property
    def mean(self) -> Tensor:
        """(N, C) Monte Carlo average of the class probabilities."""
        return self.probs.mean(0)

    def log_prob(self, y: Tensor) -> Tensor:
        """(N,) log of the averaged probability of the observed class,
        ``log 1/S sum_s p_s(y_n) = logsumexp_s log p_s(y_n) - log S`` when ``log_probs``
        is known."""
        index = y.long().unsqueeze(-1)
        if self.log_probs is None:
            return torch.log(self.mean.gather(-1, index).squeeze(-1))
        picked = self.log_probs.gather(-1, index.expand(*self.log_probs.shape[:-1], 1))
        return torch.logsumexp(picked.squeeze(-1), 0) - math.log(self.log_probs.shape[0])

    @property
    def entropy(self) -> Tensor:
        """(N,) entropy of the averaged predictive, in nats."""
        p = self.mean
        return -(p * torch.log(p.clamp_min(torch.finfo(p.dtype).tiny))).sum(-1)


Predictive = GaussianMixturePredictive | CategoricalPredictive


def predictive_from_likelihood(fn: dist.Distribution) -> Predictive:
    """Turn the likelihood at ``obs`` (batch shape (S, N)) into a predictive object."""
    while isinstance(fn, (dist.Independent, dist.MaskedDistribution)):
        fn = fn.base_dist
    if isinstance(fn, dist.Normal):
        loc, scale = torch.broadcast_tensors(fn.loc, fn.scale)
        return GaussianMixturePredictive(loc.detach(), scale.detach())
    if isinstance(fn, dist.Categorical):
        return CategoricalPredictive(fn.probs.detach(), fn.logits.detach())
    raise TypeError("predict supports Normal and Categorical likelihoods at site 'obs', "
                    f"got {type(fn).__name__}.")


def _parameter_dtype(*objects: Callable) -> torch.dtype | None:
    """The floating dtype of the first floating parameter or buffer of ``objects`` that
    are modules (``None`` for plain functions and modules without one)."""
    for obj in objects:
        if isinstance(obj, torch.nn.Module):
            for tensor in (*obj.parameters(), *obj.buffers()):
                if tensor.is_floating_point():
                    return tensor.dtype
    return None


def concatenate(preds: Sequence[Predictive]) -> Predictive:
    """The predictive of the points of ``preds`` (one per batch of inputs) together: their
    points joined, each keeping its samples."""
    if isinstance(preds[0], GaussianMixturePredictive):
        return GaussianMixturePredictive(torch.cat([p.loc for p in preds], 1),
                                         torch.cat([p.scale for p in preds], 1))
    logs = [p.log_probs for p in preds]
    return CategoricalPredictive(torch.cat([p.probs for p in preds], 1),
                                 None if any(t is None for t in logs) else torch.cat(logs, 1))


def predict_batches(predict_inputs: Callable[[Tensor], Predictive], loader: object
                    ) -> Predictive:
    """``predict_inputs`` of the inputs of each batch of ``loader`` (a ``DataLoader``, any
    re-iterable of ``x`` or ``(x, y)`` batches; see
    [`as_batches`][bnn_zoo._core.batches.as_batches]), joined by [`concatenate`][]: the network's
    memory is that of one batch, the
    predictive's that of all the points."""
    return concatenate([predict_inputs(x) for x, _ in as_batches(loader, targets=False,
                                                                  sized=False)])


@torch.no_grad()
def predict(model: Callable, guide: Callable, x: Tensor | Iterable, *, num_samples: int = 100,
            max_plate_nesting: int = 1) -> Predictive:
    """Posterior predictive of ``model`` under ``guide`` at inputs ``x`` (N, D) (or (N, ...)
    for a model that takes them).

    All ``num_samples`` weight samples go through the network in one pass. ``x`` may be
    a tensor or a numpy array; inputs of another floating dtype than the parameters of
    ``model``/``guide`` (float64 inputs of a float32 fit) are cast to the parameters'
    dtype, as numpy and scikit-learn users expect. Or a loader of inputs (batches ``x``
    or ``(x, y)``): one pass per batch, the predictives joined (`predict_batches`).
    """
    if is_loader(x):
        return predict_batches(partial(predict, model, guide, num_samples=num_samples,
                                       max_plate_nesting=max_plate_nesting), x)
    x, _ = check_data(x, any_shape=True)  # the model checks its own inputs
    return sample_predictive(model, guide, x, num_samples=num_samples,
                             max_plate_nesting=max_plate_nesting)


@torch.no_grad()
def sample_predictive(model: Callable, guide: Callable, x: Tensor, *, num_samples: int,
                      max_plate_nesting: int) -> Predictive:
    """[`predict`][] for checked inputs ``x`` of any layout the model takes (replicas:
    (R, N, D), see [`bnn_zoo._core.replicas.predict_replicas`][]); the samples run along
    a plate left of the model's ``max_plate_nesting`` plates."""
    check_module_device("model", model, x.device)
    check_module_device("guide", guide, x.device)
    check_positive_int("num_samples", num_samples)
    dtype = _parameter_dtype(model, guide)
    if dtype is not None:
        x = x.to(dtype)
    # A private parameter store: the modules' own parameters, whatever the caller's store
    # holds (as [`bnn_zoo._core.step.SVIStep`][] trains them).
    with pyro.get_param_store().scope(), pyro.plate(
            "_predictive_samples", num_samples, dim=-max_plate_nesting - 1, device=x.device):
        guide_trace = poutine.trace(guide).get_trace(x, None)
        model_trace = poutine.trace(poutine.replay(model, guide_trace)).get_trace(x, None)
    if "obs" not in model_trace.nodes:
        raise ValueError("Expected the model to have a likelihood at sample site 'obs'.")
    pred = predictive_from_likelihood(model_trace.nodes["obs"]["fn"])
    if isinstance(pred, GaussianMixturePredictive) and pred.loc.dim() == 1:
        # a guide without latent weights
        return GaussianMixturePredictive(pred.loc.expand(num_samples, -1),
                                         pred.scale.expand(num_samples, -1))
    return pred
