"""The Laplace approximation of a Bayesian MLP or module (Bishop 2006, PRML 5.7):
its precision structures, the posterior with its closed-form GLM predictive, the guide,
and the predictive Pyro models. Fitting (MAP, curvature, evidence) is the method
[`bnn_zoo.methods.laplace.Laplace`][]."""

from bnn_zoo.guides.laplace.blocks import STRUCTURES as STRUCTURES
from bnn_zoo.guides.laplace.blocks import Block as Block
from bnn_zoo.guides.laplace.blocks import CurvatureName as CurvatureName
from bnn_zoo.guides.laplace.blocks import Structure as Structure
from bnn_zoo.guides.laplace.blocks import curvature_structure as curvature_structure
from bnn_zoo.guides.laplace.dense_blocks import DenseBlock as DenseBlock
from bnn_zoo.guides.laplace.dense_blocks import DiagBlock as DiagBlock
from bnn_zoo.guides.laplace.dense_blocks import Indefinite as Indefinite
from bnn_zoo.guides.laplace.dense_blocks import (
    NotPositiveDefiniteError as NotPositiveDefiniteError,
)
from bnn_zoo.guides.laplace.factored_blocks import KronBlock as KronBlock
from bnn_zoo.guides.laplace.factored_blocks import LowRankBlock as LowRankBlock
from bnn_zoo.guides.laplace.guide import LaplaceGuide as LaplaceGuide
from bnn_zoo.guides.laplace.linearized import LinearizedModel as LinearizedModel
from bnn_zoo.guides.laplace.linearized import NonlinearModel as NonlinearModel
from bnn_zoo.guides.laplace.posterior import LaplacePosterior as LaplacePosterior
from bnn_zoo.guides.laplace.posterior import Link as Link

__all__ = ["STRUCTURES", "Block", "CurvatureName", "DenseBlock", "DiagBlock", "Indefinite",
           "KronBlock", "LaplaceGuide", "LaplacePosterior", "LinearizedModel", "Link",
           "LowRankBlock", "NonlinearModel", "NotPositiveDefiniteError", "Structure",
           "curvature_structure"]
