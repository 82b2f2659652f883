"""Predictive metrics in the units of the data.

Regression (from a
[`GaussianMixturePredictive`][bnn_zoo.GaussianMixturePredictive]):

* ``rmse`` of the predictive mean;
* ``ll``: mean test log-likelihood per point, ``1/N sum_n log 1/S sum_s N(y_n; mu_sn, sigma_sn^2)``;
* ``coverage_{50,90,95}``: fraction of targets inside the central predictive interval.

With D outputs (targets (N, D)) a point's log-likelihood is the joint one of its D outputs,
``log 1/S sum_s prod_d N(y_nd; mu_snd, sigma_snd^2)`` (a sum over outputs for one component),
averaged over points; ``rmse`` is over all N D numbers, ``sqrt(1/(N D) sum_{n,d} (y_nd -
mean_nd)^2``, and the coverages are per output interval, over all N D numbers.

Classification (from a [`CategoricalPredictive`][bnn_zoo.CategoricalPredictive]):

* ``accuracy`` of the arg-max of the averaged probabilities; ``nll`` per point,
  ``-1/N sum_n log 1/S sum_s p_s(y_n)``, in log space (log-sum-exp over the samples'
  log-probabilities) where the predictive keeps them, so that a confident error whose
  float32 probability underflows counts with its size, not as infinity;
* ``brier``: ``1/N sum_n sum_c (p_nc - [y_n = c])^2``;
* ``ece``: expected calibration error with 15 equal-width confidence bins
  (Guo et al. 2017), ``sum_b |B_b|/N |acc(B_b) - conf(B_b)|``;
* ``entropy``: mean predictive entropy in nats, ``H[p_mean]`` with ``p_mean = 1/S sum_s
  p_s``, split ([`entropy_parts`][]) into ``aleatoric``, the mean entropy of the samples
  ``1/S sum_s H[p_s]``, and ``mi``, the mutual information between the label and the
  weights, ``H[p_mean] - 1/S sum_s H[p_s] >= 0`` (the epistemic part; Houlsby et al. 2011,
  "Bayesian Active Learning for Classification and Preference Learning"; Depeweg et al.
  2018, "Decomposition of Uncertainty in Bayesian Deep Learning"), each a mean over points;
* [`auroc`][]: how well a score (the predictive entropy) tells two sets of points apart,
  e.g. test points from a shifted set ([`shifted_inputs`][]).

Targets are checked first: regression targets must have the predictive's shape (N,) or (N, D)
(integer targets are cast to its dtype); classification labels must be integers in
``0..C-1`` for the predictive's ``C`` classes (float labels only when exactly integral,
then cast). A metric that comes out NaN or infinite (a log-likelihood of a target the
predictive gives zero density) is returned with a [`NonFiniteMetricWarning`][]
naming it, never silently.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable
from functools import partial

import torch
from torch import Tensor

from bnn_zoo._core.batches import as_batches, is_loader
from bnn_zoo._core.checks import (
    as_data_tensor,
    check_class_labels,
    check_data,
    check_positive_int,
    check_tensor,
)
from bnn_zoo._core.predictive import (
    CategoricalPredictive,
    GaussianMixturePredictive,
    Predictive,
    predict,
)

__all__ = ["NonFiniteMetricWarning", "auroc", "classification_metrics", "entropy_parts",
           "evaluate", "evaluate_batches",
           "expected_calibration_error", "metrics", "regression_metrics", "reliability_bins",
           "shifted_inputs"]


class NonFiniteMetricWarning(RuntimeWarning):
    """A metric came out NaN or infinite; the warning names it."""

COVERAGE_MASSES = (0.5, 0.9, 0.95)


def _check_targets(y: object, like: Tensor) -> Tensor:
    """``y`` as a finite tensor of ``like``'s length and device."""
    y = check_tensor("y", as_data_tensor("y", y))
    if y.shape[:1] != like.shape[:1]:
        raise ValueError(f"Expected y to have one entry per predicted point ({like.shape[0]}), "
                         f"but got shape {tuple(y.shape)}.")
    if y.device != like.device:
        raise ValueError(f"Expected y on the device of the predictive ({like.device}), but got "
                         f"{y.device}.")
    return y


def regression_metrics(pred: GaussianMixturePredictive, y: Tensor) -> dict[str, float]:
    y = _check_targets(y, pred.mean)
    if y.shape != pred.mean.shape:
        raise ValueError(f"Expected y of shape {tuple(pred.mean.shape)}, got {tuple(y.shape)}.")
    if y.dtype == torch.bool:
        raise TypeError(f"Expected y to hold real-valued regression targets, got {y.dtype}.")
    y = y.to(pred.mean.dtype)
    out = {
        "rmse": float(((pred.mean - y) ** 2).mean().sqrt()),
        "ll": float(pred.log_prob(y).mean()),
    }
    for mass in COVERAGE_MASSES:
        lo, hi = pred.interval(mass)
        out[f"coverage_{round(mass * 100)}"] = float(((y >= lo) & (y <= hi)).float().mean())
    return out


