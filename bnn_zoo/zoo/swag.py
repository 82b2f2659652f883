"""Zoo entry ``swag``: SWAG (Maddox et al. 2019, "A Simple Baseline for Bayesian Uncertainty
in Deep Learning"; see [`bnn_zoo.methods._swag`][]).

The ``map`` entry's model, guide and budget give the MAP start; the optimisation then goes
on at a constant learning rate ``1e-2``, collecting the weights once an epoch, 40 times,
and the posterior is ``N(theta_SWA, 1/2 (Sigma_diag + D D^T / (K - 1)))`` with rank
``K = 20`` (the paper's), the noise scale fixed at the MAP's (tuned on held-out points in the
UCI protocol, ``validation``).
"""

from __future__ import annotations

from bnn_zoo._core.tasks import TASKS
from bnn_zoo.zoo import TINY_BUDGET, Entry, register
from bnn_zoo.zoo._defaults import MAP_BUDGET, SWAG_METHOD, fan_in_mlp

register(Entry(
    name="swag",
    description="SWAG: low-rank plus diagonal Gaussian of the iterates after MAP (Maddox 2019)",
    tasks=TASKS,
    source='Maddox et al. 2019, "A Simple Baseline for Bayesian Uncertainty in Deep Learning"',
    model=fan_in_mlp,
    method=SWAG_METHOD,
    budget=MAP_BUDGET,
    tiny={**TINY_BUDGET, "method_options": {"rank": 2, "snapshots": 3}},
    tunable_noise=True,
    accepts_net=True,
))
