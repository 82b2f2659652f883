"""The defaults that several zoo entries share: the zoo's MLP, where its guides start, the
MAP point estimate, the budgets of the entry families, the SWAG method of ``swag`` and
``multiswag``, the Laplace method of ``laplace`` and of ``laplace_ensemble``'s members, and
the lecture notes of the Laplace and NNGP entries.

Every entry module imports what it shares with another entry from here, never from another
entry module, so that an entry's module is its declaration alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pyro.infer.autoguide import AutoDelta

from bnn_zoo._core.elbo import MeanFieldELBO
from bnn_zoo.methods._base import Budget
from bnn_zoo.methods._options import factory
from bnn_zoo.methods._svi import SVI
from bnn_zoo.methods._swag import SWAG
from bnn_zoo.methods.laplace import Laplace
from bnn_zoo.models._mlp import BayesianMLP, init_to_fan_in
from bnn_zoo.models._module import BayesianModule
from bnn_zoo.models._priors import GaussianPrior, ScaleMixturePrior
from bnn_zoo.zoo._entry import TINY_BUDGET

__all__ = ["ARBEL_NOTES", "LAPLACE_BUDGET", "LAPLACE_METHOD", "LAPLACE_TUNED", "MAP_BUDGET",
           "SAMPLER_BUDGET", "SAMPLER_TINY", "STRUCTURED_BUDGET", "SWAG_METHOD", "fan_in_mlp",
           "init_loc_fn", "map_guide", "mlp"]

#: The lecture notes of the Laplace entries and the infinite-width ones (``nngp``).
ARBEL_NOTES = ('Arbel 2021, "Bayesian NN under a Laplace approximation" (lecture notes, '
               "Bayesian deep learning, NASH & IASD)")
#: ``map``'s budget, shared by every member of ``ensemble``, ``deep_ensemble`` and the MAP
#: phase of ``swag`` and ``multiswag``. The rate decays to zero over the last quarter of the
#: steps (``"stable_decay"``): at a constant rate minibatch Adam ends in a noise ball around
#: the optimum, and which point of it a seed ends at moved ``map``'s test log-likelihood on
#: ``sine`` by 0.04 (standard deviation over seeds) and on UCI splits by up to 0.5
#: (``benchmarks/results/lr_schedule``); a cosine over the whole run settles it too, but
#: halves the progress of a run cut short by the caller (``steps=500``).
MAP_BUDGET = Budget(steps=4000, lr=3e-2, lr_schedule="stable_decay", batch_size=256,
                    jit=True)
#: The budget of the correlated Gaussian and flow guides (``lowrank``, ``iaf``, ``fullrank``):
#: their gradients are noisier than the mean field's, so four particles a step and a rate
#: that decays to zero (under ``map``'s budget they stalled on some splits of ``sine`` at
#: up to three times the mean field's RMSE; under this one they are within it).
STRUCTURED_BUDGET = Budget(steps=8000, lr=1e-2, lr_schedule="cosine", batch_size=256,
                           num_particles=4, jit=True)
#: The budget of every Laplace entry's MAP phase (``laplace*``, ``laplace_ensemble``).
LAPLACE_BUDGET = Budget(steps=2000, lr=1e-2, batch_size=256, jit=True)
#: How every Laplace entry but the last layer's tunes its posterior: ``alpha`` and ``beta``
#: by MacKay's evidence fixed point, a classifier's ``alpha`` then scaled on a tenth of its
#: points held out, a regression's MAP refitted under the tuned ``alpha`` and ``beta``.
LAPLACE_TUNED = {"evidence": "fixed_point", "holdout": "auto", "refine": "auto"}
#: ``laplace``'s method (the GGN, tuned so), also each member of ``laplace_ensemble``.
LAPLACE_METHOD = Laplace(curvature="ggn", **LAPLACE_TUNED)
#: The budget of the stochastic-gradient samplers (``sgld``, ``sghmc``): their MAP start's,
#: and the sampler's minibatch size (full batch up to that many points).
SAMPLER_BUDGET = Budget(steps=2000, lr=3e-2, batch_size=1000, jit=True)
#: Their tiny fit: a few steps of burn-in and sampling.
SAMPLER_TINY = {**TINY_BUDGET, "method_options": {"burn_in": 4, "draws": 4, "thinning": 1}}


@factory("hidden", "activation", "prior", "noise_scale", "noise", "noise_prior")
def mlp(in_dim: int, out_dim: int, *, task: str = "regression", hidden: Sequence[int] = (50,),
        activation: str = "relu", prior: GaussianPrior | ScaleMixturePrior | None = None,
        noise_scale: float | None = None, noise: str = "homoscedastic",
        noise_prior: float | None = None) -> BayesianMLP:
    """The zoo's default Bayesian MLP: one hidden ReLU layer of 50 units, N(0, 1) prior,
    learned noise (one scale; ``noise="heteroscedastic"``: one per input; ``noise_prior=s``:
    sampled under ``HalfNormal(s)``, see [`BayesianMLP`][bnn_zoo.models.BayesianMLP])."""
    return BayesianMLP(in_dim, out_dim, hidden, activation=activation, task=task, prior=prior,
                       noise_scale=noise_scale, noise=noise, noise_prior=noise_prior)


#: `mlp` with Neal's fan-in prior ``N(0, 1/d_in)`` by default (a ``prior=`` option
#: still replaces it): the model of ``map``, ``mean_field``, the ensembles and ``nuts``.
fan_in_mlp = mlp.with_defaults(prior=GaussianPrior(fan_in=True))


def init_loc_fn(model: Callable) -> Callable[[dict], object]:
    """Where the zoo's autoguides start: a user's network
    ([`BayesianModule`][bnn_zoo.models.BayesianModule], ``entry.fit(..., net=...)``) at its own
    weights (``model.init_to_net``: torch's initialisation in torch's ``(out, in, *kernel)``
    layout), the zoo's MLP at [`init_to_fan_in`][bnn_zoo.models._mlp.init_to_fan_in].

    The net's values are copied: an autoguide may keep the tensor it is given as its
    parameter and train it in place, which would change the user's network.
    """
    if hasattr(model, "init_to_net"):
        return lambda site: model.init_to_net(site).clone()
    return init_to_fan_in


@factory()
def map_guide(model: BayesianMLP | BayesianModule) -> AutoDelta:
    """Point estimate of every weight (MAP under the model's prior), started at
    `init_loc_fn`."""
    return AutoDelta(model, init_loc_fn=init_loc_fn(model))


#: SWAG after ``map``'s fit (rank 20, 40 snapshots at the constant learning rate 1e-2):
#: ``swag``'s method, and each member of ``multiswag``.
SWAG_METHOD = SWAG(start=SVI(map_guide, elbo=MeanFieldELBO), rank=20, snapshots=40, lr=1e-2)