def reliability_bins(probs: Tensor, y: Tensor, num_bins: int = 15) -> dict[str, Tensor]:
    """Per-bin count, mean confidence and accuracy of the top-class prediction."""
    confidence, predicted = probs.max(-1)
    correct = (predicted == y).to(probs.dtype)
    edges = torch.linspace(0, 1, num_bins + 1, dtype=probs.dtype, device=probs.device)
    # Bins are (lo, hi]; a confidence of exactly 0 cannot occur for a top class.
    which = torch.bucketize(confidence, edges[1:-1], right=False)
    count = torch.zeros(num_bins, dtype=probs.dtype, device=probs.device)
    count.index_add_(0, which, torch.ones_like(confidence))
    conf_sum = torch.zeros_like(count).index_add_(0, which, confidence)
    acc_sum = torch.zeros_like(count).index_add_(0, which, correct)
    safe = count.clamp_min(1)
    return {"edges": edges, "count": count, "confidence": conf_sum / safe,
            "accuracy": acc_sum / safe}


def expected_calibration_error(probs: Tensor, y: Tensor, num_bins: int = 15) -> float:
    bins = reliability_bins(probs, y, num_bins)
    gap = (bins["accuracy"] - bins["confidence"]).abs()
    return float((bins["count"] * gap).sum() / probs.shape[0])


def entropy_parts(pred: CategoricalPredictive) -> dict[str, Tensor]:
    """Per point (N,), in nats, the predictive entropy and its two parts (Depeweg et al.
    2018, "Decomposition of Uncertainty in Bayesian Deep Learning"):

    .. math::

        \\underbrace{H\\Big[\\tfrac1S \\textstyle\\sum_s p_s\\Big]}_{\\texttt{entropy}}
        = \\underbrace{\\tfrac1S \\textstyle\\sum_s H[p_s]}_{\\texttt{aleatoric}}
        + \\underbrace{I(y; w \\mid x)}_{\\texttt{mi}},

    ``H[p] = -sum_c p_c log p_c`` over the ``C`` classes, ``p_s`` the class probabilities
    of sample ``s`` (weights ``w_s``). ``mi``, the mutual information between the label and
    the weights, is computed as the mean divergence of the samples from their average,
    ``1/S sum_s KL(p_s || p_mean)`` (the same difference, without subtracting two nearly
    equal entropies), which Jensen's inequality makes non-negative; rounding can leave it a
    few ulps below zero, so it is clipped at 0. ``aleatoric`` is returned as
    ``entropy - mi``, so that the parts sum to the total. ``log p_mean = m + log 1/S sum_s
    exp(log p_s - m)``, ``m`` the samples' largest log-probability, from the predictive's
    ``log_probs`` where it keeps them (a class of probability 0 adds 0): for identical
    samples it is exactly theirs, so their ``mi`` is exactly 0. Zero for ``mi``
    means the samples agree; a predictive of one sample (a point estimate, or a
    closed-form average such as the probit approximation of a Laplace classifier) has
    only aleatoric entropy."""
    if not isinstance(pred, CategoricalPredictive):
        raise TypeError(f"Expected pred to be a CategoricalPredictive, but got "
                        f"{type(pred).__name__}.")
    logs = pred.log_probs
    if logs is None:
        logs = torch.log(pred.probs.clamp_min(torch.finfo(pred.probs.dtype).tiny))
    top = logs.amax(0)
    log_mean = top + torch.log((logs - top).exp().mean(0))
    mi = (pred.probs * (logs - log_mean)).sum(-1).mean(0).clamp_min(0)
    total = pred.entropy
    return {"entropy": total, "aleatoric": total - mi, "mi": mi}


def classification_metrics(pred: CategoricalPredictive, y: Tensor) -> dict[str, float]:
    probs = pred.mean
    y = _check_targets(y, probs)
    if y.shape != probs.shape[:1]:
        raise ValueError(f"Expected y of shape ({probs.shape[0]},), got {tuple(y.shape)}.")
    y = check_class_labels("y", y, probs.shape[-1])
    onehot = torch.nn.functional.one_hot(y, probs.shape[-1]).to(probs.dtype)
    return {
        "accuracy": float((probs.argmax(-1) == y).float().mean()),
        "nll": float(-pred.log_prob(y).mean()),
        "brier": float(((probs - onehot) ** 2).sum(-1).mean()),
        "ece": expected_calibration_error(probs, y),
        **{name: float(part.mean()) for name, part in entropy_parts(pred).items()},
    }


def auroc(negative: Tensor, positive: Tensor) -> float:
    """Area under the ROC curve of a score that should be higher on ``positive`` points:

    .. math::

        \\mathrm{AUROC} = P(s^+ > s^-) + \\tfrac12 P(s^+ = s^-)
        = \\frac{R^+ - m(m+1)/2}{n m},

    the Mann-Whitney statistic, with ``R^+`` the sum of the (tie-averaged, 1-based) ranks of
    the ``m`` positive scores among all ``n + m``. 0.5 is chance, 1 a perfect separation.
    """
    for name, scores in (("negative", negative), ("positive", positive)):
        check_tensor(name, scores, ndim=1, floating=True)
        if scores.shape[0] == 0:
            raise ValueError(f"Expected {name} to hold at least one score.")
    n, m = negative.shape[0], positive.shape[0]
    scores = torch.cat([negative, positive.to(negative.dtype)]).double()
    _, inverse, counts = torch.unique(scores, return_inverse=True, return_counts=True)
    last = counts.cumsum(0).double()
    ranks = (last - (counts - 1) / 2)[inverse]  # the mean rank of each group of ties
    return float((ranks[n:].sum() - m * (m + 1) / 2) / (n * m))


