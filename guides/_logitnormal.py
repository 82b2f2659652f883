"""LogitNormal guide with the exact full conditional of the output weights (Coker's
notes "LogitNormal model").

For [`RandomFeatureRegression`][bnn_zoo.models.RandomFeatureRegression] the guide is

.. math::

    q_\\phi(s, \\beta) = \\prod_d \\mathrm{LogitNormal}(s_d; \\phi_{\\mu,d}, \\phi_{\\sigma,d}^2)
                        \\; p(\\beta \\mid X, y, s),

the second factor the exact Gaussian full conditional (Bayesian linear regression
on the features; [`feature_posterior`][bnn_zoo.models.feature_posterior]). Four training
objectives (``objective=`` of [`LogitNormalSVI`][bnn_zoo.methods.LogitNormalSVI]):

* ``"alg3"``, **Algorithm 3 as an ELBO** (default; Coker's "version 2.0"): the Trace
  ELBO of this guide, ``n_est`` vectorised particles ``s_k ~ q(s)``, a fresh
  ``beta_k ~ p(beta | X, y, s_k)`` for each, and ``KL(q(s) || p(s))`` in closed form:

  .. math::

      \\mathcal{L}_3(\\phi) = E_{q(s)\\,p(\\beta | X, y, s)}\\big[\\log p(y | X, \\beta, s)
          + \\log p(\\beta) - \\log q(\\beta | s)\\big] - \\mathrm{KL}(q_\\phi(s) \\| p(s)).

  Train with [`MeanFieldELBO`][bnn_zoo.elbo.MeanFieldELBO].
* ``"alg3_literal"``, **Algorithm 3 as Coker writes it** (line 9: the likelihood term
  minus ``KL(q(s))`` alone; [`ExpectedLikelihoodELBO`][bnn_zoo.elbo.ExpectedLikelihoodELBO]):

  .. math::

      \\mathcal{L}_{3,\\text{lit}}(\\phi) = E_{q(s)\\,p(\\beta | X, y, s)}
          \\big[\\log p(y | X, \\beta, s)\\big] - \\mathrm{KL}(q_\\phi(s) \\| p(s)).

* ``"alg1"``, **Algorithm 1** ([`Algorithm1ELBO`][bnn_zoo.elbo.Algorithm1ELBO]):
  ``beta_i ~ p(beta | X, y, s_i)`` with ``s_i ~ q(s)`` drawn once per outer iteration
  and held (no gradient) for ``inner_steps`` (Coker's ``n_grad``) optimiser steps on
  Coker's line 11, ``E_q(s)[log p(y | X, beta_i, s)] - KL(q(s) || p(s))``.
* ``"collapsed"`` ([`CollapsedELBO`][bnn_zoo.elbo.CollapsedELBO]): ``beta`` integrated out,
  ``E_q(s)[log N(y; 0, sigma_beta^2 Phi Phi^T + sigma^2 I)] - KL(q(s) || p(s))``,
  by the K x K Woodbury form.

Algorithm 2 (the predictive) is what [`bnn_zoo.predict`][] does with this
guide: ``s ~ q(s)``, ``beta ~ p(beta | X_train, y_train, s)``, ``f* = Phi(x*; s) beta``.

Deviation from the notes: Coker's Algorithms 1 and 3 estimate the likelihood
term as an average of *likelihoods*, ``1/n_est sum_k N(y; f_k(x), sigma^2 I)``,
and subtract the KL from it. An ELBO averages *log*-likelihoods,
``1/n_est sum_k log N(y; f_k(x), sigma^2 I)``; that is what every objective here does
(the notes' version is not a bound on anything, and underflows for any real N).

Why Algorithm 3 (``"alg3"``) and the collapsed objective agree: for every ``s`` and every
``beta``, ``log p(y | beta, s) + log p(beta) - log p(beta | y, s) = log p(y | s)``.
With ``q(beta | s)`` the exact conditional the Algorithm-3 integrand therefore does
not depend on the ``beta`` sample at all: per sample of ``s`` it equals the
collapsed integrand, value and pathwise gradient alike (tested). The finding depends
on three things: (1) the integrand has the terms ``log p(beta) - log q(beta | s)``, i.e.
the objective is the ELBO of the joint guide ``q(s) q(beta | s)``; (2) ``q(beta | s)`` is
the exact conditional given the same data, noise and prior as the likelihood (under a
minibatch the likelihood is a rescaled part of the data, so the equality holds in
expectation over batches only); (3) log-likelihoods are averaged, not likelihoods. The
collapsed form is just cheaper (no ``beta`` sample, no likelihood pass).

Why the default is not the literal Algorithm 3: without (1) the identity gives
``E_{beta | y, s}[log p(y | beta, s)] = log p(y | s) + KL(p(beta | X, y, s) || p(beta))``,
so ``L_3,lit = L_collapsed + E_q(s)[KL(p(beta | X, y, s) || p(beta))]`` (tested): the
literal objective is *not* the collapsed ELBO, not a lower bound on ``log p(y | X)``, and
its extra term rewards scales ``s`` (and a noise ``sigma``) under which ``beta``'s
conditional moves far from its prior, i.e. fits the training data more closely. It
counts the data twice, once in ``p(beta | X, y, s)`` and once in the likelihood. Where
the features can interpolate the data (as many features as points) this overfits badly:
``"alg3_literal"`` drives the learned noise towards zero and the test log-likelihood far
down, where ``"collapsed"`` keeps a sensible noise and switches the irrelevant inputs off
(tested); where the data are many and the features few, the two fit alike.
Algorithm 1, whose ``beta`` is not re-drawn with ``s``, optimises the literal objective's
likelihood term at a stale ``beta_i``: a different, noisier objective.
"""

