"""The ELBO of a mixture guide with a choice of gradient estimator (after the notes on
fitting an unnormalised posterior by a mixture of diagonal Gaussians).

Generic over a duck-typed guide over one flattened latent site (e.g.
[`MixtureGuide`][bnn_zoo.guides.MixtureGuide], an ``AutoContinuous``): it has
``estimator`` (``"score"``, ``"pathwise"`` or ``"enumerate"``), ``num_components``,
``latent_site`` (the name of its latent sample site), ``mixture()`` (the mixture
``q``: ``weights`` (K,), ``log_prob``, ``componentwise(extra_dims)``, one draw from
every component scored by the whole mixture, and ``with_fixed_components()``, the
same density with the components' parameters detached), ``baseline`` with
``current_baseline()`` and ``update_baseline(elbo)``, and Pyro's autoguide
``prototype_trace`` / ``_setup_prototype``. The estimators (all unbiased):

* ``"score"``: :math:`\\nabla \\mathrm{ELBO} \\approx \\frac1n\\sum_s \\nabla\\log
  q(\\theta^{(s)}) \\{\\ln p(\\theta^{(s)}) - \\ln q(\\theta^{(s)}) - 1 - c\\}` (the
  mixture notes' section 4; ``c`` a running-mean baseline or 0);
* ``"pathwise"``: reparameterised given the drawn component, plus the score of the
  component for the weights, Rao-Blackwellised over ``k | theta``;
* ``"enumerate"``: :math:`\\mathrm{ELBO} = \\sum_i \\pi_i E_{\\theta \\sim N_i}[\\ln
  p(\\theta) - \\ln q(\\theta)]`, one reparameterised draw per component and particle.

See [`bnn_zoo.guides._mixture`][] for the derivations and where we differ from the
mixture notes.
"""

from __future__ import annotations

import contextlib
import math

import pyro
import torch
from pyro import poutine
from pyro.distributions.util import is_identically_zero
from pyro.poutine.messenger import Messenger
from torch import Tensor

from bnn_zoo._core.elbo.mean_field import DifferentiableLossELBO

__all__ = ["MixtureELBO", "elbo_estimate"]

GUIDE_INTERFACE = ("estimator", "num_components", "latent_site", "mixture", "baseline",
                   "current_baseline", "update_baseline")


def _per_lead(log_prob: Tensor, nesting: int, lead: int) -> Tensor:
    """Sum a site's log density over the model's ``nesting`` plate dims, keeping the
    ``lead`` particle (and component) dims to their left."""
    while log_prob.dim() < nesting + lead:
        log_prob = log_prob.unsqueeze(0)
    return log_prob.sum(tuple(range(-nesting, 0))) if nesting else log_prob


class _draw_every_component(Messenger):
    """Replace the mixture at ``site`` by its ``componentwise`` draws (batch dim at ``dim``)."""

    def __init__(self, site: str, dim: int) -> None:
        super().__init__()
        self.site, self.dim = site, dim

    def _pyro_sample(self, msg) -> None:
        if msg["name"] == self.site:
            msg["fn"] = msg["fn"].componentwise(-self.dim - 1)


