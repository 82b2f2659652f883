"""Reference entries every benchmark runs: ``map`` (AutoDelta) and ``mean_field`` (AutoNormal).

These two entries and ``ensemble`` (and ``nuts``, which starts from ``map``) put Neal's
fan-in prior ``N(0, 1/d_in)`` on every weight matrix
(`fan_in_mlp`; Neal 1996, "Bayesian Learning for Neural
Networks"). Under the ``N(0, 1)`` prior a hidden unit the data do not use keeps output
weights of scale 1, and a mean-field posterior left at that prior adds their noise to every
prediction; a point estimate is barely regularised. The fan-in prior keeps the prior on the
network's output of unit scale whatever the width.

``mean_field`` is the mean-field Gaussian of Graves (2011, "Practical Variational Inference
for Neural Networks") as Pyro's ``AutoNormal``: it samples the weights (no local
reparameterisation), so it averages several vectorised particles per step.
"""

from __future__ import annotations

from pyro.infer.autoguide import AutoNormal

from bnn_zoo._core.elbo import MeanFieldELBO
from bnn_zoo.methods._base import Budget
from bnn_zoo.methods._options import factory
from bnn_zoo.methods._svi import SVI
from bnn_zoo.models._mlp import BayesianMLP
from bnn_zoo.models._module import BayesianModule
from bnn_zoo.zoo import Entry, register
from bnn_zoo.zoo._defaults import MAP_BUDGET, fan_in_mlp, init_loc_fn, map_guide

#: AutoNormal samples the weights (no local reparameterisation): 8 particles, vectorised into
#: one pass, lower its gradient's variance enough for 3000 steps on the bundled data sets at
#: a cost per step far below that of 8 separate particles; the rate decays to zero over the
#: last quarter of the steps, as ``map``'s does (``MAP_BUDGET``).
MEAN_FIELD_BUDGET = Budget(steps=3000, lr=3e-2, lr_schedule="stable_decay", batch_size=256,
                           num_particles=8, jit=True)


@factory("init_scale")
def auto_normal(model: BayesianMLP | BayesianModule, *, init_scale: float = 0.01) -> AutoNormal:
    """Pyro's mean-field Gaussian autoguide, started narrow at a fan-in initialisation
    (a user's network: at its own weights, `init_loc_fn`)."""
    return AutoNormal(model, init_loc_fn=init_loc_fn(model), init_scale=init_scale)


register(Entry(
    name="map",
    description="MAP point estimate (Pyro AutoDelta)",
    tasks=("regression", "classification"),
    source='Neal 1996, "Bayesian Learning for Neural Networks" (the fan-in prior)',
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
    source='Graves 2011, "Practical Variational Inference for Neural Networks"',
    model=fan_in_mlp,
    method=SVI(auto_normal, elbo=MeanFieldELBO, replicas=True),
    budget=MEAN_FIELD_BUDGET,
    tunable_noise=True,
    accepts_net=True,
))
