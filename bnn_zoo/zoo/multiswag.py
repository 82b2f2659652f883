"""Zoo entry ``multiswag``: MultiSWAG (Wilson and Izmailov 2020, "Bayesian Deep Learning and
a Probabilistic Perspective of Generalization", Sec. 4).

Five independent ``swag`` fits from different seeds (each a MAP fit, then SWAG's Gaussian
``q_m(theta) = N(theta_SWA,m, 1/2 (Sigma_diag,m + D_m D_m^T / (K - 1)))``; the ``swag``
entry's method and budget, fitted one by one: [`bnn_zoo.methods._ensemble`][]), and the
predictive the equal mixture of their predictives, 20 draws from each,

    p(y | x) = 1/M sum_m 1/S sum_s p(y | x, theta_ms),   theta_ms ~ q_m:

the ensemble covers several modes, each SWAG Gaussian the spread around its own.
"""

from __future__ import annotations

from bnn_zoo._core.tasks import TASKS
from bnn_zoo.methods._ensemble import Ensemble
from bnn_zoo.zoo import TINY_BUDGET, Entry, register
from bnn_zoo.zoo._defaults import MAP_BUDGET, SWAG_METHOD, fan_in_mlp

register(Entry(
    name="multiswag",
    description="MultiSWAG: mixture of 5 SWAG Gaussians from different seeds "
                "(Wilson & Izmailov 2020)",
    tasks=TASKS,
    source='Wilson & Izmailov 2020, "Bayesian Deep Learning and a Probabilistic Perspective '
           'of Generalization"',
    model=fan_in_mlp,
    method=Ensemble(member=SWAG_METHOD, members=5, samples_per_member=20),
    budget=MAP_BUDGET,
    tiny={**TINY_BUDGET, "method_options": {"members": 2, "samples_per_member": 2}},
    tunable_noise=True,
    accepts_net=True,
))
