"""Guide parameters as ``PyroParam`` s, so that Pyro's ``SVI`` with ``pyro.optim`` trains
them in either ``module_local_params`` mode.

In pyro 1.9.2 a plain ``nn.Parameter`` of a ``PyroModule`` (or of an ``nn.Module`` inside
one) reaches ``SVI.step`` under ``module_local_params=True`` as a param site whose value
lacks the ``unconstrained`` handle that ``SVI.step`` asks every param site for, so the
step fails (``'Parameter' object has no attribute 'unconstrained'``); a ``PyroParam``
works in both modes. Pyro's own ``AutoLowRankMultivariateNormal`` and
``AutoMultivariateNormal`` and its flows hold such ``nn.Parameter`` s.
"""

from __future__ import annotations

from typing import TypeVar

import pyro
import pyro.distributions as dist
from pyro.infer.autoguide import AutoLowRankMultivariateNormal, AutoMultivariateNormal
from pyro.nn import PyroParam
from pyro.nn.module import to_pyro_module_
from torch import Tensor, nn

__all__ = ["LowRankMultivariateNormal", "MultivariateNormal", "to_pyro_params_"]

ModuleT = TypeVar("ModuleT", bound=nn.Module)


def to_pyro_params_(module: ModuleT) -> ModuleT:
    """Make every ``nn.Parameter`` of ``module`` and its submodules an unconstrained
    ``PyroParam`` with the same initial value, in place, and the modules holding them (and
    their ancestors) ``PyroModule`` s; return ``module``.

    Submodules without parameters stay as they are: they may be shared (a default
    ``nonlinearity=nn.ReLU()`` argument is one instance for every network built with it).
    """
    to_pyro_module_(module, recurse=False)
    for name, child in list(module.named_children()):
        if any(True for _ in child.parameters()):
            setattr(module, name, to_pyro_params_(child))
    for name, value in list(module.named_parameters(recurse=False)):
        if not name.endswith("_unconstrained"):  # not already a PyroParam
            delattr(module, name)
            setattr(module, name, PyroParam(value.detach()))
    return module


class LowRankMultivariateNormal(AutoLowRankMultivariateNormal):
    """Pyro's ``AutoLowRankMultivariateNormal``, its ``loc`` and ``cov_factor`` made
    ``PyroParam`` s (see the module docstring); the same distribution and initialisation."""

    def _setup_prototype(self, *args, **kwargs) -> None:
        super()._setup_prototype(*args, **kwargs)
        to_pyro_params_(self)


class MultivariateNormal(AutoMultivariateNormal):
    """Pyro's ``AutoMultivariateNormal``, a full-covariance Gaussian ``N(mu, L L^T)`` over
    all latent weights at once, its ``loc`` made a ``PyroParam`` (see the module
    docstring); the same distribution and initialisation. Exact for a linear-Gaussian
    model, such as Bayesian linear regression.

    One change to how it samples: the latent draw ``w = mu + L z`` comes from a
    ``TransformedDistribution`` whose affine transform caches ``z``, so the guide's log
    density of its own draw is ``log N(z; 0, I) - sum_i log L_ii`` exactly. Pyro's guide
    recovers ``z`` by a triangular solve instead, which in float32 turns huge once ``L``
    grows ill-conditioned: SVI then drives the ELBO estimate to ``+1e20`` through the
    round-off (seen on ``two_moons`` at lr 0.03 within 150 steps).
    """

    def _setup_prototype(self, *args, **kwargs) -> None:
        super()._setup_prototype(*args, **kwargs)
        to_pyro_params_(self)

    def sample_latent(self, *args, **kwargs) -> Tensor:
        scale_tril = self.scale[..., None] * self.scale_tril
        affine = dist.transforms.LowerCholeskyAffine(self.loc, scale_tril=scale_tril)
        posterior = dist.TransformedDistribution(self.get_base_dist(), affine.with_cache(1))
        return pyro.sample(f"_{self._pyro_name}_latent", posterior, infer={"is_auxiliary": True})
