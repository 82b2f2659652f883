"""IVON, the Improved Variational Online Newton optimiser (Shen et al. 2024, "Variational
Learning is Effective for Large Deep Networks", Algorithm 1), training a diagonal Gaussian
posterior ``q(w) = N(m, diag(sigma^2))``, ``sigma^2 = 1 / (lambda (h + delta))``.

Each step draws ``w = m + sigma eps`` (``eps ~ N(0, I)``), takes the gradient ``g`` of the
mean negative log-likelihood of a minibatch at ``w`` and the reparameterisation estimate
``h_hat = g eps / sigma`` of the diagonal of its Hessian (averaged over the step's draws),
and updates ([`ivon_step`][])

.. math::

    \\bar g &\\leftarrow \\beta_1 \\bar g + (1 - \\beta_1) g, \\\\
    h &\\leftarrow \\beta_2 h + (1 - \\beta_2) \\hat h
         + \\tfrac12 (1 - \\beta_2)^2 (h - \\hat h)^2 / (h + \\delta), \\\\
    m &\\leftarrow m - \\alpha (h_0 + \\delta)
         \\frac{\\bar g / (1 - \\beta_1^t) + \\delta m}{h + \\delta}.

``lambda`` is the effective sample size (the number of training points) and ``delta`` the
weight decay, which here is the model's Gaussian prior ``N(0, s^2)`` of each weight:
``delta = 1 / (lambda s^2)``, so that IVON's target is the posterior of the zoo's model. The
last term of the ``h`` update keeps it positive; ``alpha (h_0 + delta)`` is the learning rate
rescaled as ``ivon-opt``'s ``rescale_lr`` does.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyro
import torch
from pyro import poutine
from pyro.infer.autoguide.utils import deep_setattr
from pyro.nn import PyroParam
from torch import Tensor, nn
from tqdm.auto import tqdm

from bnn_zoo._core.checks import check_fraction, check_positive
from bnn_zoo._core.lr_schedule import lr_factor
from bnn_zoo._core.step import TrainingDiverged
from bnn_zoo._core.training import FitResult
from bnn_zoo.guides._bbb import deep_getattr
from bnn_zoo.guides._flat_sites import Sites, flatten_sites, unflatten_sites
from bnn_zoo.guides._mean_field import MeanFieldGuide, diagonal_gaussian_kl
from bnn_zoo.methods._base import Budget, Method, ModelFactory
from bnn_zoo.methods._svi import SVI, SVIPosterior
from bnn_zoo.models._priors import prior_of_site

__all__ = ["IVON", "IVONState", "ivon_step"]


@dataclass
class IVONState:
    """IVON's state over the flattened weights: the mean ``m``, the Hessian estimate ``h``,
    the gradient momentum ``g_bar`` and the number of steps taken."""

    loc: Tensor
    hess: Tensor
    momentum: Tensor
    steps: int = 0

    def scale(self, ess: float, weight_decay: Tensor) -> Tensor:
        """``sigma = 1 / sqrt(lambda (h + delta))``."""
        return (ess * (self.hess + weight_decay)).rsqrt()


def ivon_step(state: IVONState, grad: Tensor, hess_estimate: Tensor, *, lr: float,
              weight_decay: Tensor, hess_init: float, beta1: float, beta2: float,
              clip_radius: float | None = None) -> None:
    """One IVON update (module doc) of ``state`` in place from the gradient ``g`` and the
    Hessian estimate ``h_hat`` of the step's draws; the preconditioned step
    ``(g_bar / (1 - beta1^t) + delta m) / (h + delta)`` is clipped to ``clip_radius`` in
    every coordinate (``None``: not clipped)."""
    state.steps += 1
    state.momentum = beta1 * state.momentum + (1 - beta1) * grad
    h = state.hess
    state.hess = (beta2 * h + (1 - beta2) * hess_estimate
                  + 0.5 * (1 - beta2) ** 2 * (h - hess_estimate).square() / (h + weight_decay))
    debiased = state.momentum / (1 - beta1 ** state.steps)
    step = (debiased + weight_decay * state.loc) / (state.hess + weight_decay)
    if clip_radius is not None:
        step = step.clamp(-clip_radius, clip_radius)
    state.loc = state.loc - lr * (hess_init + weight_decay) * step


def _prior_precisions(model: nn.Module, like: Tensor) -> Tensor:
    """The flattened precision ``1 / s^2`` of every weight under the model's prior, which
    must be a zero-mean Gaussian (a ``ValueError`` otherwise)."""
    precisions = []
    for name, shape in model.sites:
        prior = prior_of_site(model.prior, name).distribution(shape, like)
        base = getattr(prior, "base_dist", prior)
        if not isinstance(base, torch.distributions.Normal) or bool((base.loc != 0).any()):
            raise ValueError(f"IVON takes a zero-mean Gaussian prior as its weight decay; "
                             f"the prior of site {name!r} is {prior}.")
        precisions.append(base.scale.expand(shape).reshape(-1) ** -2)
    return torch.cat(precisions)


class _Likelihood:
    """The mean negative log-likelihood of a minibatch at given weights, and its gradient
    with respect to the weights and to the model's own parameters (a learned noise scale)."""

    def __init__(self, model: nn.Module, sites: Sites) -> None:
        self.model = model
        self.sites = sites

    def __call__(self, weights: Tensor, x: Tensor, y: Tensor,
                 weight: float = 1.0) -> tuple[Tensor, Tensor]:
        """The loss at ``weights`` (flat) and its gradient; ``weight`` times the gradient is
        added to the model's own parameters' ``.grad``."""
        weights = weights.detach().requires_grad_()
        values = unflatten_sites(self.sites, weights)
        trace = poutine.trace(poutine.condition(self.model, data=values)).get_trace(x, y)
        loss = -trace.log_prob_sum(lambda _, site: site["is_observed"]) / x.shape[0]
        (weight * loss).backward()
        return loss.detach(), weights.grad / weight


