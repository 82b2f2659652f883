"""Bayes by Backprop (Blundell et al. 2015; Thakur's notes on it).

The variational posterior is a diagonal Gaussian over every weight tensor,
parameterised as in the paper's section 3.2::

    sigma = softplus(rho) = log(1 + exp(rho)),   w = mu + sigma * eps,   eps ~ N(0, I)

so one sample site per weight tensor, reparameterised. With a Gaussian prior,
train with ``TraceMeanField_ELBO`` (the KL term in closed form); with the
scale-mixture prior, ``Trace_ELBO`` (a Monte Carlo KL, as in the paper).

Initialisation differs from Thakur's notes on purpose: they draw ``rho`` near 0,
i.e. a posterior scale of ``softplus(0) = 0.69``, which drowns the signal of a
freshly initialised net in weight noise. We start narrow (``init_scale=1e-2``:
``rho = log(expm1(0.01)) = -4.6``) with means from
[`fan_in_init`][bnn_zoo.models._mlp.fan_in_init] (weights ``N(0, 1/d_in)``, biases ``U(-1, 1)``)
so the initial network is a reasonable deterministic net, and let the KL widen it.
"""

from __future__ import annotations

import functools
import math

import pyro
import pyro.distributions as dist
import torch
from pyro.infer.autoguide.utils import deep_setattr
from pyro.nn import PyroModule, PyroParam
from torch import Tensor, nn

from bnn_zoo._core.checks import check_positive
from bnn_zoo._core.nn import tensor_options
from bnn_zoo._core.replicas import replica_plate
from bnn_zoo.models._mlp import fan_in_init

__all__ = ["BayesByBackpropGuide", "deep_getattr", "softplus_inverse"]


def softplus_inverse(sigma: float) -> float:
    """``rho`` such that ``softplus(rho) = sigma``."""
    return math.log(math.expm1(sigma))


def deep_getattr(obj: object, name: str) -> object:
    """``obj.a.b.c`` for ``name = "a.b.c"`` (the inverse of Pyro's ``deep_setattr``)."""
    return functools.reduce(getattr, name.split("."), obj)


class BayesByBackpropGuide(PyroModule):
    """Diagonal Gaussian guide ``q(w) = N(mu, softplus(rho)^2)`` for a model with ``.sites``.

    Parameters
    ----------
    model : a model exposing ``sites``, the ``(name, shape)`` of its weight tensors
        (e.g. [`bnn_zoo.models.BayesianMLP`][]), and optionally ``initial_weights()``,
        the initial means by site name ([`bnn_zoo.models.BayesianModule`][] offers its
        net's own values); otherwise the means start at ``fan_in_init``.
    init_scale : initial posterior standard deviation of every weight.
    generator : optional CPU ``torch.Generator`` for the ``fan_in_init`` means.

    The parameters are created on the device and in the dtype of the model's own
    tensors (its noise scale), so ``BayesByBackpropGuide(model.to("cuda"))`` lives on
    the GPU from the start.

    For a model of R replicas (its ``replicas`` attribute, e.g.
    ``BayesianMLP.replicated(R)``; `bnn_zoo._core.replicas`) every parameter gets the
    leading shape (R, 1), one independent Gaussian per replica (means drawn independently
    per replica), sampled in the replica plate.
    """

    def __init__(self, model: nn.Module, *, init_scale: float = 1e-2,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        check_positive("init_scale", init_scale)
        self.site_shapes = dict(model.sites)
        self.replicas: int | None = getattr(model, "replicas", None)
        copies = 1 if self.replicas is None else self.replicas
        lead = () if self.replicas is None else (self.replicas, 1)
        rho = softplus_inverse(init_scale)
        options = tensor_options(model)
        # PyroParams in PyroModule containers, named by site as in Pyro's AutoNormal
        # (``loc.layers.0.weight``), so Pyro's SVI and optimisers see them in either
        # ``module_local_params`` mode.
        self.loc = PyroModule()
        self.rho = PyroModule()
        # A model whose weights have a layout of their own (a wrapped torch module) offers
        # its initial values; the zoo's MLP layout (d_in, d_out) takes fan_in_init.
        offered = model.initial_weights() if hasattr(model, "initial_weights") else {}
        for name, shape in self.site_shapes.items():
            # Drawn on the CPU (where ``generator`` lives), so the initial means are the
            # same on every device, then moved to the model's device and dtype.
            starts = [offered[name] if name in offered else fan_in_init(shape, generator=generator)
                      for _ in range(copies)]
            start = torch.stack(starts).reshape(*lead, *shape)
            deep_setattr(self.loc, name, PyroParam(start.to(**options)))
            deep_setattr(self.rho, name, PyroParam(torch.full((*lead, *shape), rho, **options)))

    def distributions(self) -> dict[str, dist.Normal]:
        """The variational Gaussian of every site, keyed by site name (no event dims)."""
        return {name: dist.Normal(deep_getattr(self.loc, name),
                                  nn.functional.softplus(deep_getattr(self.rho, name)))
                for name in self.site_shapes}

    def forward(self, x: Tensor, y: Tensor | None = None) -> dict[str, Tensor]:
        with replica_plate(self.replicas, x.device):
            return {name: pyro.sample(name, q.to_event(len(self.site_shapes[name])))
                    for name, q in self.distributions().items()}
