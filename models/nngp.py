r"""The infinite-width limit of a Bayesian network with one or more hidden layers (seed 001,
second half).

Neal (1996), as in the seed: the network

.. math::

    f(x) = c + \sum_{m=1}^H v_m \, \phi(g_m(x)), \qquad
    g_m(x) = b_m + \sum_{h=1}^D w_{mh} x_h,

with independent priors :math:`w_{mh} \sim N(0, \sigma_w^2 / D)`,
:math:`b_m \sim N(0, \sigma_b^2)`, :math:`v_m \sim N(0, \sigma_v^2 / H)` and
:math:`c \sim N(0, \sigma_c^2)` is a sum of ``H`` i.i.d. terms, so by the central
limit theorem it converges, as :math:`H \to \infty`, to a Gaussian process with
the NNGP kernel

.. math::

    K(x, x') = \sigma_c^2 + \sigma_v^2 \, E[\phi(u) \phi(u')], \qquad
    (u, u') \sim N\left(0, \begin{pmatrix} \Sigma(x, x) & \Sigma(x, x') \\
    \Sigma(x, x') & \Sigma(x', x') \end{pmatrix}\right), \qquad
    \Sigma(x, x') = \sigma_b^2 + \sigma_w^2 \, x \cdot x' / D .

The covariance of :math:`f` equals :math:`K` at every width ``H``; only the
higher cumulants (e.g. the excess kurtosis, which falls as ``1/H``) vanish in
the limit. With :class:`~bnn_zoo.models.GaussianPrior` ``(scale=1, fan_in=True)``
the zoo's :class:`~bnn_zoo.models.BayesianMLP` with one hidden layer has exactly
this prior with every variance equal to 1.

Closed forms of :math:`E[\phi(u)\phi(u')]` (with :math:`k_{11}, k_{12}, k_{22}`
the entries of the covariance above):

* ``relu`` (arc-cosine kernel of order 1, Cho & Saul 2009):
  :math:`\frac{\sqrt{k_{11}k_{22}}}{2\pi}(\sin\theta + (\pi - \theta)\cos\theta)`,
  :math:`\cos\theta = k_{12}/\sqrt{k_{11}k_{22}}`;
* ``erf`` (Williams 1997):
  :math:`\frac{2}{\pi}\arcsin\frac{2k_{12}}{\sqrt{(1 + 2k_{11})(1 + 2k_{22})}}`;
* ``identity``: :math:`k_{12}` (Bayesian linear regression).

Any other activation of :data:`bnn_zoo.core.nn.ACTIVATIONS` uses a Monte Carlo
kernel: the covariance of a random-feature network of ``num_features`` units per
hidden layer drawn once from the prior with a fixed seed (positive semi-definite by
construction, and differentiable in the hyperparameters). For ``depth > 1`` its
error is that of one finite net of width ``num_features``: a fluctuation of order
:math:`1/\sqrt{S}` and a bias of order :math:`1/S`.

The kernel variances are bounded to :data:`VARIANCE_BOUNDS`: outside them, on
standardised data, the fit has diverged, and the bounds keep :math:`K` finite and its
diagonal (hence the relative jitter of :class:`NNGPRegression`) positive.

**Deeper networks** (``depth`` = ``L`` hidden layers, each with the same
:math:`\sigma_w^2, \sigma_b^2`, hidden-to-hidden weights of variance
:math:`\sigma_w^2 / H`): taking the widths to infinity one layer after the other
(the seed notes that the limit extends to deeper networks; Lee et al. 2018, "Deep neural
networks as Gaussian processes"; Matthews et al. 2018 for all widths at once), the
pre-activations of every layer are Gaussian processes, with covariances given by the
recursion

.. math::

    \Sigma^{(1)}(x, x') = \sigma_b^2 + \sigma_w^2 \, x \cdot x' / D, \qquad
    \Sigma^{(l+1)}(x, x') = \sigma_b^2 + \sigma_w^2 \, E_{(u, u') \sim N(0, \Sigma^{(l)})}
    [\phi(u)\phi(u')], \quad l = 1, \dots, L - 1,

    K(x, x') = \sigma_c^2 + \sigma_v^2 \, E_{(u, u') \sim N(0, \Sigma^{(L)})}[\phi(u)\phi(u')],

each expectation over the bivariate Gaussian with the covariance of the layer before
at :math:`(x, x)`, :math:`(x, x')`, :math:`(x', x')` (the closed forms above apply at
every layer: for ReLU this is the iterated arc-cosine kernel of Cho & Saul 2009,
section 2.3, for erf Williams 1997 iterated). ``depth = 1`` is the kernel above.
Unlike the one-layer case, the covariance of a finite deep net differs from the
limit by :math:`O(1/H)`.

The seed's :math:`\sigma_H^2` is the variance of each output weight; it must
scale as :math:`1/H` for the limit :math:`N(0, H \sigma_H^2 c^2)` to exist, which
the seed leaves implicit: here :math:`\sigma_H^2 = \sigma_v^2 / H`. The seed
also assumes :math:`E[h_m(x)] = 0`, which fails for ReLU; it is not needed,
because :math:`E[v_m] = 0` already centres each term.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pyro
import pyro.contrib.gp as gp
import pyro.distributions as dist
import torch
from pyro.distributions import constraints
from pyro.nn import PyroModule, PyroParam
from torch import Tensor

from bnn_zoo.core.checks import check_choice, check_positive, check_positive_int, check_tensor
from bnn_zoo.core.nn import ACTIVATIONS, activation
from bnn_zoo.core.predictive import GaussianMixturePredictive
from bnn_zoo.models.noise import ObservationNoise

__all__ = ["CLOSED_FORMS", "JITTER_GROWTH", "JITTER_TRIES", "GaussianEvidence", "NNGPKernel",
           "NNGPRegression", "NotPositiveDefinite", "VARIANCE_BOUNDS", "expected_product"]

#: Open interval of every kernel variance (see the module doc).
VARIANCE_BOUNDS = (1e-8, 1e8)
#: Cholesky attempts of :meth:`NNGPRegression.cholesky`, each with the relative jitter
#: of the one before times ``JITTER_GROWTH``.
JITTER_TRIES = 5
JITTER_GROWTH = 10.0


def _relu_product(k11: Tensor, k12: Tensor, k22: Tensor) -> Tensor:
    norm = (k11 * k22).sqrt()
    # Clamp strictly inside [-1, 1]: arccos and sqrt(1 - c^2) have infinite slopes at
    # c = 1 (the diagonal) that cancel analytically but give NaN gradients numerically.
    eps = 100 * torch.finfo(norm.dtype).eps
    cos = (k12 / norm).clamp(-1 + eps, 1 - eps)
    theta = torch.arccos(cos)
    return norm / (2 * math.pi) * (torch.sin(theta) + (math.pi - theta) * cos)


def _erf_product(k11: Tensor, k12: Tensor, k22: Tensor) -> Tensor:
    return 2 / math.pi * torch.arcsin(2 * k12 / ((1 + 2 * k11) * (1 + 2 * k22)).sqrt())


def _identity_product(k11: Tensor, k12: Tensor, k22: Tensor) -> Tensor:
    return k12


CLOSED_FORMS: dict[str, Callable[[Tensor, Tensor, Tensor], Tensor]] = {
    "relu": _relu_product,
    "erf": _erf_product,
    "identity": _identity_product,
}


def expected_product(name: str, k11: Tensor, k12: Tensor, k22: Tensor) -> Tensor:
    r""":math:`E[\phi(u)\phi(u')]` for the bivariate Gaussian with covariance
    ``[[k11, k12], [k12, k22]]`` (broadcast elementwise), in closed form for the
    activations of :data:`CLOSED_FORMS`."""
    return CLOSED_FORMS[check_choice("activation", name, sorted(CLOSED_FORMS))](k11, k12, k22)


class NNGPKernel(gp.kernels.Kernel):
    r"""The NNGP kernel :math:`K(x, x')` of a network with ``depth`` hidden layers (see the
    module: the one-layer kernel and the layer recursion).

    A :class:`pyro.contrib.gp.kernels.Kernel`, so it also plugs into Pyro's GP
    models. Its hyperparameters are ``PyroParam`` s in :data:`VARIANCE_BOUNDS`; like
    any Pyro ``Parameterized`` they can be given priors with ``PyroSample``.

    Parameters
    ----------
    input_dim : number of input features ``D``.
    activation : a name of :data:`bnn_zoo.core.nn.ACTIVATIONS`; closed form for
        ``relu``, ``erf`` and ``identity``, Monte Carlo otherwise.
    depth : number of hidden layers ``L`` (default 1, Neal's network).
    weight_variance, bias_variance : :math:`\sigma_w^2` (input weights have
        variance :math:`\sigma_w^2 / D`, hidden-to-hidden weights
        :math:`\sigma_w^2 / H`) and :math:`\sigma_b^2` of every hidden layer.
    output_variance, output_bias_variance : :math:`\sigma_v^2` (output weights have
        variance :math:`\sigma_v^2 / H`) and :math:`\sigma_c^2`.
    num_features : use a Monte Carlo kernel with this many random hidden units per
        layer even for a closed-form activation (default: 4096 where there is no
        closed form).
    seed : seed of the Monte Carlo features (fixed, so the kernel is a deterministic
        function of its hyperparameters).

    ``forward(X, Z=None, diag=False)`` returns the (N, M) covariance matrix, or its
    (N,) diagonal.
    """

    def __init__(self, input_dim: int, activation: str = "relu", *, depth: int = 1,
                 weight_variance: float = 1.0, bias_variance: float = 1.0,
                 output_variance: float = 1.0, output_bias_variance: float = 1.0,
                 num_features: int | None = None, seed: int = 0,
                 active_dims: list[int] | None = None) -> None:
        check_positive_int("input_dim", input_dim)
        super().__init__(input_dim, active_dims)
        self.all_dims = active_dims is None
        self.activation = check_choice("activation", activation, sorted(ACTIVATIONS))
        self.depth = check_positive_int("depth", depth)
        if num_features is None and activation not in CLOSED_FORMS:
            num_features = 4096
        self.num_features = check_positive_int("num_features", num_features, allow_none=True)
        self.seed = seed
        low, high = VARIANCE_BOUNDS
        for name, value in [("weight_variance", weight_variance),
                            ("bias_variance", bias_variance),
                            ("output_variance", output_variance),
                            ("output_bias_variance", output_bias_variance)]:
            if not low < check_positive(name, value) < high:
                raise ValueError(f"Expected {low:g} < {name} < {high:g}, but got {value!r}.")
            # Created in float64: the sigmoid of the interval transform loses ~1e-6 of the
            # value when its unconstrained parameter is rounded to float32.
            setattr(self, name, PyroParam(torch.tensor(float(value), dtype=torch.float64),
                                          constraint=constraints.interval(low, high)))

    @property
    def closed_form(self) -> bool:
        """Whether the kernel is exact (``False``: Monte Carlo random features)."""
        return self.num_features is None

    def preactivation_covariance(self, X: Tensor, Z: Tensor) -> Tensor:
        r"""First layer :math:`\Sigma^{(1)}(x, z) = \sigma_b^2 + \sigma_w^2 x \cdot z / D`,
        shape (N, M)."""
        return self.bias_variance + self.weight_variance * (X @ Z.T) / self.input_dim

    def preactivation_variance(self, X: Tensor) -> Tensor:
        r"""(N,) :math:`\Sigma^{(1)}(x, x)`."""
        return self.bias_variance + self.weight_variance * (X**2).sum(-1) / self.input_dim

    def _next_layer(self, product: Tensor) -> Tensor:
        r""":math:`\Sigma^{(l+1)} = \sigma_b^2 + \sigma_w^2 E[\phi(u)\phi(u')]`."""
        return self.bias_variance + self.weight_variance * product

    def _last_products(self, kxx: Tensor, kxz: Tensor, kzz: Tensor) -> Tensor:
        r""":math:`E[\phi(u)\phi(u')]` under the last hidden layer's :math:`\Sigma^{(L)}`,
        from the first layer's variances ``kxx``, ``kzz`` and covariances ``kxz``
        (broadcast against each other), by the closed-form recursion."""
        for _ in range(self.depth - 1):
            kxz = self._next_layer(expected_product(self.activation, kxx, kxz, kzz))
            kxx = self._next_layer(expected_product(self.activation, kxx, kxx, kxx))
            kzz = self._next_layer(expected_product(self.activation, kzz, kzz, kzz))
        return expected_product(self.activation, kxx, kxz, kzz)

    def features(self, X: Tensor) -> Tensor:
        r"""(N, S) units :math:`\phi(g^{(L)}_s(x)) / \sqrt{S}` of the last hidden layer of the
        Monte Carlo kernel's random network (``S = num_features`` units per layer)."""
        gen = torch.Generator(device=X.device).manual_seed(self.seed)
        phi = activation(self.activation)
        units, fan_in = X, self.input_dim
        for _ in range(self.depth):
            shape = (fan_in + 1, self.num_features)
            noise = torch.randn(shape, generator=gen, dtype=X.dtype, device=X.device)
            g = (self.weight_variance / fan_in).sqrt() * (units @ noise[:-1])
            units, fan_in = phi(g + self.bias_variance.sqrt() * noise[-1]), self.num_features
        return units / math.sqrt(self.num_features)

    def forward(self, X: Tensor, Z: Tensor | None = None, diag: bool = False) -> Tensor:
        X = self._checked_input("X", X)
        if diag:
            if self.closed_form:
                k = self.preactivation_variance(X)
                product = self._last_products(k, k, k)
            else:
                product = (self.features(X) ** 2).sum(-1)
            return self.output_bias_variance + self.output_variance * product
        Z = X if Z is None else self._checked_input("Z", Z)
        if self.closed_form:
            product = self._last_products(self.preactivation_variance(X).unsqueeze(-1),
                                          self.preactivation_covariance(X, Z),
                                          self.preactivation_variance(Z).unsqueeze(-2))
        else:
            product = self.features(X) @ self.features(Z).T
        return self.output_bias_variance + self.output_variance * product

    def _checked_input(self, name: str, X: object) -> Tensor:
        X = check_tensor(name, X, ndim=(1, 2), floating=True)
        columns = X.shape[1] if X.dim() == 2 else 1
        needed = self.input_dim if self.all_dims else max(self.active_dims) + 1
        if columns < needed or (self.all_dims and columns != needed):
            raise ValueError(f"Expected {name} with {needed} columns, but got {columns}.")
        return self._slice_input(X)


class NotPositiveDefinite(ValueError):
    r""":math:`K + \sigma^2 I` could not be factorised, even with the largest jitter of
    :meth:`NNGPRegression.factorise` (or the kernel matrix is not finite)."""


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

    A :class:`~pyro.distributions.MultivariateNormal` (it samples with the factor) whose
    ``log_prob`` is differentiated in ``A`` by :class:`_GaussianLogDensity`: the
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
    first, then up to :data:`JITTER_TRIES` - 1 times more, each ``JITTER_GROWTH``
    times larger, where the factorisation fails (duplicate inputs with a small
    noise, say). The largest :math:`\epsilon` used so far is :attr:`largest_jitter`;
    the jitter is part of the noise of the posterior predictive too, so the two agree.

    Parameters
    ----------
    in_dim : number of input features.
    activation, depth, num_features, **kernel_options : passed to :class:`NNGPKernel`.
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

    def hyperparameters(self) -> dict[str, float]:
        """The kernel variances and the noise scale, as floats (for messages and reports)."""
        names = ("weight_variance", "bias_variance", "output_variance", "output_bias_variance")
        with pyro.get_param_store().scope():  # this module's values, not the global store's
            values = {name: getattr(self.kernel, name).item() for name in names}
            return {**values, "noise_scale": self.observation_scale().item()}

    def factorise(self, x: Tensor) -> tuple[Tensor, Tensor]:
        r"""The Cholesky factor ``L`` of :math:`K(x, x) + s^2 I` and the noise variance
        :math:`s^2 = \sigma^2 + \epsilon \bar k` it was factorised with (class doc).

        Raises :class:`NotPositiveDefinite`, naming the hyperparameters, where ``K`` is
        not finite or every jitter fails.
        """
        _, chol, noise_variance = self.covariance_factor(x)
        return chol, noise_variance

    def covariance_factor(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        r"""The covariance :math:`A = K(x, x) + s^2 I` of ``y``, its Cholesky factor and
        :math:`s^2` (:meth:`factorise`)."""
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

        with :math:`s^2` the noise variance of :meth:`factorise` (:math:`\sigma^2` plus
        the jitter), returned as a one-component :class:`GaussianMixturePredictive`
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
