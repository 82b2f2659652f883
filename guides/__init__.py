"""Custom guides of the zoo (installed as ``bnn_zoo.guides``)."""

from bnn_zoo.guides.bbb import BayesByBackpropGuide as BayesByBackpropGuide
from bnn_zoo.guides.flow import AffineShiftedFlow as AffineShiftedFlow
from bnn_zoo.guides.mean_field import MeanFieldGuide as MeanFieldGuide
from bnn_zoo.guides.mixture import MixtureGuide as MixtureGuide
from bnn_zoo.guides.params import LowRankMultivariateNormal as LowRankMultivariateNormal
from bnn_zoo.guides.params import MultivariateNormal as MultivariateNormal

__all__ = ["AffineShiftedFlow", "BayesByBackpropGuide",
           "LowRankMultivariateNormal", "MeanFieldGuide", "MixtureGuide", "MultivariateNormal"]
