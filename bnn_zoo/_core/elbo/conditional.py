"""Objectives of Coker's notes "LogitNormal model" for a model with an exact Gaussian full
conditional of its output weights (e.g.
[`RandomFeatureRegression`][bnn_zoo.models.RandomFeatureRegression] with
[`LogitNormalGuide`][bnn_zoo.guides.LogitNormalGuide]): the collapsed ELBO, the notes'
literal Algorithm 3 ([`ExpectedLikelihoodELBO`][]) and Algorithm 1.

The collapsed ELBO and Algorithm 1 are generic over a duck-typed pair:

* the model has ``conditional(x, y, s)``, the full conditional of the output weights
  given the scales ``s`` (an object with ``log_evidence``, ``log p(y | X, s)``, and
  ``distribution()``), and ``scale_prior()``, the prior ``p(s)``;
* the guide has ``condition_on(x, y)`` (the data of the full conditional),
  ``scale_distribution()``, ``q(s)``, and ``sample_scales(x, y)``, its guide of ``s``
  alone.

See `bnn_zoo.guides._logitnormal` for the mathematics of the objectives and
the notes' slip (it averages likelihoods where an ELBO averages log-likelihoods).
"""

from __future__ import annotations

import torch
from pyro import poutine
from pyro.poutine.runtime import _PYRO_STACK
from torch import Tensor
from torch.distributions import kl_divergence

from bnn_zoo._core.checks import check_positive_int
from bnn_zoo._core.elbo.mean_field import DifferentiableLossELBO, MeanFieldELBO
from bnn_zoo._core.handlers import subsample_data

__all__ = ["Algorithm1ELBO", "CollapsedELBO", "ExpectedLikelihoodELBO"]

MODEL_INTERFACE = ("conditional", "scale_prior")
GUIDE_INTERFACE = ("condition_on", "scale_distribution", "sample_scales")


def _check_pair(model: object, guide: object) -> None:
    for argument, obj, names in (("model", model, MODEL_INTERFACE),
                                 ("guide", guide, GUIDE_INTERFACE)):
        missing = [name for name in names if not callable(getattr(obj, name, None))]
        if missing:
            raise TypeError(f"Expected {argument} to have {', '.join(names)} (e.g. a "
                            f"RandomFeatureRegression and a LogitNormalGuide), but "
                            f"{type(obj).__name__} lacks {', '.join(missing)}.")


class CollapsedELBO(DifferentiableLossELBO):
    """The ELBO with the output weights ``beta`` integrated out (Coker's model, collapsed):

    .. math::

        \\mathcal{L}(\\phi) = \\frac{1}{P}\\sum_{p=1}^{P}
            \\log \\mathcal{N}(y; 0, \\sigma_\\beta^2 \\Phi_p \\Phi_p^T + \\sigma^2 I)
            - \\mathrm{KL}(q_\\phi(s) \\| p(s)), \\qquad s_p \\sim q_\\phi(s),

    ``P = num_particles`` reparameterised samples, always vectorised, the evidence
    ``model.conditional(x, y, s).log_evidence`` (by the K x K form of
    [`feature_posterior`][bnn_zoo.models.feature_posterior]). It is the Algorithm-3 ELBO with
    ``beta``'s exact conditional, evaluated without sampling ``beta``. It also
    conditions the guide on ``(x, y)``, so the guide predicts.

    .. warning:: The evidence does not split over data points, so the objective
       needs the full batch: under a minibatch (``batch_size``) it raises.
    """

    def _get_trace(self, model, guide, args, kwargs):
        raise NotImplementedError("CollapsedELBO integrates beta out; it traces no model.")

    def differentiable_loss(self, model, guide, x: Tensor, y: Tensor) -> Tensor:
        _check_pair(model, guide)
        if any(isinstance(h, subsample_data) for h in _PYRO_STACK):
            raise ValueError("CollapsedELBO needs the full data: use batch_size=None.")
        guide.condition_on(x, y)
        q = guide.scale_distribution()
        s = q.rsample((self.num_particles,))
        log_evidence = model.conditional(x, y, s).log_evidence.mean()
        return kl_divergence(q, model.scale_prior()) - log_evidence


