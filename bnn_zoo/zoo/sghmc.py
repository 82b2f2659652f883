"""Zoo entry ``sghmc``: stochastic gradient Hamiltonian Monte Carlo (Chen, Fox & Guestrin
2014) on the zoo's Bayesian MLP or a user's network (see [`bnn_zoo.methods._sgmcmc`][]).

As ``nuts``: a MAP fit (``map``'s guide, fan-in prior) gives the chain's start and the
fixed noise; then SGHMC with friction 0.05 and the preconditioner adapted over the
burn-in, on minibatches of the budget's ``batch_size`` (full batch up to that many
points), 2 chains of ``burn_in`` dropped steps and ``draws`` draws kept one step in
``thinning``. ``method_options={"schedule": "cyclical", "cycles": 4}`` samples with the
cyclical step size of Zhang et al. (2020) instead.
"""

from __future__ import annotations

from bnn_zoo.methods._sgmcmc import SGMCMC
from bnn_zoo.methods._svi import SVI
from bnn_zoo.zoo import Entry, register
from bnn_zoo.zoo._defaults import SAMPLER_BUDGET, SAMPLER_TINY, fan_in_mlp, map_guide

register(Entry(
    name="sghmc",
    description="SGHMC on the same MLP: MAP start and noise, 2 chains x 100 draws",
    tasks=("regression", "classification"),
    source='Chen, Fox & Guestrin 2014, "Stochastic Gradient Hamiltonian Monte Carlo"',
    model=fan_in_mlp,
    method=SGMCMC(start=SVI(map_guide), rule="sghmc", step_size=0.03, friction=0.05,
                  burn_in=1000, draws=100, thinning=10, chains=2),
    budget=SAMPLER_BUDGET,
    tiny=SAMPLER_TINY,
    accepts_net=True,
))
