"""Zoo entry ``fullrank``: a full-covariance Gaussian over all the weights,
``q(w) = N(mu, L L^T)`` (full-rank ADVI, Kucukelbir et al. 2017, "Automatic
Differentiation Variational Inference"; Pyro's ``AutoMultivariateNormal``, its parameters
as ``PyroParam`` s: [`MultivariateNormal`][bnn_zoo.guides.MultivariateNormal]).

The reference between the mean-field and the low-rank guides and NUTS: every correlation
between weights is free, at ``P (P + 3) / 2`` parameters for ``P`` weights, so it is exact
for a linear-Gaussian model and affordable for the zoo's small nets (``P = 151`` on a
1-50-1 net). It keeps the ``N(0, 1)`` prior and the budget of ``lowrank``.
"""

from __future__ import annotations

from bnn_zoo.guides._params import MultivariateNormal
from bnn_zoo.methods._options import factory
from bnn_zoo.methods._svi import SVI
from bnn_zoo.models._mlp import BayesianMLP
from bnn_zoo.models._module import BayesianModule
from bnn_zoo.zoo import Entry, register
from bnn_zoo.zoo._defaults import STRUCTURED_BUDGET, init_loc_fn, mlp


@factory("init_scale")
def full_rank(model: BayesianMLP | BayesianModule, *,
              init_scale: float = 0.01) -> MultivariateNormal:
    """Full-covariance Gaussian over all weights, started narrow at a fan-in point
    (a user's network: at its own weights, `init_loc_fn`)."""
    return MultivariateNormal(model, init_loc_fn=init_loc_fn(model), init_scale=init_scale)


register(Entry(
    name="fullrank",
    description="full-covariance Gaussian over all weights (Pyro AutoMultivariateNormal)",
    tasks=("regression", "classification"),
    source='Kucukelbir et al. 2017, "Automatic Differentiation Variational Inference"',
    model=mlp,
    method=SVI(full_rank),
    budget=STRUCTURED_BUDGET,
    tunable_noise=True,
    accepts_net=True,
))
