"""Pyro models of a Laplace posterior's predictive: linearised (GLM) or the network itself
(Bishop 2006, PRML 5.7.1; Immer, Korzepa & Bauer 2021, "Improving predictions of
Bayesian neural nets via local linearization", on the GLM view).

Both have the sample sites of the [`BayesianMLP`][bnn_zoo.models.BayesianMLP] (or
[`BayesianModule`][bnn_zoo.models.BayesianModule]) they approximate
(one per weight tensor, prior ``N(m_i, alpha_i^-1)`` with the posterior's prior mean and
per-layer or per-weight ``alpha``), record the network output as
``pyro.deterministic("f")`` and put the likelihood ``obs`` in ``pyro.plate("data")``,
with the posterior's noise ``beta^-1/2`` (regression; one per output for D outputs), the
network's own ``sigma(x)`` (heteroscedastic regression, from the second output, linearised
with the first by [`LinearizedModel`][]) or a categorical on the logits ``f``.
Paired with a [`LaplaceGuide`][bnn_zoo.methods.laplace.LaplaceGuide] holding the posterior,
Pyro's ``Predictive(model, guide=guide)`` and [`bnn_zoo.predict`][] sample

* [`LinearizedModel`][]: the GLM predictive. Its network is the first-order
  expansion (PRML 5.7.1) ``f_lin(x, w) = f(x, w_MAP) + J(x) (w - w_MAP)``, so with
  ``w ~ N(w_MAP, A^-1)`` the output is exactly ``N(f(x, w_MAP), J A^-1 J^T)`` in
  distribution: regression gives ``N(f, 1/beta + g^T A^-1 g)`` (PRML 5.173), the closed
  form of [`glm_predictive`][bnn_zoo.methods.laplace.LaplacePosterior.glm_predictive];
  classification gives the Monte Carlo average of ``softmax`` over the Gaussian logits,
  which the probit approximation of the closed form approximates.
* [`NonlinearModel`][]: the weight-sampling ("mc") predictive, the network itself.
"""

from __future__ import annotations

import warnings

import pyro
import pyro.distributions as dist
import torch
from pyro.nn import PyroModule
from torch import Tensor

from bnn_zoo.methods.laplace._posterior import LaplacePosterior
from bnn_zoo.models._mlp import drop_plate_dim

__all__ = ["LinearizedModel", "NonlinearModel"]


class _PosteriorModel(PyroModule):
    """The shared model; subclasses define `network` for weights ``theta`` (*S, P)."""

    def __init__(self, posterior: LaplacePosterior) -> None:
        super().__init__()
        self.posterior = posterior

    def network(self, x: Tensor, theta: Tensor) -> Tensor:
        raise NotImplementedError

    def forward(self, x: Tensor, y: Tensor | None = None) -> Tensor:
        post = self.posterior
        layout = post.layout
        x = layout.check_input(x)
        means = layout.unflatten(post.prior_mean.to(x.dtype))
        scales = layout.unflatten(post.alpha_vector().rsqrt().to(x.dtype))
        values = {}
        for name, shape in layout.sites:
            prior = dist.Normal(means[name], scales[name]).to_event(len(shape))
            values[name] = drop_plate_dim(pyro.sample(name, prior), len(shape))
        theta = layout.flatten(values)
        return post.likelihood.observe(x, y, lambda inputs: self.network(inputs, theta),
                                       post.beta)


class LinearizedModel(_PosteriorModel):
    """The GLM predictive of ``posterior`` as a Pyro model (see the module doc)."""

    def network(self, x: Tensor, theta: Tensor) -> Tensor:
        """``f(x, w_MAP) + J(x) (theta - w_MAP)`` (*S, N, K) for ``theta`` (*S, P).

        One Jacobian-vector product per weight sample (``torch.func.jvp``), vectorised
        over the samples by ``torch.func.vmap``; ``J`` itself is never formed.
        """
        post = self.posterior

        def output(t: Tensor) -> Tensor:
            return post.layout.output(t, x)

        def tangent(delta: Tensor) -> Tensor:
            return torch.func.jvp(output, (post.theta,), (delta,))[1]

        batch = theta.shape[:-1]
        delta = (theta - post.theta).reshape(-1, theta.shape[-1])
        with warnings.catch_warnings():
            # torch's forward mode scripts its decompositions with the deprecated
            # torch.jit.script on first use; the warning is torch's, not ours to act on.
            warnings.filterwarnings("ignore", message=r".*torch\.jit\.script.*deprecated",
                                    category=DeprecationWarning)
            change = torch.func.vmap(tangent)(delta)
        return output(post.theta) + change.reshape(*batch, *change.shape[1:])


class NonlinearModel(_PosteriorModel):
    """The weight-sampling predictive of ``posterior``: the network at the sampled weights,
    with the posterior's noise."""

    def network(self, x: Tensor, theta: Tensor) -> Tensor:
        """``f(x, theta)`` (*S, N, K) for ``theta`` (*S, P)."""
        return self.posterior.layout.output(theta, x)