class MixtureELBO(DifferentiableLossELBO):
    """The ELBO of a mixture guide, with the guide's gradient estimator.

    ``differentiable_loss`` returns ``-ELBO`` estimated from ``num_particles``
    vectorised particles (always vectorised: a plate at ``-max_plate_nesting - 1``);
    its value is the plain Monte Carlo estimate, its gradient the chosen
    estimator's (score terms enter as ``s - s.detach()``, which is zero in value).
    """

    def _per_particle(self, model, guide, args, kwargs) -> tuple[Tensor, Tensor]:
        """``log p(theta) - log q(theta)`` per particle ((P,), or (K, P) when enumerating)
        and the latent draws."""
        if self.max_plate_nesting == math.inf:
            self._guess_max_plate_nesting(model, guide, args, kwargs)
        nesting = int(self.max_plate_nesting)
        enumerate_ = guide.estimator == "enumerate"
        lead = 2 if enumerate_ else 1
        with contextlib.ExitStack() as stack:
            if enumerate_:
                if guide.prototype_trace is None:
                    guide._setup_prototype(*args, **kwargs)
                stack.enter_context(pyro.plate("_mixture_components", guide.num_components,
                                               dim=-nesting - 2))
            stack.enter_context(pyro.plate("_num_particles_vectorized", self.num_particles,
                                           dim=-nesting - 1))
            guided = (_draw_every_component(guide.latent_site, -nesting - 2)(guide)
                      if enumerate_ else guide)
            guide_trace = poutine.trace(guided).get_trace(*args, **kwargs)
            model_trace = poutine.trace(poutine.replay(model, trace=guide_trace)).get_trace(
                *args, **kwargs)
        elbo = 0.0
        for sign, trace in ((1.0, model_trace), (-1.0, guide_trace)):
            trace.compute_log_prob()
            for site in trace.nodes.values():
                if site["type"] != "sample" or is_identically_zero(site["log_prob"]) or (
                        sign < 0 and site["is_observed"]):
                    continue
                elbo = elbo + sign * _per_lead(site["log_prob"], nesting, lead)
        return elbo, guide_trace.nodes[guide.latent_site]["value"]

    def differentiable_loss(self, model, guide, *args, **kwargs) -> Tensor:
        missing = [name for name in GUIDE_INTERFACE if not hasattr(guide, name)]
        if missing:
            raise TypeError(f"MixtureELBO needs a mixture guide such as MixtureGuide, but "
                            f"{type(guide).__name__} lacks {', '.join(missing)}.")
        elbo, latent = self._per_particle(model, guide, args, kwargs)
        q = guide.mixture()
        if guide.estimator == "enumerate":
            return -(q.weights * elbo.mean(-1)).sum()
        # ``elbo`` already carries the direct gradients (for the score estimator the notes'
        # "-1" term, -grad log q) and, for pathwise, the gradients through the sample. Add
        # grad log q(theta) * (elbo - c) with theta fixed: for every parameter (score) or
        # only for the weights, the means and scales held fixed (pathwise).
        if guide.estimator == "pathwise":
            q = q.with_fixed_components()
        nesting = int(self.max_plate_nesting)
        log_q = _per_lead(q.log_prob(latent.detach()), nesting, 1)
        # With the direct term, the multiplier of grad log q is the notes' elbo - 1 - c; the
        # baseline c = mean(elbo) - 1 centres it (c = 0 is the notes' estimator).
        c = guide.current_baseline() - 1.0 if guide.baseline else 0.0
        score = log_q * (elbo.detach() - c)
        if guide.baseline and torch.is_grad_enabled():
            guide.update_baseline(elbo.detach().mean())
        return -(elbo + score - score.detach()).mean()

    def _get_trace(self, model, guide, args, kwargs):
        raise NotImplementedError("MixtureELBO computes its particles in one vectorised pass.")

    def loss(self, model, guide, *args, **kwargs) -> float:
        # Without gradients: the estimate alone, and no baseline update.
        with torch.no_grad():
            return super().loss(model, guide, *args, **kwargs)


def elbo_estimate(model, guide, *args, particles: int, batches: int = 8) -> tuple[float, float]:
    """Mean and Monte Carlo standard error of the [`MixtureELBO`][] of ``guide`` for
    ``model`` (called with ``args``): ``batches`` independent estimates of ``particles //
    batches`` particles each, their mean and ``std / sqrt(batches)``.

    Evaluated in a private parameter store, as [`bnn_zoo.fit`][] trains: in Pyro's global
    store a called ``PyroModule`` takes whatever tensor the store holds under its parameter's
    name in place of its own, so a second guide of the same class would be scored with, and
    overwrite, the first one's parameters.
    """
    per = max(1, particles // batches)
    with pyro.get_param_store().scope():
        values = torch.tensor([-MixtureELBO(num_particles=per, max_plate_nesting=1).loss(
            model, guide, *args) for _ in range(batches)])
    return values.mean().item(), (values.std() / math.sqrt(batches)).item()
