"""Zoo entry ``ensemble``: a deep ensemble of MAP fits, the non-Bayesian yardstick.

Five independently initialised MAP networks (the ``map`` entry's model, guide and budget;
see [`bnn_zoo.methods._ensemble`][]), trained as replicas in one pass (``entry.fit_many``:
the members of every fit together, e.g. 20 UCI splits x 5 members = 100 replicas), their
predictive the equal-weight mixture
(Lakshminarayanan et al. 2017, without adversarial training):

    p(y | x) = 1/M sum_m N(y; f_m(x), sigma_m^2)      (regression)
    p(y | x) = 1/M sum_m softmax(f_m(x))_y            (classification).
"""

from __future__ import annotations

from bnn_zoo.methods._ensemble import Ensemble
from bnn_zoo.methods._svi import SVI
from bnn_zoo.zoo import TINY_BUDGET, Entry, register
from bnn_zoo.zoo._defaults import MAP_BUDGET, fan_in_mlp, map_guide

register(Entry(
    name="ensemble",
    description="deep ensemble: 5 MAP networks from different seeds (Lakshminarayanan 2017)",
    tasks=("regression", "classification"),
    source='Lakshminarayanan et al. 2017, "Simple and Scalable Predictive Uncertainty '
           'Estimation using Deep Ensembles"',
    model=fan_in_mlp,
    method=Ensemble(member=SVI(map_guide, replicas=True), members=5),
    budget=MAP_BUDGET,
    tiny={**TINY_BUDGET, "method_options": {"members": 2}},
    tunable_noise=True,
    accepts_net=True,
))