def shifted_inputs(x: Tensor, scale: Tensor, *, intensity: float = 1.0,
                   seed: int = 0) -> Tensor:
    """A covariate-shifted copy of ``x`` (N, D): ``x + intensity * scale * eps``, ``eps``
    standard normal per entry drawn from a generator seeded with ``seed`` (on the CPU, so
    every device gets the same points), ``scale`` (D,) the training inputs' standard
    deviations: the Gaussian-noise corruption of Ovadia et al. (2019) at one severity. The
    predictive entropy of a posterior that knows where its data lie should be higher there
    ([`auroc`][] of the entropies: test points negative, shifted positive)."""
    check_tensor("x", x, ndim=2, floating=True)
    check_tensor("scale", scale, ndim=1, floating=True)
    if scale.shape[0] != x.shape[1]:
        raise ValueError(f"Expected scale to have one entry per column of x ({x.shape[1]}), "
                         f"but got {scale.shape[0]}.")
    if not (isinstance(intensity, (int, float)) and intensity > 0):
        raise ValueError(f"Expected intensity > 0, got {intensity!r}.")
    eps = torch.randn(x.shape, generator=torch.Generator().manual_seed(seed), dtype=x.dtype)
    return x + intensity * scale * eps.to(x.device)


def metrics(pred: GaussianMixturePredictive | CategoricalPredictive, y: Tensor) -> dict[str, float]:
    """The metrics of the predictive's task, with a [`NonFiniteMetricWarning`][] for
    each that is NaN or infinite."""
    if isinstance(pred, GaussianMixturePredictive):
        out = regression_metrics(pred, y)
    elif isinstance(pred, CategoricalPredictive):
        out = classification_metrics(pred, y)
    else:
        raise TypeError("Expected pred to be a GaussianMixturePredictive or a "
                        f"CategoricalPredictive, but got {type(pred).__name__}.")
    for name, value in out.items():
        if not math.isfinite(value):
            warnings.warn(f"The metric {name!r} is {value}: the predictive gives some test "
                          "targets (numerically) zero probability.", NonFiniteMetricWarning,
                          stacklevel=2)
    return out


def evaluate_batches(predict_inputs: Callable[[Tensor], Predictive],
                     loader: object) -> dict[str, float]:
    """The [`metrics`][] of ``predict_inputs`` on every ``(x, y)`` batch of ``loader``
    (see [`as_batches`][bnn_zoo._core.batches.as_batches]), accumulated over the batches, so memory
    stays that of one batch. Every metric is a mean over the points,
    ``1/N sum_b n_b m_b`` for batches of ``n_b`` points with means ``m_b`` (the RMSE through
    its mean square), except the calibration error, whose bins are summed over the
    batches: ``sum_k |A_k - C_k| / N``, ``A_k`` and ``C_k`` the summed correctness and
    confidence of the points in bin ``k`` ([`reliability_bins`][])."""
    sums: dict[str, float] = {}
    bins = torch.zeros(())
    count = 0
    for x, y in as_batches(loader, sized=False):
        pred = predict_inputs(x)
        n = y.shape[0]
        for name, value in metrics(pred, y).items():
            sums[name] = sums.get(name, 0.0) + n * (value**2 if name == "rmse" else value)
        if isinstance(pred, CategoricalPredictive):
            part = reliability_bins(pred.mean, y.to(pred.mean.device).long())
            bins = bins + torch.stack([part["accuracy"], -part["confidence"]]) * part["count"]
        count += n
    out = {name: value / count for name, value in sums.items()}
    if "rmse" in out:
        out["rmse"] = math.sqrt(out["rmse"])
    if "ece" in out:
        out["ece"] = float(bins.sum(0).abs().sum() / count)
    return out


def evaluate(model: Callable, guide: Callable, x: Tensor | Iterable, y: Tensor | None = None,
             *, num_samples: int = 200) -> dict[str, float]:
    """Metrics of the posterior predictive of ``model`` under ``guide`` at ``(x, y)``
    (see [`bnn_zoo.predict`][] and [`metrics`][]); ``x`` and ``y`` may be numpy
    arrays. Or ``x`` a loader of ``(x, y)`` batches (``y`` ``None``): the metrics
    accumulated batch by batch (`evaluate_batches`)."""
    check_positive_int("num_samples", num_samples)
    if is_loader(x, y):
        if y is not None:
            raise ValueError("Expected y=None with a loader for x: the loader yields the "
                             "targets with the inputs.")
        return evaluate_batches(partial(predict, model, guide, num_samples=num_samples), x)
    x, y = check_data(x, y, any_shape=True)
    return metrics(predict(model, guide, x, num_samples=num_samples), y)
