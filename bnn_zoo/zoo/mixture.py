"""Zoo entry ``mixture``: a mixture of ``K`` diagonal Gaussians over all weights (Jaakkola &
Jordan 1998, "Improving the Mean Field Approximation via the Use of Mixture Distributions";
after the notes on fitting an unnormalised posterior by a mixture of diagonal Gaussians),
its ELBO's gradient by the score function, the pathwise estimator or an exact sum over the
components ([`MixtureELBO`][bnn_zoo.elbo.MixtureELBO])."""

from __future__ import annotations

from bnn_zoo._core.elbo import MixtureELBO
from bnn_zoo.guides._mixture import MixtureGuide
from bnn_zoo.methods._base import Budget
from bnn_zoo.methods._options import factory
from bnn_zoo.methods._svi import SVI
from bnn_zoo.models._mlp import BayesianMLP
from bnn_zoo.models._module import BayesianModule
from bnn_zoo.zoo import Entry, register
from bnn_zoo.zoo._defaults import init_loc_fn, mlp


@factory("num_components", "estimator", "baseline", "init_scale", "init_spread")
def mixture_guide(model: BayesianMLP | BayesianModule, *, num_components: int = 2,
                  estimator: str = "enumerate", baseline: bool = False, init_scale: float = 0.02,
                  init_spread: float = 0.1) -> MixtureGuide:
    """[`MixtureGuide`][bnn_zoo.guides.MixtureGuide] centred on a fan-in initialisation,
    its components offset by ``init_spread`` so that they can settle in different modes."""
    return MixtureGuide(model, num_components, estimator=estimator, baseline=baseline,
                        init_scale=init_scale, init_spread=init_spread,
                        init_loc_fn=init_loc_fn(model))


register(Entry(
    name="mixture",
    description="mixture of K diagonal Gaussians; score, pathwise or enumerated gradients",
    tasks=("regression", "classification"),
    source='Jaakkola & Jordan 1998, "Improving the Mean Field Approximation via the Use of '
           'Mixture Distributions"',
    notes="Unsigned notes on fitting an unnormalised posterior by a mixture of diagonal "
          "Gaussians",
    model=mlp,
    method=SVI(mixture_guide, elbo=MixtureELBO),  # MixtureELBO applies the guide's estimator
    budget=Budget(steps=3000, lr=1e-2, batch_size=256, num_particles=4),
    tunable_noise=True,
    accepts_net=True,
))
