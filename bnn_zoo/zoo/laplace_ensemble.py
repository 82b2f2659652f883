"""Zoo entry ``laplace_ensemble``: a mixture of Laplace approximations around the members
of a deep ensemble (Eschenhagen et al. 2021, "Mixtures of Laplace Approximations for
Improved Post-Hoc Uncertainty in Deep Learning"; each component as in Arbel's lecture
notes "Bayesian NN under a Laplace approximation" (2021)).

Five ``laplace`` fits (its method: GGN curvature, ``alpha`` and ``beta`` by MacKay's
evidence fixed point, a classifier's ``alpha`` scaled on held-out points, a regression's MAP
refitted; its budget) from different seeds, their MAP phases trained as
replicas in one pass ([`bnn_zoo.methods._ensemble.Ensemble.fit_many`][]), each with its
own Gaussian posterior ``q_m(theta) = N(theta_m, A_m^-1)``. The predictive is the
equal-weight mixture of the members' GLM predictives

    p(y | x) = 1/M sum_m N(y; f(x, theta_m), 1/beta_m + g_m(x)^T A_m^-1 g_m(x))

(regression; classification: the mixture of the members' probit predictives): the
ensemble covers several modes, each Laplace component the spread around its own.
"""

from __future__ import annotations

from bnn_zoo._core.tasks import TASKS
from bnn_zoo.methods._ensemble import Ensemble
from bnn_zoo.zoo import TINY_BUDGET, Entry, register
from bnn_zoo.zoo._defaults import ARBEL_NOTES, LAPLACE_BUDGET, LAPLACE_METHOD, mlp

register(Entry(
    name="laplace_ensemble",
    description="mixture of 5 evidence-tuned GGN Laplace approximations around ensemble "
                "members (Eschenhagen 2021)",
    tasks=TASKS,
    model=mlp,
    method=Ensemble(member=LAPLACE_METHOD, members=5),
    budget=LAPLACE_BUDGET,
    source='Eschenhagen et al. 2021, "Mixtures of Laplace Approximations for Improved '
           'Post-Hoc Uncertainty in Deep Learning"',
    notes=ARBEL_NOTES,
    tiny={**TINY_BUDGET, "method_options": {"members": 2}},
    accepts_net=True,
))
