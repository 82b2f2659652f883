"""The Laplace approximation of a Bayesian neural network (MacKay 1992, "A Practical
Bayesian Framework for Backpropagation Networks"; Bishop 2006, PRML 5.7; Daxberger et al.
2021, "Laplace Redux"): a Gaussian ``N(theta_MAP, (alpha I + beta H)^-1)`` around the MAP,
its prior precision ``alpha`` (and a regression's noise precision ``beta``) tuned by the
evidence or on held-out points, and the closed-form GLM predictive.

One package, a file for each concept, all private behind this module:

- the method and its settings: [`Laplace`][bnn_zoo.methods.laplace.Laplace] chains the
  steps below and returns a [`LaplaceFit`][bnn_zoo.methods.laplace.LaplaceFit];
  [`CurvatureSettings`][bnn_zoo.methods.laplace.CurvatureSettings],
  [`EvidenceSettings`][bnn_zoo.methods.laplace.EvidenceSettings] and
  [`ValidationSettings`][bnn_zoo.methods.laplace.ValidationSettings] configure them;
- the steps a user can call alone, as in laplace-torch:
  [`LaplaceProblem`][bnn_zoo.methods.laplace.LaplaceProblem] fits the curvature around a
  MAP and maximises the evidence, [`tune_on_held_out`][bnn_zoo.methods.laplace.tune_on_held_out]
  tunes on held-out points, and the
  [`LaplacePosterior`][bnn_zoo.methods.laplace.LaplacePosterior] predicts;
- the curvature structures, one class each in a registry
  ([`STRUCTURES`][bnn_zoo.methods.laplace.STRUCTURES]; a new structure is one
  [`Structure`][bnn_zoo.methods.laplace.Structure] subclass and one line), and the
  precision blocks they build;
- the Pyro pair: [`LaplaceGuide`][bnn_zoo.methods.laplace.LaplaceGuide] and the predictive
  models [`LinearizedModel`][bnn_zoo.methods.laplace.LinearizedModel] and
  [`NonlinearModel`][bnn_zoo.methods.laplace.NonlinearModel].
"""

from bnn_zoo.methods.laplace._dense import (
           DenseBlock,
           DiagBlock,
           Indefinite,
           NotPositiveDefiniteError,
)
from bnn_zoo.methods.laplace._evidence import EvidenceMethod, EvidenceSettings
from bnn_zoo.methods.laplace._factored import KronBlock, LowRankBlock
from bnn_zoo.methods.laplace._guide import LaplaceGuide
from bnn_zoo.methods.laplace._linearized import LinearizedModel, NonlinearModel
from bnn_zoo.methods.laplace._method import Laplace, LaplaceFit, PredictiveKind
from bnn_zoo.methods.laplace._posterior import LaplacePosterior, Link
from bnn_zoo.methods.laplace._problem import CurvatureSettings, LaplaceProblem
from bnn_zoo.methods.laplace._structures import STRUCTURES, CurvatureName, Structure
from bnn_zoo.methods.laplace._validation import ValidationSettings, tune_on_held_out

__all__ = ["STRUCTURES", "CurvatureName", "CurvatureSettings", "DenseBlock", "DiagBlock",
           "EvidenceMethod", "EvidenceSettings", "Indefinite", "KronBlock", "Laplace",
           "LaplaceFit", "LaplaceGuide", "LaplacePosterior", "LaplaceProblem",
           "LinearizedModel", "Link", "LowRankBlock", "NonlinearModel",
           "NotPositiveDefiniteError", "PredictiveKind", "Structure", "ValidationSettings",
           "tune_on_held_out"]
