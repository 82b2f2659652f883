"""Evaluation (layer 4): the metrics of a predictive on test data (regression: RMSE,
log-likelihood, coverage; classification: accuracy, NLL, Brier score, calibration error,
entropy), and the observation noise tuned on a held-out part of the training set."""

from bnn_zoo.evaluation._metrics import (
    NonFiniteMetricWarning,
    auroc,
    classification_metrics,
    entropy_parts,
    evaluate,
    expected_calibration_error,
    metrics,
    regression_metrics,
    reliability_bins,
)
from bnn_zoo.evaluation._noise_tuning import NoiseTunedPosterior, tune_noise

__all__ = ["NoiseTunedPosterior", "NonFiniteMetricWarning", "auroc", "classification_metrics",
           "entropy_parts", "evaluate", "expected_calibration_error", "metrics",
           "regression_metrics", "reliability_bins", "tune_noise"]
