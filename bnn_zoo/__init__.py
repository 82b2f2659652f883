"""bnn-zoo: a Pyro model zoo for Bayesian neural networks.

Layers, each importing only those before it:

1. `bnn_zoo._core`: functional nets, data, standardisation, input checks, the
   ELBOs, effect handlers, the SVI runner [`fit`][] and [`predict`][];
2. `bnn_zoo.models` and `bnn_zoo.guides`: Pyro models and guides;
3. `bnn_zoo.methods`: inference methods that are not plain SVI;
4. `bnn_zoo.evaluation`: metrics and noise tuning on a held-out part;
5. [`bnn_zoo.zoo`][]: the registry of entries;
6. `bnn_zoo._harness`: compare, the command line, tables, figures, prior diagnostics.

Importing the package changes no global setting of Pyro or torch.
"""

from __future__ import annotations

from bnn_zoo import data, zoo
from bnn_zoo._core.graphs import GraphWarning
from bnn_zoo._core.predictive import CategoricalPredictive, GaussianMixturePredictive, predict
from bnn_zoo._core.replicas import fit_replicas, predict_replicas
from bnn_zoo._core.step import TrainingDiverged
from bnn_zoo._core.training import FitResult, fit
from bnn_zoo.evaluation._metrics import evaluate, metrics

__all__ = ["CategoricalPredictive", "FitResult", "GaussianMixturePredictive", "GraphWarning",
           "TrainingDiverged", "data", "evaluate", "fit", "fit_replicas", "metrics", "predict",
           "predict_replicas", "zoo"]
__version__ = "0.1.0"
