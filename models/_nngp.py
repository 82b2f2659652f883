r"""Exact GP regression with the NNGP kernel: the infinite-width Bayesian network (Neal
1996, "Bayesian Learning for Neural Networks"; Lee et al. 2018, "Deep
Neural Networks as Gaussian Processes").

.. math:: y \sim N(0, K(X, X) + \sigma^2 I),

with :math:`K` the NNGP kernel of [`bnn_zoo.models._nngp_kernel`][]. The function values
are integrated out; the log density of ``y`` is the log evidence, whose gradient in the
hyperparameters is the closed form of Rasmussen & Williams (2006, eq. 5.9)
([`GaussianEvidence`][]), and the posterior predictive is the GP's in closed form.
"""

from __future__ import annotations

import math

import pyro
import pyro.distributions as dist
import torch
from pyro.nn import PyroModule
from torch import Tensor

from bnn_zoo._core.checks import check_positive, check_tensor
from bnn_zoo._core.predictive import GaussianMixturePredictive
from bnn_zoo.models._nngp_kernel import NNGPKernel
from bnn_zoo.models._noise import ObservationNoise

__all__ = ["JITTER_GROWTH", "JITTER_TRIES", "GaussianEvidence", "NNGPRegression",
           "NotPositiveDefinite"]

#: Cholesky attempts of [`NNGPRegression.factorise`][bnn_zoo.models.NNGPRegression.factorise],
# each with the relative jitter of the one before times ``JITTER_GROWTH``.
JITTER_TRIES = 5
JITTER_GROWTH = 10.0


class NotPositiveDefinite(ValueError):
    r""":math:`K + \sigma^2 I` could not be factorised, even with the largest jitter of
    [`NNGPRegression.factorise`][bnn_zoo.models.NNGPRegression.factorise] (or the kernel matrix
    is not finite)."""


class _GaussianLogDensity(torch.autograd.Function):
    r""":math:`\log N(y; 0, A)` from ``A``, its Cholesky factor ``L`` and ``y``, differentiated
    in ``A`` and ``y`` by the closed forms (Rasmussen & Williams 2006, eq. 5.9)

    .. math::

        \frac{\partial \log N}{\partial A} = \tfrac12 (\alpha \alpha^T - A^{-1}), \qquad
        \frac{\partial \log N}{\partial y} = -\alpha, \qquad \alpha = A^{-1} y,

    with :math:`A^{-1}` from ``L`` (``cholesky_inverse``, :math:`\tfrac23 N^3`). Autograd
    through the factorisation instead solves two N x N triangular systems (:math:`2 N^3`).
    ``L`` gets no gradient: it must be the factor of ``A``. First derivatives only."""

    @staticmethod
    def forward(ctx, covariance: Tensor, scale_tril: Tensor, y: Tensor) -> Tensor:
        alpha = torch.cholesky_solve(y.unsqueeze(-1), scale_tril)  # (..., N, 1), kept
        ctx.save_for_backward(scale_tril, alpha)
        half_log_det = scale_tril.diagonal(dim1=-2, dim2=-1).log().sum(-1)
        return (-0.5 * (y * alpha.squeeze(-1)).sum(-1) - half_log_det
                - 0.5 * y.shape[-1] * math.log(2 * math.pi))

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, None, Tensor | None]:
        scale_tril, alpha = ctx.saved_tensors
        grad = grad[..., None, None]
        grad_covariance = grad_y = None
        if ctx.needs_input_grad[0]:
            grad_covariance = 0.5 * grad * (alpha @ alpha.mT - torch.cholesky_inverse(scale_tril))
        if ctx.needs_input_grad[2]:
            grad_y = -(grad * alpha).squeeze(-1)
        return grad_covariance, None, grad_y


