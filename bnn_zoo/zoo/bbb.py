"""Zoo entry ``bbb``: Bayes by Backprop (seed 004).

Prior: ``N(0, 1)`` on every weight and bias (:class:`~bnn_zoo.models.GaussianPrior`
``(1.0)``), on standardised inputs and targets; this is *not* the seed's prior. Seed 004
states a Gaussian prior of scale ``sigma_p = 0.05`` ("In the case of prior, mu = 0.0,
sigma_p = 0.05", the same 0.05 it uses to draw the initial ``mu``, ``rho`` and ``eps``).
Under that prior every weight is held within about 0.1 of zero, a network of such weights
computes an almost constant function, and the posterior fits the mean: on ``sine`` the
seed's own 1-3-1 sigmoid net and the entry's 1-50-1 ReLU net both reach test RMSE 0.71
(the targets' standard deviation) and log-likelihood -1.08 per point. ``N(0, 1)`` gives
0.17 / 0.38 (1-3-1) and 0.12 / 0.74 (1-50-1), and the paper's scale mixture
(Blundell et al. 2015, eq. 7, :class:`~bnn_zoo.models.ScaleMixturePrior`:
``1/2 N(0, 1) + 1/2 N(0, e^-12)``) about the same, 0.17 / 0.37 and 0.11 / 0.76
(``benchmarks/bbb_priors.py``, committed in ``benchmarks/results/bbb_priors/``; 1500
steps, seed 0). ``N(0, 1)`` is the default because it is the simplest prior that fits,
its KL is in closed form (the scale mixture's is a Monte Carlo estimate), and on
standardised data a unit scale is the natural one. The others are one option away:
``model_options={"prior": GaussianPrior(0.05)}`` (the seed's) or
``model_options={"prior": ScaleMixturePrior()}`` (the paper's).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from bnn_zoo.core.elbo import LocalReparameterizationELBO
from bnn_zoo.guides.bbb import BayesByBackpropGuide
from bnn_zoo.methods.base import Budget
from bnn_zoo.methods.svi import SVI
from bnn_zoo.models.mlp import BayesianMLP, init_to_fan_in
from bnn_zoo.models.priors import GaussianPrior, ScaleMixturePrior
from bnn_zoo.zoo import Entry, register


def mlp(in_dim: int, out_dim: int, *, task: str = "regression", hidden: Sequence[int] = (50,),
        activation: str = "relu", prior: GaussianPrior | ScaleMixturePrior | None = None,
        noise_scale: float | None = None, noise: str = "homoscedastic") -> BayesianMLP:
    """The zoo's default Bayesian MLP: one hidden ReLU layer of 50 units, N(0, 1) prior,
    learned noise (one scale; ``noise="heteroscedastic"``: one per input, see
    :class:`~bnn_zoo.models.BayesianMLP`)."""
    return BayesianMLP(in_dim, out_dim, hidden, activation=activation, task=task, prior=prior,
                       noise_scale=noise_scale, noise=noise)


def init_loc_fn(model: Callable) -> Callable[[dict], object]:
    """Where the zoo's autoguides start: a user's network
    (:class:`~bnn_zoo.models.BayesianModule`, ``entry.fit(..., net=...)``) at its own
    weights (``model.init_to_net``: torch's initialisation in torch's ``(out, in, *kernel)``
    layout), the zoo's MLP at :func:`~bnn_zoo.models.mlp.init_to_fan_in`.

    The net's values are copied: an autoguide may keep the tensor it is given as its
    parameter and train it in place, which would change the user's network.
    """
    if hasattr(model, "init_to_net"):
        return lambda site: model.init_to_net(site).clone()
    return init_to_fan_in


register(Entry(
    name="bbb",
    description="Bayes by Backprop: diagonal Gaussian w = mu + softplus(rho) * eps",
    tasks=("regression", "classification"),
    source="004_ab4f0efce319fcd8.txt",
    model=mlp,
    method=SVI(BayesByBackpropGuide, elbo=LocalReparameterizationELBO, replicas=True),
    # One particle with the local reparameterisation trick fits sine better in 1500 steps
    # (test LL 0.79) than 8 weight-sampling particles in 3000 (0.68).
    budget=Budget(steps=4000, lr=3e-2, batch_size=256, jit=True),
    tunable_noise=True,
    accepts_net=True,
))
