"""Custom guides of the zoo (installed as ``bnn_zoo.guides``): each a Pyro guide for the
zoo's models, trained by SVI. The Laplace guide lives with its method in
[`bnn_zoo.methods.laplace`][]."""

from bnn_zoo.guides._bbb import BayesByBackpropGuide
from bnn_zoo.guides._dropout import MCDropoutGuide
from bnn_zoo.guides._flow import AffineShiftedFlow
from bnn_zoo.guides._logitnormal import LogitNormalGuide, plot_relevance
from bnn_zoo.guides._mean_field import MeanFieldGuide, diagonal_gaussian_kl
from bnn_zoo.guides._mixture import MixtureGuide
from bnn_zoo.guides._params import LowRankMultivariateNormal, MultivariateNormal
from bnn_zoo.guides._swag import SWAGGuide

__all__ = ["AffineShiftedFlow", "BayesByBackpropGuide", "LogitNormalGuide",
           "LowRankMultivariateNormal", "MCDropoutGuide", "MeanFieldGuide", "MixtureGuide",
           "MultivariateNormal", "SWAGGuide", "diagonal_gaussian_kl", "plot_relevance"]