class GaussianEvidence(dist.MultivariateNormal):
    """``N(0, A)``, the marginal likelihood of a GP, given ``A`` and its Cholesky factor.

    A `MultivariateNormal` (it samples with the factor) whose
    ``log_prob`` is differentiated in ``A`` by `_GaussianLogDensity`: the
    gradient of type-II maximum likelihood at about a third of the cost of autograd
    through the Cholesky factorisation.
    """

    def __init__(self, covariance: Tensor, scale_tril: Tensor,
                 validate_args: bool | None = None) -> None:
        super().__init__(covariance.new_zeros(covariance.shape[:-1]), scale_tril=scale_tril,
                         validate_args=validate_args)
        self.covariance = covariance

    def expand(self, batch_shape, _instance=None) -> GaussianEvidence:
        new = self._get_checked_instance(GaussianEvidence, _instance)
        new = super().expand(batch_shape, _instance=new)
        new.covariance = self.covariance.expand(new.batch_shape + new.event_shape * 2)
        return new

    def log_prob(self, value: Tensor) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        shape = torch.broadcast_shapes(value.shape[:-1], self.batch_shape)
        matrix_shape = shape + self.event_shape * 2
        return _GaussianLogDensity.apply(self.covariance.expand(matrix_shape),
                                         self._unbroadcasted_scale_tril.expand(matrix_shape),
                                         value.expand(shape + self.event_shape))


