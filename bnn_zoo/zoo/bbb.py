"""Zoo entry ``bbb``: Bayes by Backprop (Blundell et al. 2015, "Weight Uncertainty in Neural
Networks"; Thakur's notes on it).

A diagonal Gaussian over every weight, ``w = mu + softplus(rho) * eps``
([`BayesByBackpropGuide`][bnn_zoo.guides.BayesByBackpropGuide]), trained on the ELBO with one
particle and the local reparameterisation trick (Kingma et al. 2015), whose gradient has a lower
variance than several particles of sampled weights.

Prior: ``N(0, 1)`` on every weight and bias ([`GaussianPrior`][bnn_zoo.models.GaussianPrior]
``(1.0)``), on standardised inputs and targets; this is *not* the prior of Thakur's notes,
which state a Gaussian prior of scale ``sigma_p = 0.05`` ("In the case of prior, mu = 0.0,
sigma_p = 0.05", the same 0.05 they use to draw the initial ``mu``, ``rho`` and ``eps``).
Under that prior every weight is held near zero, a network of such weights computes an
almost constant function, and the posterior fits the mean of the targets, with the
notes' own 1-3-1 sigmoid net as with the entry's 1-50-1 ReLU net. ``N(0, 1)`` fits the data, and
so does the paper's scale mixture (eq. 7, [`ScaleMixturePrior`][bnn_zoo.models.ScaleMixturePrior]:
``1/2 N(0, 1) + 1/2 N(0, e^-12)``) about as well (``benchmarks/bbb_priors.py``, results in
``benchmarks/results/bbb_priors/``). ``N(0, 1)`` is the default because it is the simplest
prior that fits, its KL is in closed form (the scale mixture's is a Monte Carlo estimate),
and on standardised data a unit scale is the natural one. The others are one option away:
``model_options={"prior": GaussianPrior(0.05)}`` (the notes') or
``model_options={"prior": ScaleMixturePrior()}`` (the paper's).
"""

from __future__ import annotations

from bnn_zoo._core.elbo import LocalReparameterizationELBO
from bnn_zoo.guides._bbb import BayesByBackpropGuide
from bnn_zoo.methods._base import Budget
from bnn_zoo.methods._options import Factory
from bnn_zoo.methods._svi import SVI
from bnn_zoo.zoo import Entry, register
from bnn_zoo.zoo._defaults import mlp

register(Entry(
    name="bbb",
    description="Bayes by Backprop: diagonal Gaussian w = mu + softplus(rho) * eps",
    tasks=("regression", "classification"),
    source='Blundell et al. 2015, "Weight Uncertainty in Neural Networks"',
    notes='Thakur, notes on Blundell et al. 2015, "Weight Uncertainty in Neural Networks"',
    model=mlp,
    method=SVI(Factory(BayesByBackpropGuide, ("init_scale", "generator")),
               elbo=LocalReparameterizationELBO, replicas=True),
    budget=Budget(steps=4000, lr=3e-2, lr_schedule="stable_decay", batch_size=256, jit=True),
    tunable_noise=True,
    accepts_net=True,
))