@dataclass(frozen=True)
class IVON(Method):
    """A diagonal Gaussian posterior trained by IVON (module doc; Shen et al. 2024).

    The budget's ``steps``, ``batch_size``, ``lr`` (IVON's ``alpha``), ``lr_schedule`` and
    ``num_particles`` (draws per step) are IVON's; ``ess`` is ``lambda`` (``None``: the
    number of training points), ``hess_init`` ``h_0``, ``beta1`` and ``beta2`` the
    averaging of the gradient and the Hessian. A learned noise scale (the model's own
    parameter) is a point estimate trained by Adam at ``noise_lr`` on the same gradients.
    The posterior is a [`MeanFieldGuide`][bnn_zoo.guides.MeanFieldGuide] holding ``m`` and
    ``sigma``: a Pyro guide of the model like any other. Needs a model with ``.sites``
    (the zoo's MLP, a [`BayesianModule`][bnn_zoo.models.BayesianModule]) and a zero-mean
    Gaussian prior; fits from tensors, on one process, without the JIT.
    """

    ess: float | None = None
    hess_init: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.999
    noise_lr: float = 1e-2
    clip_radius: float | None = None

    def __post_init__(self) -> None:
        if self.ess is not None:
            check_positive("ess", self.ess)
        check_positive("hess_init", self.hess_init)
        check_fraction("beta1", self.beta1)
        check_fraction("beta2", self.beta2)
        check_positive("noise_lr", self.noise_lr)
        check_positive("clip_radius", self.clip_radius, allow_none=True)

    def with_guide_options(self, options: Mapping[str, Any]) -> IVON:
        raise ValueError("IVON builds its own guide (a MeanFieldGuide) and takes no guide "
                         f"options, got {dict(options)!r}.")

    def fit(self, build_model: ModelFactory, x: Tensor, y: Tensor, *, task: str, seed: int,
            budget: Budget, progress: bool | None) -> SVIPosterior:
        budget.check_supported("IVON", distributed=False, jit=False, kl_weighting="uniform")
        model = build_model()
        if not hasattr(model, "sites") or not hasattr(model, "prior"):
            raise ValueError("IVON needs a model with .sites and .prior (the zoo's MLP or a "
                             f"BayesianModule), got {type(model).__name__}.")
        pyro.set_rng_seed(seed)
        guide = MeanFieldGuide(model).to(device=x.device, dtype=x.dtype)
        ess = float(x.shape[0]) if self.ess is None else float(self.ess)
        decay = _prior_precisions(model, x) / ess
        start = {name: deep_getattr(guide.loc, name).detach() for name in guide.site_shapes}
        state = IVONState(flatten_sites(model.sites, start),
                          torch.full_like(decay, self.hess_init), torch.zeros_like(decay))
        losses, started = self._train(model, state, decay, ess, x, y, seed, budget, progress)
        _set_guide(guide, state.loc, state.scale(ess, decay))
        result = FitResult(losses, time.perf_counter() - started, budget.steps)
        return SVIPosterior(model, guide, result, {"ess": ess})

    def _train(self, model: nn.Module, state: IVONState, decay: Tensor, ess: float,
               x: Tensor, y: Tensor, seed: int, budget: Budget,
               progress: bool | None) -> tuple[list[float], float]:
        """Run the budget's IVON steps from ``state``; the noise scale follows by Adam.
        Returns the negative-ELBO estimate of every step and the start time."""
        likelihood = _Likelihood(model, model.sites)
        generator = torch.Generator(x.device).manual_seed(seed)
        batch = x.shape[0] if budget.batch_size is None else min(budget.batch_size, x.shape[0])
        noise = [p for p in model.parameters() if p.requires_grad]
        adam = torch.optim.Adam(noise, lr=self.noise_lr) if noise else None
        losses, started = [], time.perf_counter()
        for t in tqdm(range(budget.steps), desc="IVON", disable=progress is False, leave=False):
            index = torch.randperm(x.shape[0], generator=generator, device=x.device)[:batch]
            scale = state.scale(ess, decay)
            grad, hess, nll = torch.zeros_like(decay), torch.zeros_like(decay), 0.0
            for _ in range(budget.num_particles):
                eps = torch.randn(decay.shape, generator=generator, dtype=x.dtype,
                                  device=x.device)
                loss, g = likelihood(state.loc + scale * eps, x[index], y[index],
                                     1 / budget.num_particles)
                grad, hess, nll = grad + g, hess + g * eps / scale, nll + float(loss)
            nll = nll / budget.num_particles
            kl = diagonal_gaussian_kl(state.loc, scale, 0.0, (ess * decay).rsqrt())
            if not (math.isfinite(nll) and bool(torch.isfinite(grad).all())):
                raise TrainingDiverged(f"IVON diverged at step {t}: the loss became {nll}.")
            ivon_step(state, grad / budget.num_particles, hess / budget.num_particles,
                      lr=budget.lr * lr_factor(budget.lr_schedule, t, budget.steps),
                      weight_decay=decay, hess_init=self.hess_init, beta1=self.beta1,
                      beta2=self.beta2, clip_radius=self.clip_radius)
            if not bool(torch.isfinite(state.loc).all() & torch.isfinite(state.hess).all()):
                raise TrainingDiverged(f"IVON diverged at step {t}: its mean or Hessian is no "
                                       "longer finite (expected a smaller lr).")
            if adam is not None:
                adam.step()
                adam.zero_grad()
            losses.append(ess * nll + float(kl))
        return losses, started

    def restore(self, build_model: ModelFactory, state: dict, *, x: Tensor,
                y: Tensor) -> SVIPosterior:
        """The posterior of `SVIPosterior.state_dict`: the model and its mean-field guide."""
        return SVI(MeanFieldGuide).restore(build_model, state, x=x, y=y)


def _set_guide(guide: MeanFieldGuide, loc: Tensor, scale: Tensor) -> None:
    """Hold IVON's ``m`` and ``sigma`` in ``guide``'s ``loc`` and ``rho``
    (``sigma = softplus(rho)``)."""
    sites = list(guide.site_shapes.items())
    rho = scale + torch.log(-torch.expm1(-scale))
    for name, m in unflatten_sites(sites, loc.detach()).items():
        deep_setattr(guide.loc, name, PyroParam(m.clone()))
    for name, r in unflatten_sites(sites, rho.detach()).items():
        deep_setattr(guide.rho, name, PyroParam(r.clone()))
