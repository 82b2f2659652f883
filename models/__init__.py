"""Pyro models of the zoo (installed as ``bnn_zoo.models``): Bayesian networks, their
priors and likelihoods, the random-feature and infinite-width models, and unnormalised
target densities for comparing guides with an exact reference."""

from bnn_zoo.models._likelihood import (
    Categorical,
    Gaussian,
    GaussianOutputs,
    Heteroscedastic,
    Likelihood,
)
from bnn_zoo.models._mlp import BayesianMLP
from bnn_zoo.models._module import BayesianModule, digits_cnn
from bnn_zoo.models._nngp import NNGPRegression
from bnn_zoo.models._nngp_kernel import NNGPKernel
from bnn_zoo.models._priors import GaussianPrior, ScaleMixturePrior
from bnn_zoo.models._rff import LogitNormal, RandomFeatureRegression, feature_posterior
from bnn_zoo.models._targets import TARGETS, UnnormalisedModel, bnn_posterior, target

__all__ = ["TARGETS", "BayesianMLP", "BayesianModule", "Categorical", "Gaussian",
           "GaussianOutputs", "GaussianPrior", "Heteroscedastic", "Likelihood", "LogitNormal",
           "NNGPKernel", "NNGPRegression", "RandomFeatureRegression", "ScaleMixturePrior",
           "UnnormalisedModel", "bnn_posterior", "digits_cnn", "feature_posterior", "target"]
