"""The Laplace guide: a point mass at the MAP, then the Gaussian ``N(w_MAP, A^-1)`` (Bishop
2006, PRML 5.7)."""

from __future__ import annotations

import math

import pyro
import pyro.distributions as dist
import torch
from pyro.nn import PyroModule, PyroParam
from torch import Tensor, nn

from bnn_zoo._core.checks import check_positive
from bnn_zoo._core.replicas import replica_plate
from bnn_zoo.methods.laplace._layouts import layout_of
from bnn_zoo.methods.laplace._posterior import LaplacePosterior

__all__ = ["LaplaceGuide"]


class LaplaceGuide(PyroModule):
    """A Pyro guide for a [`BayesianMLP`][bnn_zoo.models.BayesianMLP] or
    [`BayesianModule`][bnn_zoo.models.BayesianModule]: a point mass (MAP) at its
    locations until [`set_posterior`][], then the Gaussian ``N(w_MAP, A^-1)`` of a
    [`LaplacePosterior`][bnn_zoo.methods.laplace.LaplacePosterior].

    The locations are ``PyroParam``s named after the model's sample sites (dots replaced
    by underscores; ``_loc`` appended to a name without a dot, a bare module's
    ``weight``), so the point mass trains with [`bnn_zoo.fit`][] or with Pyro's own
    ``SVI`` and a ``pyro.optim`` optimiser, with or without ``module_local_params``. With a
    posterior, the guide samples all weights jointly from an auxiliary standard normal
    site ``_laplace_eps`` transformed by the posterior's structure.

    Initial means: the model's ``initial_weights()`` where it offers them (a torch
    module's own initialisation, or pretrained weights; ``generator`` and ``bias_scale``
    then unused); otherwise weight matrices ``N(0, 1/d_in)`` and biases
    ``N(0, bias_scale^2)``.
    Random biases spread the kinks of a ReLU net over the inputs (with zero biases every
    kink starts at ``x = 0``), as the core's ``fan_in_init`` does with ``U(-1, 1)``; here
    their spread is a parameter, ``bias_scale``.

    For a model of R replicas (its ``replicas`` attribute, e.g.
    ``BayesianMLP.replicated(R)``; `bnn_zoo._core.replicas`) every location gets the
    leading shape (R, 1), one point mass per replica (drawn independently per replica),
    sampled in the replica plate: the MAPs of R fits train in one pass. Such a guide
    takes no posterior (each replica's is fitted from its own single-fit guide).
    """

    def __init__(self, model: nn.Module, *, bias_scale: float = 1.0,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        check_positive("bias_scale", bias_scale)
        self.layout = layout_of(model)
        # A PyroParam named as a sample site clashes with it in the trace: the site of a bare
        # module's ``weight`` gets its location under ``weight_loc``.
        self.keys = {name: name.replace(".", "_") if "." in name else f"{name}_loc"
                     for name, _ in self.layout.sites}
        # A model whose weights have a layout of their own (a wrapped torch module) offers
        # its initial values; the MLP's (d_in, d_out) weights are drawn.
        offered = model.initial_weights() if hasattr(model, "initial_weights") else {}
        self.replicas: int | None = getattr(model, "replicas", None)
        lead = () if self.replicas is None else (self.replicas, 1)
        for name, shape in self.layout.sites:
            if name in offered:
                start = offered[name].detach().cpu().expand(*lead, *shape).clone()
            else:
                scale = 1 / math.sqrt(shape[0]) if len(shape) == 2 else bias_scale
                start = torch.randn(*lead, *shape, generator=generator) * scale
            setattr(self, self.keys[name], PyroParam(start))
        self.posterior: LaplacePosterior | None = None

    def locations(self) -> dict[str, Tensor]:
        """The current means, one tensor per sample site."""
        return {name: getattr(self, key) for name, key in self.keys.items()}

    def theta(self) -> Tensor:
        """(P,) the current means as one flat vector ((R, 1, P) for R replicas)."""
        return self.layout.flatten(self.locations())

    def set_posterior(self, posterior: LaplacePosterior) -> None:
        """Sample ``posterior`` from now on; its MAP becomes the guide's locations."""
        if self.replicas is not None:
            raise ValueError(f"Expected a single-fit guide for a posterior, but this one holds "
                             f"{self.replicas} replicas; split them first "
                             "(bnn_zoo._core.replicas.split_replicas).")
        if posterior.layout != self.layout:
            raise ValueError("Expected a posterior of the guide's network "
                             f"{self.layout.description}, but got one of "
                             f"{posterior.layout.description}.")
        values = self.layout.unflatten(posterior.theta)
        with torch.no_grad():
            for name, key in self.keys.items():
                # The locations are unconstrained (real), so this is the parameter itself.
                getattr(self, f"{key}_unconstrained").copy_(values[name])
        self.posterior = posterior

    def forward(self, x: Tensor, y: Tensor | None = None) -> dict[str, Tensor]:
        if self.posterior is None:
            # The point mass: the locations themselves, without the flat vector's round trip
            # (a concatenation and its slices, forward and backward, on every MAP step).
            values = self.locations()
        else:
            theta = self.theta()
            eps = pyro.sample("_laplace_eps",
                              dist.Normal(torch.zeros_like(theta), 1.0).to_event(1),
                              infer={"is_auxiliary": True})
            values = self.layout.unflatten(theta + self.posterior.offset(eps))
        with replica_plate(self.replicas, x.device):
            return {name: pyro.sample(name, dist.Delta(values[name], event_dim=len(shape)))
                    for name, shape in self.layout.sites}
