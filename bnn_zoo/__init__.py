"""bnn-zoo: a Pyro model zoo for Bayesian neural networks.

Importing the package turns on Pyro's ``module_local_params`` setting: the
parameters of every ``PyroModule`` (our guides, the autoguides, models with a
learned noise) then live in the module, not in Pyro's global parameter store,
so two guides fitted one after the other never share parameters by name.
"""

from __future__ import annotations

import pyro

pyro.settings.set(module_local_params=True)

from bnn_zoo import data, zoo  # noqa: E402
from bnn_zoo.metrics import metrics  # noqa: E402
from bnn_zoo.prediction import (  # noqa: E402
    CategoricalPredictive,
    GaussianMixturePredictive,
    predict,
)
from bnn_zoo.training import FitResult, TrainingDiverged, fit  # noqa: E402


def evaluate(model, guide, x, y, *, num_samples: int = 200) -> dict[str, float]:
    """Metrics of the posterior predictive of ``model`` under ``guide`` at ``(x, y)``."""
    return metrics(predict(model, guide, x, num_samples=num_samples), y)


__all__ = ["CategoricalPredictive", "FitResult", "GaussianMixturePredictive",
           "TrainingDiverged", "data", "evaluate", "fit", "metrics", "predict", "zoo"]
__version__ = "0.1.0"
