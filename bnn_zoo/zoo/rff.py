"""Zoo entry ``rff_logitnormal``: random-Fourier-feature net (Rahimi & Recht 2007, "Random
Features for Large-Scale Kernel Machines") with LogitNormal input scales (Coker's notes
"LogitNormal model"), trained by one of four objectives.

``method_options={"objective": ...}`` picks ``"alg3"`` (default: Algorithm 3 as an ELBO,
equal to the collapsed ELBO), ``"alg3_literal"`` (Algorithm 3 as Coker writes it, the
likelihood minus ``KL(q(s))`` alone: it overfits where the features can interpolate the
data), ``"alg1"`` (with ``inner_steps``) or ``"collapsed"``; ``feature_seed`` fixes the
random features (by default the fit's seed draws them). See
[`LogitNormalSVI`][bnn_zoo.methods.LogitNormalSVI].

The fitted guide exposes the learned input relevances,
``fitted.guide.relevance()`` (``E_q[s_d]`` and a 90% interval), and
[`bnn_zoo.guides._logitnormal.plot_relevance`][] draws them. Training runs on the
full batch: the full conditional of ``beta`` needs every training point anyway.
"""

from __future__ import annotations

from bnn_zoo._core.checks import check_choice
from bnn_zoo.methods._base import Budget
from bnn_zoo.methods._logitnormal import LogitNormalSVI
from bnn_zoo.methods._options import factory
from bnn_zoo.models._rff import RandomFeatureRegression
from bnn_zoo.zoo import Entry, register

__all__ = ["rff_model"]


@factory("num_features", "bandwidth", "prior_loc", "prior_scale", "prior_variance",
         "noise_scale", "feature_seed")
def rff_model(in_dim: int, out_dim: int = 1, *, task: str = "regression",
              num_features: int = 100, bandwidth: float = 3.0, prior_loc: float = 0.0,
              prior_scale: float = 1.0, prior_variance: float = 1.0,
              noise_scale: float | None = None, feature_seed: int = 0) -> RandomFeatureRegression:
    """[`RandomFeatureRegression`][bnn_zoo.models.RandomFeatureRegression] with K = 100
    features,
    ``W ~ N(0, 3^2)``, ``s_d ~ LogitNormal(0, 1)``, ``Var f = 1`` a priori, learned noise."""
    check_choice("task", task, ("regression",))
    if out_dim != 1:
        raise ValueError(f"Expected out_dim == 1 for regression, but got {out_dim}.")
    return RandomFeatureRegression(in_dim, num_features, bandwidth=bandwidth, prior_loc=prior_loc,
                                   prior_scale=prior_scale, prior_variance=prior_variance,
                                   noise_scale=noise_scale, feature_seed=feature_seed)


register(Entry(
    name="rff_logitnormal",
    description="random Fourier features with LogitNormal input scales, exact Gaussian "
                "conditional of the output weights (objective: alg3, alg3_literal, alg1, "
                "collapsed)",
    tasks=("regression",),
    source='Rahimi & Recht 2007, "Random Features for Large-Scale Kernel Machines", with '
           'LogitNormal input scales',
    notes='Coker, "LogitNormal model" (notes)',
    model=rff_model,
    method=LogitNormalSVI(objective="alg3"),
    budget=Budget(steps=1000, lr=5e-2, batch_size=None, num_particles=4),
))
