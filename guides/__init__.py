"""Custom guides of the zoo (installed as ``bnn_zoo.guides``)."""

from bnn_zoo.guides.bbb import BayesByBackpropGuide as BayesByBackpropGuide
from bnn_zoo.guides.mixture import MixtureELBO as MixtureELBO
from bnn_zoo.guides.mixture import MixtureGuide as MixtureGuide

__all__ = ["BayesByBackpropGuide", "MixtureELBO", "MixtureGuide"]
