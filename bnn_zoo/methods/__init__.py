"""Inference methods (layer 3), each a frozen dataclass behind the
[`Method`][bnn_zoo.methods.Method] protocol: fit on standardised data, return a
[`Posterior`][bnn_zoo.methods.Posterior] that predicts and is a Pyro model and guide.

[`SVI`][bnn_zoo.methods.SVI], [`Laplace`][bnn_zoo.methods.laplace.Laplace] (its own package,
[`bnn_zoo.methods.laplace`][]), [`HMC`][bnn_zoo.methods.HMC] (the reference: vectorised
chains, gated by [`ConvergenceGate`][bnn_zoo.methods.ConvergenceGate]; its noise
[`MapNoise`][bnn_zoo.methods.MapNoise], [`HeldOutNoise`][bnn_zoo.methods.HeldOutNoise] or
[`SampledNoise`][bnn_zoo.methods.SampledNoise]),
[`NUTS`][bnn_zoo.methods.NUTS], [`IVON`][bnn_zoo.methods.IVON],
[`SGMCMC`][bnn_zoo.methods.SGMCMC] (SGLD and SGHMC), [`SWAG`][bnn_zoo.methods.SWAG],
[`Ensemble`][bnn_zoo.methods.Ensemble], [`ExactGP`][bnn_zoo.methods.ExactGP] and
[`LogitNormalSVI`][bnn_zoo.methods.LogitNormalSVI]; the training
[`Budget`][bnn_zoo.methods.Budget] they share.
"""

from bnn_zoo.methods._base import Budget, Method, Posterior, UnsupportedProblem
from bnn_zoo.methods._ensemble import Ensemble
from bnn_zoo.methods._gp import ExactGP
from bnn_zoo.methods._hmc import HMC, HeldOutNoise, MapNoise, SampledNoise
from bnn_zoo.methods._ivon import IVON
from bnn_zoo.methods._logitnormal import LogitNormalSVI
from bnn_zoo.methods._nuts import NUTS, ConvergenceGate, PosteriorSamples, chain_diagnostics
from bnn_zoo.methods._sgmcmc import SGMCMC, sgmcmc_samples
from bnn_zoo.methods._svi import SVI
from bnn_zoo.methods._swag import SWAG

__all__ = ["HMC", "IVON", "NUTS", "SGMCMC", "SVI", "SWAG", "Budget", "ConvergenceGate", "Ensemble",
           "ExactGP", "HeldOutNoise", "LogitNormalSVI", "MapNoise", "Method", "Posterior",
           "PosteriorSamples", "SampledNoise", "UnsupportedProblem", "chain_diagnostics",
           "sgmcmc_samples"]
