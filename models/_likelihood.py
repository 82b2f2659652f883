"""The data plate and the likelihood shared by the zoo's network models.

Every network model ends the same way: the inputs go into ``pyro.plate("data", N)``
(subsampled when [`subsample_data`][bnn_zoo.handlers.subsample_data] sets its indices, so the
likelihood is rescaled by ``N / B``), the network output is recorded as
``pyro.deterministic("f")`` and the targets are observed at ``"obs"``:

* regression: ``y_n ~ N(f(x_n), sigma^2)``; with D > 1 outputs, targets ``y_n`` (D,) and
  ``y_nd ~ N(f_d(x_n), sigma_d^2)`` independently, one noise scale per output (one event of
  D numbers per data point);
* heteroscedastic regression: the network has two outputs, a mean ``f(x_n)`` (recorded as
  ``f``) and a raw scale ``s(x_n)``, and ``y_n ~ N(f(x_n), sigma(x_n)^2)`` with
  ``sigma(x) = softplus(s(x)) + MIN_SCALE`` (recorded as ``"noise_scale"``; the Gaussian
  output of Lakshminarayanan et al. 2017, Sec. 2.2, with their variance floor on the scale);
* classification: ``y_n ~ Categorical(softmax(f(x_n)))``.

The Laplace approximation (`bnn_zoo.methods.laplace._curvature`,
[`bnn_zoo.methods.laplace`][]) reads each of these as a `Likelihood` object,
`Gaussian`, `GaussianOutputs`, `Heteroscedastic` or
`Categorical`: its unit-precision negative log-likelihood ``E`` of the outputs,
the Hessian of ``E`` in the outputs (through a square root, for the GGN), the GLM
predictive, the evidence's data terms and the noise precision's update, so that the
curvature and evidence code holds one object and never a name. `laplace_likelihood`
turns a saved name into its object.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Protocol

import pyro
import pyro.distributions as dist
import torch
import torch.nn.functional as F
from torch import Tensor

from bnn_zoo._core.batches import Batches, num_points, num_targets
from bnn_zoo._core.checks import check_choice
from bnn_zoo._core.linalg import cholesky_with_jitter, symmetric_eigh
from bnn_zoo._core.predictive import CategoricalPredictive, GaussianMixturePredictive

__all__ = ["LIKELIHOODS", "MIN_SCALE", "Categorical", "Gaussian", "GaussianOutputs",
           "GaussianPrecision", "Heteroscedastic", "Likelihood", "NoiseStatistics",
           "heteroscedastic_scale", "laplace_likelihood", "observe"]


#: The floor of a heteroscedastic noise scale, in the units of the (standardised) targets.
MIN_SCALE = 1e-3


class NoiseStatistics(Protocol):
    """What a noise update reads of a Laplace posterior
    ([`LaplacePosterior`][bnn_zoo.methods.laplace.LaplacePosterior]): the noise
    precision ``beta``, the number of observed outputs, the data energy ``E_D`` and the
    effective parameters per output."""

    beta: Tensor
    num_outputs: int
    energy: Tensor

    def output_effective_parameters(self) -> Tensor: ...


def heteroscedastic_scale(raw: Tensor) -> Tensor:
    """``sigma = softplus(raw) + MIN_SCALE``: the noise scale of a heteroscedastic output."""
    return F.softplus(raw) + MIN_SCALE


def observe(x: Tensor, y: Tensor | None, network: Callable[[Tensor], Tensor], *,
            regression: bool, noise_scale: Callable[[], Tensor] | None = None,
            heteroscedastic: bool = False, data_dim: int = 0) -> Tensor:
    """Run ``network`` on (the minibatch of) ``x`` inside the data plate and observe ``y``.

    ``network(x)`` returns the outputs (*S, N, K); ``noise_scale()`` gives ``sigma`` for
    regression (a number, or (D,) for D outputs, when ``y`` is (N, D)); with
    ``heteroscedastic=True`` instead, ``network`` returns (*S, N, 2), the
    mean and the raw scale of each point (see `heteroscedastic_scale`).
    Returns the outputs ``f`` (the mean only, (*S, N, 1), when heteroscedastic).
    ``data_dim`` is the dimension of ``x`` and ``y`` that runs over the data points: 1 for
    replicas, ``x`` of shape (R, N, D) and ``y``
    (R, N) (see [`bnn_zoo._core.replicas`][]).
    """
    with pyro.plate("data", x.shape[data_dim], device=x.device) as idx:
        if idx.shape[0] != x.shape[data_dim]:
            x = x.index_select(data_dim, idx)
            y = None if y is None else y.index_select(data_dim, idx)
        out = network(x)
        if regression and heteroscedastic:
            f = pyro.deterministic("f", out[..., :1])
            scale = pyro.deterministic("noise_scale", heteroscedastic_scale(out[..., 1]))
            pyro.sample("obs", dist.Normal(f.squeeze(-1), scale), obs=y)
            return f
        f = pyro.deterministic("f", out)
        if regression and f.shape[-1] > 1:
            pyro.sample("obs", dist.Normal(f, noise_scale().to(f.dtype)).to_event(1), obs=y)
        elif regression:
            pyro.sample("obs", dist.Normal(f.squeeze(-1), noise_scale().to(f.dtype)), obs=y)
        else:
            pyro.sample("obs", dist.Categorical(logits=f), obs=y)
    return f


class Likelihood:
    """The likelihood of a network's outputs ``f`` (N, K) as the Laplace approximation reads
    it (Bishop 2006, PRML 5.7): the unit-precision negative log-likelihood ``E(f)``, its
    gradient and its Hessian ``Lambda_n`` in each ``f_n``, the evidence's data terms, the
    noise precision ``beta``'s update and the GLM predictive.

    This base is a likelihood whose noise is fixed (``beta = 1``: a classifier's, or the
    network's own); `Gaussian` tunes ``beta``.
    """

    #: The name a saved posterior keeps (`LIKELIHOODS`).
    name: ClassVar[str]
    #: Whether ``beta`` is a hyperparameter, tuned with ``alpha`` by the evidence.
    tunes_noise: ClassVar[bool] = False
    #: Whether the curvature is held per output (``beta`` (D,), one per output).
    per_output: ClassVar[bool] = False

    def negative_log_likelihood(self, f: Tensor, y: Tensor) -> Tensor:
        """``E``, summed over the points."""
        raise NotImplementedError

    def output_gradient(self, f: Tensor, y: Tensor) -> Tensor:
        """``dE/df`` (N, K)."""
        raise NotImplementedError

    def hessian_root(self, f: Tensor) -> Tensor:
        """(N, K, K) factors ``R_n`` with ``R_n^T R_n = Lambda_n``, the Hessian of ``E`` in
        ``f_n`` (the GGN is ``sum_n J_n^T Lambda_n J_n``)."""
        raise NotImplementedError

    def glm_predictive(self, f: Tensor, cov: Tensor, beta: Tensor, link: str,
                       num_samples: int, generator: torch.Generator | None
                       ) -> GaussianMixturePredictive | CategoricalPredictive:
        """The GLM predictive from the outputs ``f`` (N, K) at the MAP and their covariances
        ``J_n A^-1 J_n^T`` (N, K, K)."""
        raise NotImplementedError

    def energy(self, f: Tensor, y: Tensor) -> Tensor:
        """``E_D`` at the MAP as the evidence reads it."""
        return self.negative_log_likelihood(f, y)

    def num_observed(self, x: Tensor | Batches, y: Tensor | None) -> int:
        """The number of observed numbers ``N K`` the evidence counts: the points."""
        return num_points(x)

    def noise_shape(self) -> tuple[int, ...]:
        """The shape of ``beta``."""
        return ()

    def model_noise_precision(self, model) -> Tensor | float:
        """``beta`` of ``model``'s own noise."""
        return 1.0

    def add_data_terms(self, log_evidence: Tensor, energy: Tensor, beta: Tensor,
                       num_observed: int) -> Tensor:
        """``log_evidence`` (the prior's and ``log |A|``'s terms) with the likelihood's:
        ``- E_D``."""
        return log_evidence - energy

    def noise_update(self, post: NoiseStatistics, gamma: Tensor) -> Tensor:
        """MacKay's fixed-point ``beta`` (PRML 5.180) given the effective parameters
        ``gamma``: the fixed noise itself."""
        return post.beta

    def fold_noise(self, beta: Tensor) -> tuple[Likelihood, Tensor]:
        """This likelihood and the factor ``beta`` of ``beta E``, with any noise precision
        that ``E`` itself can carry folded in."""
        return self, beta

    def observe(self, x: Tensor, y: Tensor | None, network: Callable[[Tensor], Tensor],
                beta: Tensor) -> Tensor:
        """`observe` of this likelihood with noise precision ``beta``."""
        raise NotImplementedError


def _glm_variance(cov: Tensor) -> Tensor:
    """(N, K) the GLM variances ``g_k^T A^-1 g_k``: the diagonals of ``cov`` (N, K, K)."""
    return cov.diagonal(dim1=-2, dim2=-1)


class Gaussian(Likelihood):
    """``y_n ~ N(f(x_n), beta^-1)``: ``E = 1/2 sum_n (f_n - y_n)^2`` (PRML's sum-of-squares
    error without its ``beta``), ``Lambda_n = I``; ``beta`` tuned by the evidence."""

    name = "gaussian"
    tunes_noise = True

    def negative_log_likelihood(self, f: Tensor, y: Tensor) -> Tensor:
        # mse_loss: one kernel each way, where (f - y)^2 takes three
        f = f if y.dim() == f.dim() else f.squeeze(-1)
        return 0.5 * F.mse_loss(f, y, reduction="sum")

    def output_gradient(self, f: Tensor, y: Tensor) -> Tensor:
        return f - (y if y.dim() == f.dim() else y.unsqueeze(-1))

    def hessian_root(self, f: Tensor) -> Tensor:
        eye = torch.eye(f.shape[-1], dtype=f.dtype, device=f.device)
        return eye.expand(f.shape[0], -1, -1)

    def glm_predictive(self, f, cov, beta, link, num_samples, generator):
        """``N(f(x), 1/beta + g^T A^-1 g)`` (PRML 5.173; ``link`` unused)."""
        return GaussianMixturePredictive(f.T, (_glm_variance(cov) + 1 / beta).sqrt().T)

    def num_observed(self, x: Tensor | Batches, y: Tensor | None) -> int:
        """The targets: ``N``, or ``N D`` for D outputs."""
        return num_targets(x, y)

    def model_noise_precision(self, model) -> Tensor:
        return model.observation_scale().detach() ** -2

    def add_data_terms(self, log_evidence, energy, beta, num_observed):
        """``- sum_d beta_d E_d + N/2 sum_d log beta_d - N D/2 log(2 pi)`` (PRML 5.175),
        ``N = num_observed / D`` points per output."""
        n = num_observed
        return log_evidence - (beta * energy).sum() \
            + 0.5 * (n / beta.numel()) * torch.log(beta).sum() - 0.5 * n * math.log(2 * math.pi)

    def noise_update(self, post: NoiseStatistics, gamma: Tensor) -> Tensor:
        """``beta = (N - gamma) / (2 E_D)``."""
        return (post.num_outputs - gamma.sum()) / (2 * post.energy)

    def observe(self, x, y, network, beta):
        return observe(x, y, network, regression=True, noise_scale=beta.rsqrt)


@dataclass(frozen=True, eq=False)
class GaussianOutputs(Gaussian):
    """A Gaussian on ``outputs`` (D) outputs with a noise precision per output, ``beta``
    (D,): ``E_d = 1/2 sum_n (f_nd - y_nd)^2`` per output, the curvature held per output
    (`output_blocks`)."""

    outputs: int
    per_output = True

    def energy(self, f: Tensor, y: Tensor) -> Tensor:
        """(D,) ``E_d`` of each output."""
        return 0.5 * ((f - y) ** 2).sum(0)

    def noise_shape(self) -> tuple[int, ...]:
        return (self.outputs,)

    def glm_predictive(self, f, cov, beta, link, num_samples, generator):
        """Per output ``N(f_d(x), 1/beta_d + g_d^T A^-1 g_d)``, (1, N, D)."""
        return GaussianMixturePredictive(f[None], (_glm_variance(cov) + 1 / beta).sqrt()[None])

    def noise_update(self, post: NoiseStatistics, gamma: Tensor) -> Tensor:
        """``beta_d = (N - gamma_d) / (2 E_d)``, ``gamma_d = beta_d tr(A^-1 H_d)``."""
        points = post.num_outputs // post.beta.numel()
        return (points - post.output_effective_parameters()) / (2 * post.energy)

    def fold_noise(self, beta: Tensor) -> tuple[Likelihood, Tensor]:
        """`GaussianPrecision` of ``beta`` and the factor 1."""
        return GaussianPrecision(beta), beta.new_ones(())


@dataclass(frozen=True, eq=False)
class GaussianPrecision(Gaussian):
    """The Gaussian likelihood of targets (N, D) with the noise precisions ``precision``
    (D,) folded into the energy, ``E = 1/2 sum_{n,d} beta_d (f_nd - y_nd)^2``, so
    ``Lambda_n = diag(beta)``: with ``beta = e_d`` (one output's indicator) the GGN is
    output ``d``'s own curvature ``H_d``."""

    precision: Tensor

    def negative_log_likelihood(self, f: Tensor, y: Tensor) -> Tensor:
        return 0.5 * ((f - y) ** 2 * self.precision).sum()

    def output_gradient(self, f: Tensor, y: Tensor) -> Tensor:
        return (f - y) * self.precision

    def hessian_root(self, f: Tensor) -> Tensor:
        return torch.diag_embed(self.precision.sqrt()).expand(f.shape[0], -1, -1)


class Heteroscedastic(Likelihood):
    """``y_n ~ N(mu_n, sigma_n^2)`` from the outputs ``f_n = (mu_n, s_n)`` with ``sigma =
    softplus(s) + MIN_SCALE`` (`heteroscedastic_scale`): ``E = sum_n (y_n - mu_n)^2 /
    (2 sigma_n^2) + log sigma_n`` (the model's negative log-likelihood less ``N/2 log 2
    pi``; the noise is the network's, ``beta = 1``). ``Lambda_n`` is the Fisher information
    of ``N(mu, sigma^2)`` in ``(mu, s)``, ``diag(1 / sigma^2, 2 sigma'(s)^2 / sigma^2)``
    with ``sigma'(s) = sigmoid(s)``: the expected Hessian, positive definite where the
    Hessian need not be (Immer et al. 2023, "Effective Bayesian Heteroscedastic Regression
    with Deep Neural Networks", take it in the natural parameters; the two Fishers give the
    same GGN through the chain rule)."""

    name = "heteroscedastic"

    @staticmethod
    def _parts(f: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Mean ``mu``, scale ``sigma`` and ``dsigma/ds = sigmoid(s)`` (each (N,))."""
        return f[..., 0], heteroscedastic_scale(f[..., 1]), torch.sigmoid(f[..., 1])

    def negative_log_likelihood(self, f: Tensor, y: Tensor) -> Tensor:
        mu, sigma, _ = self._parts(f)
        return ((y - mu) ** 2 / (2 * sigma**2) + torch.log(sigma)).sum()

    def output_gradient(self, f: Tensor, y: Tensor) -> Tensor:
        """``((mu - y) / sigma^2, (1 - r^2) sigma' / sigma)``, ``r = (y - mu) / sigma``."""
        mu, sigma, slope = self._parts(f)
        r = (y - mu) / sigma
        return torch.stack([-r / sigma, (1 - r**2) * slope / sigma], -1)

    def hessian_root(self, f: Tensor) -> Tensor:
        """``diag(1 / sigma, sqrt(2) sigma' / sigma)``."""
        _, sigma, slope = self._parts(f)
        return torch.diag_embed(torch.stack([1 / sigma, math.sqrt(2) * slope / sigma], -1))

    def glm_predictive(self, f, cov, beta, link, num_samples, generator):
        """``N(mu(x), sigma(x)^2 + g_mu^T A^-1 g_mu)``: the mean head linearised, the scale
        head at the MAP (Kendall & Gal 2017, "What Uncertainties Do We Need in Bayesian
        Deep Learning for Computer Vision?", eq. 9)."""
        noise = heteroscedastic_scale(f[:, 1]) ** 2
        return GaussianMixturePredictive(f[None, :, 0],
                                         (_glm_variance(cov)[:, 0] + noise).sqrt()[None])

    def add_data_terms(self, log_evidence, energy, beta, num_observed):
        """``- E_D - N/2 log(2 pi)``."""
        return log_evidence - energy - 0.5 * num_observed * math.log(2 * math.pi)

    def observe(self, x, y, network, beta):
        return observe(x, y, network, regression=True, noise_scale=beta.rsqrt,
                       heteroscedastic=True)


class Categorical(Likelihood):
    """``y_n ~ Categorical(softmax(f_n))``: ``E = -sum_n log softmax(f_n)[y_n]``,
    ``Lambda_n = diag(p_n) - p_n p_n^T``."""

    name = "categorical"

    def negative_log_likelihood(self, f: Tensor, y: Tensor) -> Tensor:
        return F.cross_entropy(f, y.long(), reduction="sum")

    def output_gradient(self, f: Tensor, y: Tensor) -> Tensor:
        """``softmax(f) - onehot(y)``."""
        return torch.softmax(f, -1).scatter_add_(
            -1, y.long().unsqueeze(-1), f.new_full((f.shape[0], 1), -1.0))

    def hessian_root(self, f: Tensor) -> Tensor:
        """``R_n = diag(sqrt(p_n)) (I - 1 p_n^T)``, since ``diag(p) - p p^T = sum_k p_k
        (e_k - p)(e_k - p)^T``."""
        eye = torch.eye(f.shape[-1], dtype=f.dtype, device=f.device)
        p = torch.softmax(f, -1)
        return p.sqrt().unsqueeze(-1) * (eye - p.unsqueeze(-2))

    def glm_predictive(self, f, cov, beta, link, num_samples, generator):
        """``E[softmax(l)]`` over the logits ``l ~ N(f, J A^-1 J^T)``: the probit
        approximation ``softmax(f / sqrt(1 + pi/8 g_k^T A^-1 g_k))`` (``link="probit"``;
        PRML 4.153 per class, MacKay 1992) or ``num_samples`` draws of the logits
        (``link="mc"``, from ``generator``)."""
        if link == "probit":
            probs = torch.softmax(f * (1 + math.pi / 8 * _glm_variance(cov)).rsqrt(), -1)
        else:
            chol, _ = cholesky_with_jitter(cov.double())
            if chol is None:  # rank-deficient J A^-1 J^T: its symmetric square root
                evals, evecs, _ = symmetric_eigh(cov.double(), "the logits' covariance")
                chol = evecs * evals.clamp_min(0).sqrt().unsqueeze(-2)
            eps = torch.randn(num_samples, *f.shape, generator=generator,
                              dtype=torch.float64, device=f.device)
            logits = f.double() + (chol @ eps.unsqueeze(-1)).squeeze(-1)
            probs = torch.softmax(logits, -1).mean(0).to(f.dtype)
        return CategoricalPredictive(probs.unsqueeze(0))

    def observe(self, x, y, network, beta):
        return observe(x, y, network, regression=False)


def laplace_likelihood(name: str, noise_shape: tuple[int, ...] = ()) -> Likelihood:
    """The likelihood ``name`` (one of `LIKELIHOODS`) with a noise precision of
    ``noise_shape``: a Gaussian with ``beta`` (D,) is `GaussianOutputs`."""
    cls = LIKELIHOODS[check_choice("likelihood", name, tuple(LIKELIHOODS))]
    return GaussianOutputs(noise_shape[0]) if noise_shape else cls()


#: The likelihoods by name, as a Laplace posterior saves them.
LIKELIHOODS = {cls.name: cls for cls in (Gaussian, Categorical, Heteroscedastic)}
