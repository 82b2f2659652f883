"""Custom guides of the zoo (installed as ``bnn_zoo.guides``)."""

from bnn_zoo.guides.bbb import BayesByBackpropGuide as BayesByBackpropGuide

__all__ = ["BayesByBackpropGuide"]
