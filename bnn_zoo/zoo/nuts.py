"""Zoo entry ``nuts``: the No-U-Turn sampler on the zoo's Bayesian MLP, the gold standard
every guide is measured against (see [`bnn_zoo.methods._nuts`][]).

A MAP fit (the ``map`` entry's guide, with the fan-in prior) gives every chain's start and
the fixed noise; then 2 chains of 300 warmup steps and 300 draws. Data sets above 1000
training points raise [`UnsupportedProblem`][bnn_zoo.zoo.UnsupportedProblem].
"""

from __future__ import annotations

from bnn_zoo.methods._base import Budget
from bnn_zoo.methods._nuts import NUTS
from bnn_zoo.methods._svi import SVI
from bnn_zoo.zoo import TINY_BUDGET, Entry, register
from bnn_zoo.zoo._defaults import fan_in_mlp, map_guide

register(Entry(
    name="nuts",
    description="NUTS (HMC) on the same MLP: MAP start and noise, 2 chains x 300 draws",
    tasks=("regression", "classification"),
    source='Hoffman & Gelman 2014, "The No-U-Turn Sampler: Adaptively Setting Path Lengths '
           'in Hamiltonian Monte Carlo"',
    model=fan_in_mlp,
    method=NUTS(start=SVI(map_guide), warmup=300, samples=300, chains=2, max_tree_depth=8,
                max_points=1000),
    budget=Budget(steps=2000, lr=3e-2, batch_size=256, jit=True),  # the MAP start's
    tiny={**TINY_BUDGET, "method_options": {"warmup": 4, "samples": 4, "max_tree_depth": 3}},
))
