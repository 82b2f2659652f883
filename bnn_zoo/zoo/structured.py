"""Reference entries with correlated Gaussian and flow posteriors: ``lowrank`` and ``iaf``.

* ``lowrank``: Pyro's ``AutoLowRankMultivariateNormal`` with its parameters as ``PyroParam``s
  ([`LowRankMultivariateNormal`][bnn_zoo.guides.LowRankMultivariateNormal]), ``q(w) = N(mu, D
  + W W^T)`` with ``W`` of rank ``r`` (default 10) over all the weights at once (a factor
  covariance, Ong, Nott & Smith 2018).
* ``iaf``: one affine inverse autoregressive flow (Kingma et al. 2016) on a standard
  normal base, ``u = mu(z) + sigma(z) * z`` with a MADE network (Pyro's stable form,
  as in ``AutoIAFNormal``), its hidden width set to the number of weights (the smallest
  MADE allows; Pyro's default ``3 d + 1`` makes the flow several times larger for no gain),
  then ``w = loc + scale * u`` started at a fan-in point and scale 0.01
  ([`AffineShiftedFlow`][bnn_zoo.guides.AffineShiftedFlow]). The plain flow, started at the
  prior, stays there; the shifted one starts as a narrow cloud around a sensible network,
  as the other guides do.

Both keep the ``N(0, 1)`` prior of `mlp`: under the fan-in
prior of ``map`` and ``mean_field`` the low-rank guide stalls far from the data's fit.
Their budget is `STRUCTURED_BUDGET`: 8000 steps of four particles each, the rate decaying
to zero, where their noisier gradients left them short of the mean field's fit.
"""

from __future__ import annotations

from pyro.distributions.transforms import affine_autoregressive

from bnn_zoo._core.checks import check_positive_int
from bnn_zoo.guides._flow import AffineShiftedFlow
from bnn_zoo.guides._params import LowRankMultivariateNormal
from bnn_zoo.methods._options import factory
from bnn_zoo.methods._svi import SVI
from bnn_zoo.models._mlp import BayesianMLP
from bnn_zoo.models._module import BayesianModule
from bnn_zoo.zoo import Entry, register
from bnn_zoo.zoo._defaults import STRUCTURED_BUDGET, init_loc_fn, mlp


@factory("rank", "init_scale")
def low_rank(model: BayesianMLP | BayesianModule, *, rank: int = 10,
             init_scale: float = 0.01) -> LowRankMultivariateNormal:
    """Low-rank-plus-diagonal Gaussian over all weights, started narrow at a fan-in init
    (a user's network: at its own weights, `init_loc_fn`)."""
    return LowRankMultivariateNormal(model, init_loc_fn=init_loc_fn(model),
                                     rank=check_positive_int("rank", rank), init_scale=init_scale)


@factory("init_scale")
def iaf(model: BayesianMLP | BayesianModule, *, init_scale: float = 0.01) -> AffineShiftedFlow:
    """One affine IAF layer (MADE hidden width = number of weights) on ``N(0, I)``, then
    ``w = loc + scale * IAF(z)`` with ``loc`` at a fan-in initialisation and ``scale``
    at ``init_scale`` ([`AffineShiftedFlow`][bnn_zoo.guides.AffineShiftedFlow]): the flow
    starts as a narrow cloud around a sensible network, like the other guides.
    """
    return AffineShiftedFlow(model, lambda dim: affine_autoregressive(
        dim, hidden_dims=[dim], stable=True), init_loc_fn=init_loc_fn(model),
        init_scale=init_scale)


register(Entry(
    name="lowrank",
    description="low-rank + diagonal Gaussian, rank 10 (Pyro AutoLowRankMultivariateNormal)",
    tasks=("regression", "classification"),
    source='Ong, Nott & Smith 2018, "Gaussian Variational Approximation With a Factor '
           'Covariance Structure"',
    model=mlp,
    method=SVI(low_rank),
    budget=STRUCTURED_BUDGET,
    tunable_noise=True,
    accepts_net=True,
))

register(Entry(
    name="iaf",
    description="inverse autoregressive flow, one affine MADE layer (Pyro AutoIAFNormal)",
    tasks=("regression", "classification"),
    source='Kingma et al. 2016, "Improved Variational Inference with Inverse Autoregressive '
           'Flow"',
    model=mlp,
    method=SVI(iaf),
    budget=STRUCTURED_BUDGET,
    tunable_noise=True,
    accepts_net=True,
))
