"""Zoo entry ``sgld``: stochastic gradient Langevin dynamics (Welling & Teh 2011) on the
zoo's Bayesian MLP or a user's network (see [`bnn_zoo.methods._sgmcmc`][]).

As ``nuts``: a MAP fit (``map``'s guide, fan-in prior) gives the chain's start and the
fixed noise; then preconditioned SGLD (the preconditioner adapted over the burn-in) on
minibatches of the budget's ``batch_size`` (full batch up to that many points), 2 chains of
``burn_in`` dropped steps and ``draws`` draws kept one step in ``thinning``.
``method_options={"schedule": "cyclical", "cycles": 4}`` samples with the cyclical step
size of Zhang et al. (2020) instead.
"""

from __future__ import annotations

from bnn_zoo.methods._sgmcmc import SGMCMC
from bnn_zoo.methods._svi import SVI
from bnn_zoo.zoo import Entry, register
from bnn_zoo.zoo._defaults import SAMPLER_BUDGET, SAMPLER_TINY, fan_in_mlp, map_guide

register(Entry(
    name="sgld",
    description="SGLD on the same MLP: MAP start and noise, 2 chains x 100 draws",
    tasks=("regression", "classification"),
    source='Welling & Teh 2011, "Bayesian Learning via Stochastic Gradient Langevin Dynamics"',
    model=fan_in_mlp,
    method=SGMCMC(start=SVI(map_guide), rule="sgld", step_size=0.1, burn_in=1000,
                  draws=100, thinning=10, chains=2),
    budget=SAMPLER_BUDGET,
    tiny=SAMPLER_TINY,
    accepts_net=True,
))
