"""Zoo entry ``hmc``: many chains of Hamiltonian Monte Carlo on the zoo's Bayesian MLP, run
as replicas of one vectorised pass, the reference every guide is measured against (see
[`bnn_zoo.methods._hmc`][]).

A MAP fit (the ``map`` entry's guide, with the fan-in prior), refined by full-batch L-BFGS
until converged, gives every chain's start; the regression noise scale is tuned on held-out
points, as the approximations' is (`HeldOutNoise`), and the chains keep it fixed: theirs is
the posterior the approximations approximate, and of the noise choices the one whose chains
pass the convergence gate on yacht (`benchmarks/reference_noise.py`). Then 8 chains of
ChEES-HMC with SNAPER's trajectory criterion, 500 warmup iterations and 2000 draws each:
the rank-normalised R-hat over 51 test points of chains with a bulk ESS near 1000 sits at
1.01 by chance alone, so the gate needs the longer chains. A data set's splits are sampled
in one pass (``HMC.fit_many``), each with its own step size, trajectory length and mass
matrix.
"""

from __future__ import annotations

from bnn_zoo.methods._base import Budget
from bnn_zoo.methods._hmc import HMC, HeldOutNoise
from bnn_zoo.methods._svi import SVI
from bnn_zoo.zoo import TINY_BUDGET, Entry, register
from bnn_zoo.zoo._defaults import fan_in_mlp, map_guide

register(Entry(
    name="hmc",
    description="ChEES-HMC (SNAPER), 8 vectorised chains x 2000 draws, held-out noise",
    tasks=("regression", "classification"),
    source='Hoffman, Radul & Sountsov 2021, "An Adaptive-MCMC Scheme for Setting '
           'Trajectory Lengths in Hamiltonian Monte Carlo"',
    model=fan_in_mlp,
    method=HMC(start=SVI(map_guide), warmup=500, samples=2000, chains=8, replicas=True,
               noise=HeldOutNoise()),
    budget=Budget(steps=2000, lr=3e-2, batch_size=256, jit=True),  # the MAP start's
    tiny={**TINY_BUDGET, "method_options": {"warmup": 4, "samples": 4, "chains": 2,
                                            "map_iterations": 5, "jit": False}},
))
