"""Reference entries every benchmark runs: ``map`` (AutoDelta) and ``mean_field`` (AutoNormal).

These two entries and ``ensemble`` (and ``nuts``, which starts from ``map``) put Neal's
fan-in prior ``N(0, 1/d_in)`` on every weight matrix (:func:`fan_in_mlp`). Under the
``N(0, 1)`` prior a hidden unit the data do not use keeps output weights of scale 1,
and a mean-field posterior left at that prior adds their noise to every prediction;
a point estimate is barely regularised. On UCI (boston, wine, yacht splits 0 and 2)
the fan-in prior raised AutoNormal's test log-likelihood by 0.1 to 2 nats per point.
"""

from __future__ import annotations

from functools import partial

from pyro.infer.autoguide import AutoDelta, AutoNormal

from bnn_zoo.core.elbo import MeanFieldELBO
from bnn_zoo.methods.base import Budget
from bnn_zoo.methods.svi import SVI
from bnn_zoo.models.mlp import BayesianMLP
from bnn_zoo.models.module import BayesianModule
from bnn_zoo.models.priors import GaussianPrior
from bnn_zoo.zoo import Entry, register
from bnn_zoo.zoo.bbb import init_loc_fn, mlp

#: Pyro's AutoNormal samples weights (no local reparameterisation): 8 vectorised particles
#: cost about 1.5x one particle per step and make 3000 steps enough on the bundled sets.
MEAN_FIELD_BUDGET = Budget(steps=3000, lr=3e-2, batch_size=256, num_particles=8, jit=True)
#: ``map``'s budget, shared by every ``ensemble`` member.
MAP_BUDGET = Budget(steps=4000, lr=3e-2, batch_size=256, jit=True)


#: :func:`~bnn_zoo.zoo.bbb.mlp` with the fan-in prior ``N(0, 1/d_in)`` by default (a
#: ``prior=`` option still replaces it).
fan_in_mlp = partial(mlp, prior=GaussianPrior(fan_in=True))


def map_guide(model: BayesianMLP | BayesianModule) -> AutoDelta:
    """Point estimate of every weight (MAP under the model's prior)."""
    return AutoDelta(model, init_loc_fn=init_loc_fn(model))


def auto_normal(model: BayesianMLP | BayesianModule, *, init_scale: float = 0.01) -> AutoNormal:
    """Pyro's mean-field Gaussian autoguide, started narrow at a fan-in initialisation
    (a user's network: at its own weights, :func:`~bnn_zoo.zoo.bbb.init_loc_fn`)."""
    return AutoNormal(model, init_loc_fn=init_loc_fn(model), init_scale=init_scale)


register(Entry(
    name="map",
    description="MAP point estimate (Pyro AutoDelta)",
    tasks=("regression", "classification"),
    model=fan_in_mlp,
    method=SVI(map_guide, elbo=MeanFieldELBO, replicas=True),
    budget=MAP_BUDGET,
    tunable_noise=True,
    accepts_net=True,
))

register(Entry(
    name="mean_field",
    description="mean-field Gaussian (Pyro AutoNormal)",
    tasks=("regression", "classification"),
    model=fan_in_mlp,
    method=SVI(auto_normal, elbo=MeanFieldELBO, replicas=True),
    budget=MEAN_FIELD_BUDGET,
    tunable_noise=True,
    accepts_net=True,
))