from __future__ import annotations

import math

import pyro
import pyro.distributions as dist
import torch
from pyro.distributions import constraints
from pyro.nn import PyroModule, PyroParam
from torch import Tensor

from bnn_zoo._core.checks import check_data, check_positive
from bnn_zoo.models._rff import LogitNormal, RandomFeatureRegression

__all__ = ["LogitNormalGuide", "plot_relevance"]


class LogitNormalGuide(PyroModule):
    """``q(s) = prod_d LogitNormal(loc_d, scale_d^2)`` and ``q(beta | s) = p(beta | X, y, s)``.

    The full conditional needs the training data. The guide conditions on the
    data of its last call with targets: ``guide(x, y)`` (every training step)
    stores ``(x, y)``; ``guide(x_new)`` (prediction, ``y=None``) samples ``s``
    and ``beta`` given the stored training data, so ``bnn_zoo.predict`` runs
    Algorithm 2. The stored data are buffers, saved with ``state_dict``.

    Parameters
    ----------
    model : the [`RandomFeatureRegression`][bnn_zoo.models.RandomFeatureRegression] it belongs
    to
        (referenced, not registered: its parameters stay the model's).
    init_loc : initial ``loc`` of every ``z_d = logit(s_d)``; the default -2
        (``s_d = 0.12``) starts with smooth features and lets the relevant inputs
        grow. Started at the prior median ``s_d = 0.5``, ten standardised inputs
        give features so rough that they fit nothing and the gradient in ``s``
        is too weak to recover from there.
    init_scale : initial ``scale`` of every ``z_d``.
    """

    def __init__(self, model: RandomFeatureRegression, *, init_loc: float = -2.0,
                 init_scale: float = 0.1) -> None:
        if not isinstance(model, RandomFeatureRegression):
            raise TypeError(f"Expected model to be a RandomFeatureRegression, got {model!r}.")
        super().__init__()
        check_positive("init_scale", init_scale)
        if isinstance(init_loc, bool) or not isinstance(init_loc, (int, float)) \
                or not math.isfinite(init_loc):
            raise ValueError(f"Expected init_loc to be a finite number, but got {init_loc!r}.")
        self.__dict__["model"] = model  # not a submodule: see the class docstring
        self.loc = PyroParam(torch.full((model.in_dim,), float(init_loc)))
        self.scale = PyroParam(torch.full((model.in_dim,), float(init_scale)),
                               constraint=constraints.positive)
        self.register_buffer("x_train", None)
        self.register_buffer("y_train", None)

    def condition_on(self, x: Tensor, y: Tensor) -> None:
        """Use ``(x, y)`` as the training data of the full conditional."""
        x, y = check_data(x, y)
        self.model.check_input(x)
        if y.dim() != 1 or not y.is_floating_point():
            raise ValueError(f"Expected y to be a float vector (N,), got {y.dtype} of shape "
                             f"{tuple(y.shape)}.")
        self.x_train, self.y_train = x, y

    def scale_distribution(self) -> dist.Independent:
        """``q(s)``, event shape (D,)."""
        return LogitNormal(self.loc, self.scale).to_event(1)

    def sample_scales(self, x: Tensor, y: Tensor | None = None) -> Tensor:
        """The guide of ``s`` alone (Algorithm 1 holds ``beta`` fixed)."""
        return pyro.sample("s", self.scale_distribution())

    def forward(self, x: Tensor, y: Tensor | None = None) -> dict[str, Tensor]:
        if y is not None:
            self.condition_on(x, y)
        elif self.x_train is None:
            raise RuntimeError("LogitNormalGuide has no training data: call guide(x, y) (or "
                               "condition_on) before predicting.")
        s = self.sample_scales(x)
        posterior = self.model.conditional(self.x_train, self.y_train, s)
        return {"s": s, "beta": pyro.sample("beta", posterior.distribution())}

    @torch.no_grad()
    def relevance(self, mass: float = 0.9) -> tuple[Tensor, Tensor, Tensor]:
        """Learned input relevances: ``E_q[s_d]`` and the central ``mass`` interval, each (D,)."""
        if not 0.0 < mass < 1.0:
            raise ValueError(f"Expected 0 < mass < 1, but got {mass!r}.")
        q = LogitNormal(self.loc, self.scale)
        return q.mean, q.icdf((1 - mass) / 2), q.icdf((1 + mass) / 2)


def plot_relevance(guide: LogitNormalGuide, names: list[str] | None = None, *, mass: float = 0.9,
                   ax=None):
    """Bar chart of ``E_q[s_d]`` with the central ``mass`` interval; returns the Figure."""
    import matplotlib.pyplot as plt

    mean, lo, hi = (t.cpu().numpy() for t in guide.relevance(mass))
    names = names or [f"x{d + 1}" for d in range(len(mean))]
    if len(names) != len(mean):
        raise ValueError(f"Expected {len(mean)} names, but got {len(names)}.")
    if ax is None:
        _, ax = plt.subplots(figsize=(max(4.0, 0.5 * len(mean)), 3))
    ax.bar(names, mean, yerr=[mean - lo, hi - mean], capsize=3, color="tab:blue")
    ax.set_ylim(0, 1)
    ax.set_ylabel(f"E_q[s_d] ({round(mass * 100)}% interval)")
    ax.set_title("learned input relevance")
    return ax.figure
