"""Predictive metrics in the units of the data.

Regression (from a :class:`~bnn_zoo.core.predictive.GaussianMixturePredictive`):

* ``rmse`` of the predictive mean;
* ``ll``: mean test log-likelihood per point, ``1/N sum_n log 1/S sum_s N(y_n; mu_sn, sigma_sn^2)``;
* ``coverage_{50,90,95}``: fraction of targets inside the central predictive interval.

Classification (from a :class:`~bnn_zoo.core.predictive.CategoricalPredictive`):

* ``accuracy`` of the arg-max of the averaged probabilities; ``nll`` per point;
* ``brier``: ``1/N sum_n sum_c (p_nc - [y_n = c])^2``;
* ``ece``: expected calibration error with 15 equal-width confidence bins
  (Guo et al. 2017), ``sum_b |B_b|/N |acc(B_b) - conf(B_b)|``;
* ``entropy``: mean predictive entropy in nats.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from bnn_zoo.core.predictive import CategoricalPredictive, GaussianMixturePredictive, predict

__all__ = ["classification_metrics", "evaluate", "expected_calibration_error", "metrics",
           "regression_metrics", "reliability_bins"]

COVERAGE_MASSES = (0.5, 0.9, 0.95)


def regression_metrics(pred: GaussianMixturePredictive, y: Tensor) -> dict[str, float]:
    if y.shape != pred.mean.shape:
        raise ValueError(f"Expected y of shape {tuple(pred.mean.shape)}, got {tuple(y.shape)}.")
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


def classification_metrics(pred: CategoricalPredictive, y: Tensor) -> dict[str, float]:
    probs = pred.mean
    if y.shape != probs.shape[:1]:
        raise ValueError(f"Expected y of shape ({probs.shape[0]},), got {tuple(y.shape)}.")
    y = y.long()
    onehot = torch.nn.functional.one_hot(y, probs.shape[-1]).to(probs.dtype)
    return {
        "accuracy": float((probs.argmax(-1) == y).float().mean()),
        "nll": float(-pred.log_prob(y).mean()),
        "brier": float(((probs - onehot) ** 2).sum(-1).mean()),
        "ece": expected_calibration_error(probs, y),
        "entropy": float(pred.entropy.mean()),
    }


def metrics(pred: GaussianMixturePredictive | CategoricalPredictive, y: Tensor) -> dict[str, float]:
    """The metrics of the predictive's task."""
    if isinstance(pred, GaussianMixturePredictive):
        return regression_metrics(pred, y)
    return classification_metrics(pred, y)


def evaluate(model: Callable, guide: Callable, x: Tensor, y: Tensor, *,
             num_samples: int = 200) -> dict[str, float]:
    """Metrics of the posterior predictive of ``model`` under ``guide`` at ``(x, y)``
    (see :func:`bnn_zoo.predict` and :func:`metrics`)."""
    return metrics(predict(model, guide, x, num_samples=num_samples), y)
