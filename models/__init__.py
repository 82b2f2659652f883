"""Pyro models of the zoo (installed as ``bnn_zoo.models``)."""

from bnn_zoo.models.mlp import BayesianMLP as BayesianMLP
from bnn_zoo.models.module import BayesianModule as BayesianModule
from bnn_zoo.models.module import digits_cnn as digits_cnn
from bnn_zoo.models.priors import GaussianPrior as GaussianPrior
from bnn_zoo.models.priors import ScaleMixturePrior as ScaleMixturePrior
from bnn_zoo.models.targets import UnnormalisedModel as UnnormalisedModel

__all__ = ["BayesianMLP", "BayesianModule", "GaussianPrior", "ScaleMixturePrior",
           "UnnormalisedModel", "digits_cnn"]
