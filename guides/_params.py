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
import torch
from pyro.distributions import constraints
from pyro.infer.autoguide import AutoLowRankMultivariateNormal, AutoMultivariateNormal
from pyro.nn import PyroModule, PyroParam
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


class _ScaledUnitLowerAffine(dist.transforms.Transform):
    """``w = loc + scale * (L_0 z)`` for a unit lower-triangular ``L_0``: the affine map of
    [`MultivariateNormal`][], whose factor is ``L = diag(scale) L_0``, without forming
    ``L`` (one matrix pass fewer each way than ``LowerCholeskyAffine(loc, L)``), and with
    ``log |det dw/dz| = sum_i log scale_i`` (the diagonal of ``L_0`` is ones)."""

    domain = constraints.real_vector
    codomain = constraints.real_vector
    bijective = True

    def __init__(self, loc: Tensor, scale: Tensor, unit_tril: Tensor, cache_size: int = 0):
        super().__init__(cache_size=cache_size)
        self.loc, self.scale, self.unit_tril = loc, scale, unit_tril

    def _call(self, z: Tensor) -> Tensor:
        return self.loc + self.scale * (self.unit_tril @ z.unsqueeze(-1)).squeeze(-1)

    def _inverse(self, w: Tensor) -> Tensor:
        u = ((w - self.loc) / self.scale).unsqueeze(-1)
        return torch.linalg.solve_triangular(self.unit_tril, u, upper=False,
                                             unitriangular=True).squeeze(-1)

    def log_abs_det_jacobian(self, z: Tensor, w: Tensor) -> Tensor:
        return self.scale.log().sum(-1).expand(w.shape[:-1])


class MultivariateNormal(AutoMultivariateNormal):
    """Pyro's ``AutoMultivariateNormal``, a full-covariance Gaussian ``N(mu, L L^T)`` over
    all latent weights at once, its ``loc`` made a ``PyroParam`` (see the module
    docstring); the same distribution and initialisation. Exact for a linear-Gaussian
    model, such as Bayesian linear regression.

    Two changes to how it samples, neither to what:

    * the latent draw ``w = mu + scale * (L_0 z)`` (``L = diag(scale) L_0``) comes from a
      ``TransformedDistribution`` whose affine transform caches ``z``, so the guide's log
      density of its own draw is ``log N(z; 0, I) - sum_i log scale_i`` exactly. Pyro's
      guide recovers ``z`` by a triangular solve instead, which in float32 turns huge once
      ``L`` grows ill-conditioned: SVI can then drive the ELBO estimate to absurd values
      through the round-off;
    * the ``P x P`` factor costs as few passes over memory as it can, which is the step's
      whole cost for large ``P``: ``L`` is never formed, and the unit lower-triangular
      constraint is one ``torch.where`` ([`scale_tril`][]).
    """

    #: The factor is stored unconstrained; [`scale_tril`][] applies the constraint.
    scale_tril_constraint = constraints.independent(constraints.real, 2)

    def _setup_prototype(self, *args, **kwargs) -> None:
        super()._setup_prototype(*args, **kwargs)
        to_pyro_params_(self)
        # Constants of the constraint: they move with the guide, are not saved, not trained.
        identity = torch.eye(self.latent_dim, dtype=self.loc.dtype, device=self.loc.device)
        self.register_buffer("_identity", identity, persistent=False)
        self.register_buffer("_strict_lower", torch.ones_like(identity, dtype=torch.bool)
                             .tril_(-1), persistent=False)

    @property
    def scale_tril(self) -> Tensor:
        """The unit lower-triangular factor ``L_0`` of ``L = diag(scale) L_0``: the stored
        matrix below the diagonal, ones on it, zeros above (Pyro's ``unit_lower_cholesky``
        constraint, applied by one ``torch.where`` against cached masks, where Pyro's
        transform, ``x.tril(-1) + eye``, builds the identity and runs ``tril``, slow on
        large matrices, at each step)."""
        raw = PyroModule.__getattr__(self, "scale_tril")
        return torch.where(self._strict_lower, raw, self._identity)

    def sample_latent(self, *args, **kwargs) -> Tensor:
        affine = _ScaledUnitLowerAffine(self.loc, self.scale, self.scale_tril, cache_size=1)
        posterior = dist.TransformedDistribution(self.get_base_dist(), affine)
        return pyro.sample(f"_{self._pyro_name}_latent", posterior, infer={"is_auxiliary": True})
