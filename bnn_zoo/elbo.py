"""The zoo's objectives: each an ELBO class that [`bnn_zoo.fit`][] and Pyro's ``SVI``
accept.

- [`MeanFieldELBO`][bnn_zoo.elbo.MeanFieldELBO]: the closed-form KL of a mean-field
  Gaussian, lazily evaluated;
  [`LocalReparameterizationELBO`][bnn_zoo.elbo.LocalReparameterizationELBO] and
  [`FlipoutELBO`][bnn_zoo.elbo.FlipoutELBO]: it under the local reparameterisation (Kingma
  et al. 2015) or flipout (Wen et al. 2018) handler;
- the objectives of Coker's notes on random-feature networks:
  [`CollapsedELBO`][bnn_zoo.elbo.CollapsedELBO],
  [`ExpectedLikelihoodELBO`][bnn_zoo.elbo.ExpectedLikelihoodELBO] and
  [`Algorithm1ELBO`][bnn_zoo.elbo.Algorithm1ELBO];
- the mixture-of-Gaussians family's [`MixtureELBO`][bnn_zoo.elbo.MixtureELBO], and
  [`elbo_estimate`][bnn_zoo.elbo.elbo_estimate], an ELBO's value with its Monte Carlo
  standard error.
"""

from bnn_zoo._core.elbo import (
    Algorithm1ELBO,
    CollapsedELBO,
    DifferentiableLossELBO,
    ExpectedLikelihoodELBO,
    FlipoutELBO,
    LocalReparameterizationELBO,
    MeanFieldELBO,
    MixtureELBO,
    elbo_estimate,
    gaussian_kl,
    gaussian_log_density,
)

__all__ = ["Algorithm1ELBO", "CollapsedELBO", "DifferentiableLossELBO", "ExpectedLikelihoodELBO",
           "FlipoutELBO", "LocalReparameterizationELBO", "MeanFieldELBO", "MixtureELBO",
           "elbo_estimate", "gaussian_kl", "gaussian_log_density"]
