"""A mean-field ELBO that computes only the terms it uses.

.. math::

    \\mathcal{L}(q) = \\sum_{\\text{observed}} s \\log p(y | w)
                 - \\sum_{\\text{latent}} s \\, \\mathrm{KL}(q(w) \\| p(w)),

with the KL in closed form wherever ``torch.distributions.kl_divergence`` knows
the pair (Gaussian guide, Gaussian prior: Blundell et al. 2015, seed 002 eq. 1),
and the single-sample estimate ``log p(w) - log q(w)`` at the guide's sample
otherwise (e.g. the scale-mixture prior); ``s`` is the site's scale (minibatch
``N / B`` on the likelihood, a KL weight on the latents).

It computes the same objective as Pyro's ``TraceMeanField_ELBO``, but Pyro's
implementation first evaluates every log density of both traces (and so the
Gaussian log densities of all weights, which the closed-form KL then ignores):
on a 784-400-400-10 net those unused terms cost as much as the KL itself. This
class evaluates each term once, lazily. Like ``TraceMeanField_ELBO`` it requires
a fully reparameterised guide whose latents are all global (no local latent
sites inside data plates with dependencies between them).
"""

from __future__ import annotations

import pyro
import pyro.distributions as dist
from pyro import poutine
from pyro.distributions.util import is_identically_zero
from pyro.infer.util import is_validation_enabled, torch_item
from pyro.poutine.messenger import Messenger
from pyro.poutine.subsample_messenger import _Subsample
from pyro.util import check_model_guide_match, warn_if_nan
from torch import Tensor
from torch.distributions import kl_divergence

from bnn_zoo.core.handlers import flipout, local_reparameterization

__all__ = ["DifferentiableLossELBO", "FlipoutELBO", "LocalReparameterizationELBO",
           "MeanFieldELBO"]

def _normal_moments(fn) -> tuple[Tensor, Tensor] | None:
    while isinstance(fn, dist.Independent):
        fn = fn.base_dist
    if isinstance(fn, dist.Normal):
        return fn.loc, fn.scale
    return None


def _sum_scaled(value: Tensor, scale) -> Tensor:
    return (value * scale).sum() if not isinstance(scale, float) or scale != 1.0 else value.sum()


class DifferentiableLossELBO(pyro.infer.ELBO):
    """An ELBO defined by its ``differentiable_loss``; ``loss`` and ``loss_and_grads``
    follow from it."""

    def loss(self, model, guide, *args, **kwargs) -> float:
        return torch_item(self.differentiable_loss(model, guide, *args, **kwargs))

    def loss_and_grads(self, model, guide, *args, **kwargs) -> float:
        loss = self.differentiable_loss(model, guide, *args, **kwargs)
        loss.backward()
        return torch_item(loss)


class MeanFieldELBO(DifferentiableLossELBO):
    """Trace ELBO with closed-form KL terms, evaluated lazily (see module docstring)."""

    def _get_trace(self, model, guide, args, kwargs):
        guide_trace = poutine.trace(guide).get_trace(*args, **kwargs)
        model_trace = self._model_trace(model, guide_trace, args, kwargs)
        if is_validation_enabled():
            check_model_guide_match(model_trace, guide_trace, self.max_plate_nesting)
        return model_trace, guide_trace

    @staticmethod
    def _model_trace(model, guide_trace, args, kwargs):
        return poutine.trace(poutine.replay(model, trace=guide_trace)).get_trace(*args, **kwargs)

    @staticmethod
    def _elbo_particle(model_trace, guide_trace) -> Tensor:
        elbo = 0.0
        for name, site in model_trace.nodes.items():
            if site["type"] != "sample" or isinstance(site["fn"], _Subsample):
                continue
            if site["infer"].get("_deterministic"):
                continue
            if site["mask"] is not None:
                raise NotImplementedError(f"MeanFieldELBO does not support masked site {name!r}.")
            if site["is_observed"]:
                elbo = elbo + _sum_scaled(site["fn"].log_prob(site["value"]), site["scale"])
                continue
            guide_site = guide_trace.nodes[name]
            if is_validation_enabled() and not guide_site["fn"].has_rsample:
                raise ValueError(f"MeanFieldELBO needs a reparameterised guide at site {name!r}.")
            try:
                term = -kl_divergence(guide_site["fn"], site["fn"])
            except NotImplementedError:
                value = site["value"]
                term = site["fn"].log_prob(value) - guide_site["fn"].log_prob(value)
            if not is_identically_zero(term):
                elbo = elbo + _sum_scaled(term, site["scale"])
        return elbo

    def differentiable_loss(self, model, guide, *args, **kwargs) -> Tensor:
        loss = 0.0
        for model_trace, guide_trace in self._get_traces(model, guide, args, kwargs):
            loss = loss - self._elbo_particle(model_trace, guide_trace) / self.num_particles
        warn_if_nan(loss, "loss")
        return loss


class _LayerEstimatorELBO(MeanFieldELBO):
    """:class:`MeanFieldELBO` whose model runs under ``handler(moments)``, ``moments`` being
    the loc and scale of every Gaussian guide site (a handler of
    :mod:`bnn_zoo.core.handlers` that evaluates the layers of such weights differently)."""

    handler: type[Messenger]

    def _model_trace(self, model, guide_trace, args, kwargs):
        moments = {}
        for name, site in guide_trace.nodes.items():
            if site["type"] == "sample" and not site["is_observed"]:
                pair = _normal_moments(site["fn"])
                if pair is not None:
                    moments[name] = pair
        with self.handler(moments):
            return super()._model_trace(model, guide_trace, args, kwargs)


class LocalReparameterizationELBO(_LayerEstimatorELBO):
    """:class:`MeanFieldELBO` with the local reparameterisation trick (Kingma et al. 2015).

    The model runs under the effect handler
    :class:`~bnn_zoo.core.handlers.local_reparameterization`, given the loc and scale of
    every Gaussian guide site: each affine layer (:func:`bnn_zoo.core.nn.affine`), and each
    ``nn.Linear`` or convolution of a :class:`~bnn_zoo.models.BayesianModule`, whose weight
    and bias come from such sites draws its pre-activations from their Gaussian given the
    layer input, rather than pushing one weight sample through the minibatch.
    The KL terms are unchanged (closed form, or Monte Carlo at the guide's weight
    sample); the expected log-likelihood is the same in expectation for fully connected
    layers, with lower-variance gradients (for convolutions, an approximation: see the
    handler). The model and the guide know nothing of it: a model without such layers gets
    the plain :class:`MeanFieldELBO`.
    """

    handler = local_reparameterization


class FlipoutELBO(_LayerEstimatorELBO):
    """:class:`MeanFieldELBO` with flipout (Wen et al. 2018) in place of weight sampling.

    As :class:`LocalReparameterizationELBO`, but the model runs under
    :class:`~bnn_zoo.core.handlers.flipout`: each such layer adds the guide's weight
    perturbation ``dW = W - M`` with random signs per data point and input or output unit
    (channel), so the objective and the expected gradient are those of plain weight
    sampling (:class:`MeanFieldELBO`) for any of these layers, convolutions included, and
    the gradient variance is lower on a minibatch. A model without such layers gets the
    plain :class:`MeanFieldELBO`.
    """

    handler = flipout
