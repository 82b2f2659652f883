"""The zoo's objectives, in one place: each an ELBO class that ``bnn_zoo.fit`` and Pyro's
``SVI`` accept.

* `mean_field`: [`MeanFieldELBO`][] (closed-form KL, lazily
  evaluated), [`LocalReparameterizationELBO`][] and [`FlipoutELBO`][] (it, under
  the local reparameterisation or the flipout handler);
* `conditional`: the objectives of Coker's notes, [`CollapsedELBO`][],
  [`ExpectedLikelihoodELBO`][] (the notes' literal Algorithm 3) and [`Algorithm1ELBO`][];
* `mixture`: the mixture notes' [`MixtureELBO`][], and
  [`elbo_estimate`][], its value with a Monte Carlo standard error.
"""

from bnn_zoo._core.elbo.conditional import Algorithm1ELBO as Algorithm1ELBO
from bnn_zoo._core.elbo.conditional import CollapsedELBO as CollapsedELBO
from bnn_zoo._core.elbo.conditional import ExpectedLikelihoodELBO as ExpectedLikelihoodELBO
from bnn_zoo._core.elbo.mean_field import DifferentiableLossELBO as DifferentiableLossELBO
from bnn_zoo._core.elbo.mean_field import FlipoutELBO as FlipoutELBO
from bnn_zoo._core.elbo.mean_field import (
    LocalReparameterizationELBO as LocalReparameterizationELBO,
)
from bnn_zoo._core.elbo.mean_field import MeanFieldELBO as MeanFieldELBO
from bnn_zoo._core.elbo.mean_field import gaussian_kl as gaussian_kl
from bnn_zoo._core.elbo.mean_field import gaussian_log_density as gaussian_log_density
from bnn_zoo._core.elbo.mixture import MixtureELBO as MixtureELBO
from bnn_zoo._core.elbo.mixture import elbo_estimate as elbo_estimate

__all__ = ["Algorithm1ELBO", "CollapsedELBO", "DifferentiableLossELBO", "ExpectedLikelihoodELBO",
           "FlipoutELBO", "LocalReparameterizationELBO", "MeanFieldELBO", "MixtureELBO",
           "elbo_estimate", "gaussian_kl", "gaussian_log_density"]
