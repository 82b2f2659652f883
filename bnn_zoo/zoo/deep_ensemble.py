"""Zoo entry ``deep_ensemble``: the deep ensemble of Lakshminarayanan et al. (2017) for
regression, with a Gaussian output per network.

Each of the five MAP networks (``map``'s fan-in prior, guide and budget, trained as
replicas like ``ensemble``'s members) has two outputs, a mean ``mu_m(x)`` and a noise
scale ``sigma_m(x) = softplus(s_m(x)) + 10^-3``, and is trained on the Gaussian negative
log-likelihood, a proper scoring rule (their Sec. 2.2; no adversarial training). The
predictive is the equal-weight mixture

    p(y | x) = 1/M sum_m N(y; mu_m(x), sigma_m(x)^2).

``ensemble`` is the same with one learned noise scale per network (tuned on held-out
data in the UCI protocol); the per-input noise is what the published deep-ensemble
results on UCI use, and it matters where the noise varies with the inputs.
"""

from __future__ import annotations

from bnn_zoo.methods._ensemble import Ensemble
from bnn_zoo.methods._svi import SVI
from bnn_zoo.zoo import Entry, register
from bnn_zoo.zoo._defaults import MAP_BUDGET, fan_in_mlp, map_guide

register(Entry(
    name="deep_ensemble",
    description="deep ensemble of 5 MAP networks with per-input Gaussian noise "
                "(Lakshminarayanan 2017)",
    tasks=("regression",),
    source='Lakshminarayanan et al. 2017, "Simple and Scalable Predictive Uncertainty '
           'Estimation using Deep Ensembles"',
    model=fan_in_mlp.with_defaults(noise="heteroscedastic"),
    method=Ensemble(member=SVI(map_guide, replicas=True), members=5),
    budget=MAP_BUDGET,
))