class ExpectedLikelihoodELBO(MeanFieldELBO):
    """Coker's literal Algorithm 3 (with log-likelihoods): the expected log-likelihood
    minus the KL of the scales alone,

    .. math::

        \\mathcal{L}_{\\text{lit}}(\\phi) = \\frac{1}{P}\\sum_{p=1}^{P}
            \\log p(y \\mid X, \\beta_p, s_p) - \\mathrm{KL}(q_\\phi(s) \\| p(s)),
        \\qquad s_p \\sim q_\\phi(s),\\ \\beta_p \\sim p(\\beta \\mid X, y, s_p),

    i.e. [`MeanFieldELBO`][] with every term of the output weights' site
    (``conditional_site``, ``log p(beta) - log q(beta | s)``) left out. Its expectation is
    the collapsed ELBO plus ``E_q(s)[KL(p(beta | X, y, s) || p(beta))]`` (the identity
    ``E_{beta | y, s}[log p(y | beta, s)] = log p(y | s) + KL(p(beta | y, s) || p(beta))``),
    so it is not a lower bound on ``log p(y | X)`` and its gradient in ``phi`` differs from
    the collapsed ELBO's: it also rewards scales whose conditional ``p(beta | X, y, s)``
    moves far from the prior, i.e. that fit the training data more closely. See
    `bnn_zoo.guides._logitnormal`.
    """

    conditional_site: str = "beta"

    def _loss_particle(self, model_trace, guide_trace) -> Tensor | None:
        if self.conditional_site not in model_trace.nodes:
            raise ValueError(f"Expected the model to have the sample site conditional_site="
                             f"{self.conditional_site!r}, but it has none.")
        dropped = model_trace.copy()
        dropped.remove_node(self.conditional_site)
        return super()._loss_particle(dropped, guide_trace)


class Algorithm1ELBO(ExpectedLikelihoodELBO):
    """Coker's Algorithm 1 with log-likelihoods (see `bnn_zoo.guides._logitnormal`).

    Every ``inner_steps`` calls (Coker's ``n_grad``; one call per optimiser
    step) it draws ``s_i ~ q(s)`` and ``beta_i ~ p(beta | X, y, s_i)`` without
    gradient; in between, the loss is minus Coker's line 11 (with log-likelihoods),

    .. math::

        \\frac{1}{P}\\sum_{p} \\log p(y \\mid X, \\beta_i, s_p)
            - \\mathrm{KL}(q_\\phi(s) \\| p(s)), \\qquad s_p \\sim q_\\phi(s),

    the model's ``beta`` observed at ``beta_i`` and its term ``log p(beta_i)`` (a constant in
    ``phi``) left out, as in [`ExpectedLikelihoodELBO`][]; ``conditional_site`` names the
    model's site of ``beta``.
    Use [`with_inner_steps`][] to set ``n_grad``: ``bnn_zoo.fit`` takes an ELBO class.
    """

    inner_steps: int = 10

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.calls = 0
        self.beta: Tensor | None = None

    @classmethod
    def with_inner_steps(cls, inner_steps: int) -> type[Algorithm1ELBO]:
        """This class with ``n_grad = inner_steps``."""
        check_positive_int("inner_steps", inner_steps)
        return type(f"{cls.__name__}_{inner_steps}", (cls,), {"inner_steps": inner_steps})

    def differentiable_loss(self, model, guide, x: Tensor, y: Tensor) -> Tensor:
        _check_pair(model, guide)
        if self.calls % self.inner_steps == 0:
            guide.condition_on(x, y)
            with torch.no_grad():
                s = guide.scale_distribution().sample()
                self.beta = model.conditional(x, y, s).distribution().sample()
        self.calls += 1
        conditioned = poutine.condition(model, data={self.conditional_site: self.beta})
        return super().differentiable_loss(conditioned, guide.sample_scales, x, y)