class NNGPRegression(ObservationNoise, PyroModule):
    r"""Exact GP regression with the NNGP kernel: the infinite-width BNN.

    .. math:: y \sim N(0, K(X, X) + \sigma^2 I)

    The function values are integrated out, so ``model(x, y)`` has one sample site,
    ``"obs"``, whose log density is the log evidence :math:`\log p(y | X, \theta)`:
    SVI with an empty guide (what the zoo entry ``nngp`` runs) is type-II maximum
    likelihood of the kernel hyperparameters and the noise. Unlike the zoo's
    BNNs, ``"obs"`` is one multivariate normal over the N points (they are
    dependent), so there is no ``"data"`` plate and no minibatching.

    The Cholesky factorisation adds a jitter :math:`\epsilon \bar k` to the noise
    variance, :math:`\bar k` the mean prior variance: :math:`\epsilon` = ``jitter``
    first, then up to `JITTER_TRIES` - 1 times more, each ``JITTER_GROWTH``
    times larger, where the factorisation fails (duplicate inputs with a small
    noise, say). The largest :math:`\epsilon` used so far is `largest_jitter`;
    the jitter is part of the noise of the posterior predictive too, so the two agree.

    Parameters
    ----------
    in_dim : number of input features.
    activation, depth, num_features, **kernel_options : passed to [`NNGPKernel`][].
    noise_scale : fixed noise standard deviation :math:`\sigma`; ``None`` learns it,
        starting at ``init_noise_scale``.
    jitter : the first relative jitter :math:`\epsilon`.
    """

    def __init__(self, in_dim: int, *, activation: str = "relu", depth: int = 1,
                 noise_scale: float | None = None, init_noise_scale: float = 0.3,
                 jitter: float = 1e-6, num_features: int | None = None,
                 **kernel_options: float) -> None:
        super().__init__()
        self.kernel = NNGPKernel(in_dim, activation, depth=depth, num_features=num_features,
                                 **kernel_options)
        self.jitter = check_positive("jitter", jitter)
        self.largest_jitter = 0.0
        self.init_noise(noise_scale, init_noise_scale)

    def hyperparameters(self) -> dict[str, float | list[float]]:
        """The kernel variances and the noise scale, as floats, and with ``ard`` the inputs'
        relevances as a list (for messages and reports)."""
        names = ("weight_variance", "bias_variance", "output_variance", "output_bias_variance")
        with pyro.get_param_store().scope():  # this module's values, not the global store's
            values = {name: getattr(self.kernel, name).item() for name in names}
            if self.kernel.ard:
                values["input_relevance"] = self.kernel.input_relevance.tolist()
            return {**values, "noise_scale": self.observation_scale().item()}

    def factorise(self, x: Tensor) -> tuple[Tensor, Tensor]:
        r"""The Cholesky factor ``L`` of :math:`K(x, x) + s^2 I` and the noise variance
        :math:`s^2 = \sigma^2 + \epsilon \bar k` it was factorised with (class doc).

        Raises `NotPositiveDefinite`, naming the hyperparameters, where ``K`` is
        not finite or every jitter fails.
        """
        _, chol, noise_variance = self.covariance_factor(x)
        return chol, noise_variance

    def covariance_factor(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        r"""The covariance :math:`A = K(x, x) + s^2 I` of ``y``, its Cholesky factor and
        :math:`s^2` ([`factorise`][])."""
        k = self.kernel(x)
        mean_variance = k.diagonal().mean().detach()
        eye = torch.eye(x.shape[0], dtype=x.dtype, device=x.device)
        jitter = self.jitter
        for _ in range(JITTER_TRIES):
            noise_variance = self.observation_scale() ** 2 + jitter * mean_variance
            covariance = k + noise_variance * eye
            chol, info = torch.linalg.cholesky_ex(covariance)
            if int(info) == 0:
                self.largest_jitter = max(self.largest_jitter, jitter)
                return covariance, chol, noise_variance
            jitter *= JITTER_GROWTH
        # Checked only here, to name the cause: a non-finite K fails every factorisation
        # (LAPACK reports NaN pivots), so the training step needs no extra pass and sync.
        if not bool(torch.isfinite(k).all()):
            raise NotPositiveDefinite(f"The NNGP kernel matrix is not finite at the "
                                      f"hyperparameters {self.hyperparameters()}.")
        raise NotPositiveDefinite(
            f"K + sigma^2 I ({x.shape[0]} points) is not positive definite even with a "
            f"relative jitter of {jitter / JITTER_GROWTH:g} (tried {JITTER_TRIES}, from "
            f"{self.jitter:g}) at the hyperparameters {self.hyperparameters()}.")

    def forward(self, x: Tensor, y: Tensor | None = None) -> Tensor:
        check_tensor("x", x, ndim=2, floating=True)
        if y is not None:
            check_tensor("y", y, ndim=1, floating=True)
            if y.shape[0] != x.shape[0]:
                raise ValueError(f"Expected y of shape ({x.shape[0]},), got {tuple(y.shape)}.")
        covariance, scale_tril, _ = self.covariance_factor(x)
        return pyro.sample("obs", GaussianEvidence(covariance, scale_tril), obs=y)

    def log_evidence(self, x: Tensor, y: Tensor) -> Tensor:
        """:math:`\\log p(y | x, \\theta)` (the log density at ``"obs"``)."""
        trace = pyro.poutine.trace(self).get_trace(x, y)
        return trace.nodes["obs"]["fn"].log_prob(y)

    @torch.no_grad()
    def posterior(self, x_train: Tensor, y_train: Tensor, x: Tensor) -> GaussianMixturePredictive:
        r"""The GP posterior predictive at ``x`` (M, D) given the training data.

        .. math::

            \mu = K_{*}^T (K + s^2 I)^{-1} y, \qquad
            v^2 = \mathrm{diag}(K_{**}) - \mathrm{diag}(K_*^T (K + s^2 I)^{-1} K_*)
            + s^2

        with :math:`s^2` the noise variance of [`factorise`][] (:math:`\sigma^2` plus
        the jitter), returned as a one-component [`GaussianMixturePredictive`][]
        (``loc`` and ``scale`` of shape (1, M)), so the zoo's metrics apply unchanged.
        """
        check_tensor("x", x, ndim=2, floating=True)
        chol, noise_variance = self.factorise(x_train)
        cross = self.kernel(x_train, x)
        v = torch.linalg.solve_triangular(chol, cross, upper=False)
        alpha = torch.cholesky_solve(y_train.unsqueeze(-1), chol).squeeze(-1)
        mean = cross.T @ alpha
        var_f = (self.kernel(x, diag=True) - (v**2).sum(0)).clamp_min(0)
        scale = (var_f + noise_variance).sqrt()
        return GaussianMixturePredictive(mean.unsqueeze(0), scale.unsqueeze(0))
