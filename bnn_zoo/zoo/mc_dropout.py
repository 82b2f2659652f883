"""Zoo entry ``mc_dropout``: MC dropout (Gal and Ghahramani 2016, "Dropout as a Bayesian
Approximation: Representing Model Uncertainty in Deep Learning").

The zoo's MLP with its unit prior ``N(0, 1)`` and learned noise
(`mlp`) under [`MCDropoutGuide`][bnn_zoo.guides.MCDropoutGuide]:
point masses ``M`` over the weights, the inputs of every layer but the first dropped at rate
``p = 0.05`` (Gal's rate on most UCI sets; ``guide_options={"dropout": p}``),
``W = M diag(z) / (1 - p)``, ``z_j ~ Bernoulli(1 - p)``, trained on the ELBO, which is
Gal's dropout objective with the prior's weight decay ``lambda = (1 - p) l^2 / (2 N tau)``
(prior length-scale ``l = 1/s`` for a weight of prior scale ``s``, ``tau`` the noise
precision). The unit prior (``l = 1``) is weaker than ``map``'s fan-in prior
(``l^2 = d_in``: 50 on the hidden layer's weights) and nearer Gal's ``l = 1e-2``; under the
fan-in prior the dropout net underfits (on the UCI protocol, concrete most). The predictive
averages the networks of ``S`` mask draws, ``p(y | x) ~ 1/S sum_s p(y | x, M diag(z_s) /
(1 - p))``.

The masks are drawn once per weight sample, for the whole minibatch (Gal's ``q(W)``: one
draw of ``W`` per sample), not once per point as dropout layers draw them; both are
unbiased estimates of the same objective, and four vectorised particles per step lower the
variance of this one. The learning rate is annealed to nearly 0 (``lr_schedule="cosine"``),
so the point masses settle at the end of training instead of moving in the noise of the
masks and minibatches; on the UCI protocol that lowers the test RMSE (on power most). On a
user's network (``net=``) the inputs of every ``nn.Linear`` and convolution but the first
drop (a convolution's by whole channels; see
[`dropout_masks`][bnn_zoo.guides._dropout.dropout_masks]). In the UCI protocol the noise scale is
tuned on held-out points (``validation``), as Gal tunes ``tau``.
"""

from __future__ import annotations

from bnn_zoo._core.elbo import MeanFieldELBO
from bnn_zoo._core.tasks import TASKS
from bnn_zoo.guides._dropout import MCDropoutGuide
from bnn_zoo.methods._base import Budget
from bnn_zoo.methods._options import factory
from bnn_zoo.methods._svi import SVI
from bnn_zoo.models._mlp import BayesianMLP
from bnn_zoo.models._module import BayesianModule
from bnn_zoo.zoo import Entry, register
from bnn_zoo.zoo._defaults import init_loc_fn, mlp


@factory("dropout")
def dropout_guide(model: BayesianMLP | BayesianModule, *, dropout: float = 0.05
                  ) -> MCDropoutGuide:
    """[`MCDropoutGuide`][] at rate ``dropout``, its point masses started where the zoo's
    MAP guide starts (`init_loc_fn`)."""
    return MCDropoutGuide(model, dropout=dropout, init_loc_fn=init_loc_fn(model))


register(Entry(
    name="mc_dropout",
    description="MC dropout: point masses with Bernoulli(0.95) input masks (Gal 2016)",
    tasks=TASKS,
    source='Gal & Ghahramani 2016, "Dropout as a Bayesian Approximation: Representing Model '
           'Uncertainty in Deep Learning"',
    model=mlp,
    method=SVI(dropout_guide, elbo=MeanFieldELBO, replicas=True),
    budget=Budget(steps=4000, lr=1e-2, lr_schedule="cosine", batch_size=256, num_particles=4,
                  jit=True),
    tunable_noise=True,
    accepts_net=True,
))
