"""Zoo entry ``mean_field_clf``: mean-field Gaussian VI for classification (Graves 2011,
"Practical Variational Inference for Neural Networks"), its KL to the ``N(0, I)`` prior in
closed form, as the notes "ELBO diagonal Gaussian" derive it."""

from __future__ import annotations

from collections.abc import Sequence

import pyro.infer

from bnn_zoo._core.checks import check_positive
from bnn_zoo.guides._mean_field import MeanFieldGuide
from bnn_zoo.methods._base import Budget
from bnn_zoo.methods._options import Factory, factory
from bnn_zoo.methods._svi import SVI
from bnn_zoo.models._mlp import BayesianMLP
from bnn_zoo.models._priors import GaussianPrior
from bnn_zoo.zoo import Entry, register
from bnn_zoo.zoo._defaults import mlp


@factory("hidden", "activation", "prior_scale")
def classifier(in_dim: int, out_dim: int, *, task: str = "classification",
               hidden: Sequence[int] = (50,), activation: str = "relu",
               prior_scale: float = 1.0) -> BayesianMLP:
    """The zoo's MLP with a categorical likelihood on its logits and the prior
    ``N(0, prior_scale^2 I)`` on every weight tensor (the notes' ``N(0, I)`` by default)."""
    prior = GaussianPrior(check_positive("prior_scale", prior_scale))
    return mlp(in_dim, out_dim, task=task, hidden=hidden, activation=activation, prior=prior)


register(Entry(
    name="mean_field_clf",
    description="mean-field Gaussian, closed-form KL (TraceMeanField_ELBO), MC-averaged probs",
    tasks=("classification",),
    source='Graves 2011, "Practical Variational Inference for Neural Networks"',
    notes='"ELBO diagonal Gaussian" (unsigned notes)',
    model=classifier,
    # TraceMeanField_ELBO: the notes' ELBO with the KL of eq. (1) in closed form
    method=SVI(Factory(MeanFieldGuide, ("init_scale", "generator")),
               elbo=pyro.infer.TraceMeanField_ELBO),
    budget=Budget(steps=1000, lr=1e-2, batch_size=None, jit=True),
    accepts_net=True,
))
