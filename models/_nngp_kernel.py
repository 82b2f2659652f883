r"""The NNGP kernel: the covariance of the infinite-width limit of a Bayesian network with
one or more hidden layers, as a Pyro GP kernel.

Neal (1996), as in the second half of Arbel's lecture notes "Bayesian NN under a Laplace
approximation" (2021): the network

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
the limit. With [`GaussianPrior`][bnn_zoo.models.GaussianPrior] ``(scale=1, fan_in=True)``
the zoo's [`BayesianMLP`][bnn_zoo.models.BayesianMLP] with one hidden layer has exactly
this prior with every variance equal to 1.

Closed forms of :math:`E[\phi(u)\phi(u')]` (with :math:`k_{11}, k_{12}, k_{22}`
the entries of the covariance above):

* ``relu`` (arc-cosine kernel of order 1, Cho & Saul 2009):
  :math:`\frac{\sqrt{k_{11}k_{22}}}{2\pi}(\sin\theta + (\pi - \theta)\cos\theta)`,
  :math:`\cos\theta = k_{12}/\sqrt{k_{11}k_{22}}`;
* ``erf`` (Williams 1997):
  :math:`\frac{2}{\pi}\arcsin\frac{2k_{12}}{\sqrt{(1 + 2k_{11})(1 + 2k_{22})}}`;
* ``identity``: :math:`k_{12}` (Bayesian linear regression).

Any other activation of `bnn_zoo._core.nn.ACTIVATIONS` uses a Monte Carlo
kernel: the covariance of a random-feature network of ``num_features`` units per
hidden layer drawn once from the prior with a fixed seed (positive semi-definite by
construction, and differentiable in the hyperparameters). For ``depth > 1`` its
error is that of one finite net of width ``num_features``: a fluctuation of order
:math:`1/\sqrt{S}` and a bias of order :math:`1/S`.

**Automatic relevance determination** (``ard=True``; MacKay 1994, "Bayesian Non-linear
Modelling for the Prediction Competition"; Neal 1996, §1.2.3): each input ``h`` has its own
relevance :math:`r_h`, the input weights :math:`w_{mh} \sim N(0, \sigma_w^2 r_h / D)`, so
:math:`\Sigma(x, x') = \sigma_b^2 + \sigma_w^2 \sum_h r_h x_h x'_h / D`; type-II maximum
likelihood then shrinks the relevance of inputs the data do not use.

The kernel variances are bounded to `VARIANCE_BOUNDS`: outside them, on
standardised data, the fit has diverged, and the bounds keep :math:`K` finite and its
diagonal (hence the relative jitter of [`NNGPRegression`][bnn_zoo.models.NNGPRegression])
positive.

**Deeper networks** (``depth`` = ``L`` hidden layers, each with the same
:math:`\sigma_w^2, \sigma_b^2`, hidden-to-hidden weights of variance
:math:`\sigma_w^2 / H`): taking the widths to infinity one layer after the other
(the notes remark that the limit extends to deeper networks; Lee et al. 2018, "Deep neural
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

The notes' :math:`\sigma_H^2` is the variance of each output weight; it must
scale as :math:`1/H` for the limit :math:`N(0, H \sigma_H^2 c^2)` to exist, which
the notes leave implicit: here :math:`\sigma_H^2 = \sigma_v^2 / H`. The notes
also assume :math:`E[h_m(x)] = 0`, which fails for ReLU; it is not needed,
because :math:`E[v_m] = 0` already centres each term.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pyro.contrib.gp as gp
import torch
from pyro.distributions import constraints
from pyro.nn import PyroParam
from torch import Tensor

from bnn_zoo._core.checks import (
    check_bool,
    check_choice,
    check_positive,
    check_positive_int,
    check_tensor,
)
from bnn_zoo._core.nn import ACTIVATIONS, activation

__all__ = ["CLOSED_FORMS", "VARIANCE_BOUNDS", "NNGPKernel", "expected_product"]

#: Open interval of every kernel variance (see the module doc).
VARIANCE_BOUNDS = (1e-8, 1e8)


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
    activations of `CLOSED_FORMS`."""
    return CLOSED_FORMS[check_choice("activation", name, sorted(CLOSED_FORMS))](k11, k12, k22)


class NNGPKernel(gp.kernels.Kernel):
    r"""The NNGP kernel :math:`K(x, x')` of a network with ``depth`` hidden layers (see the
    module: the one-layer kernel and the layer recursion).

    A `pyro.contrib.gp.kernels.Kernel`, so it also plugs into Pyro's GP
    models. Its hyperparameters are ``PyroParam`` s in `VARIANCE_BOUNDS`; like
    any Pyro ``Parameterized`` they can be given priors with ``PyroSample``.

    Parameters
    ----------
    input_dim : number of input features ``D``.
    activation : a name of `bnn_zoo._core.nn.ACTIVATIONS`; closed form for
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
    ard : a relevance :math:`r_h` per input (``input_relevance``, starting at 1; module
        doc), else none (every :math:`r_h = 1`).
    seed : seed of the Monte Carlo features (fixed, so the kernel is a deterministic
        function of its hyperparameters).

    ``forward(X, Z=None, diag=False)`` returns the (N, M) covariance matrix, or its
    (N,) diagonal.
    """

    def __init__(self, input_dim: int, activation: str = "relu", *, depth: int = 1,
                 weight_variance: float = 1.0, bias_variance: float = 1.0,
                 output_variance: float = 1.0, output_bias_variance: float = 1.0,
                 num_features: int | None = None, seed: int = 0, ard: bool = False,
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
        self.ard = check_bool("ard", ard)
        if ard:
            self.input_relevance = PyroParam(torch.ones(input_dim, dtype=torch.float64),
                                             constraint=constraints.interval(low, high))

    @property
    def closed_form(self) -> bool:
        """Whether the kernel is exact (``False``: Monte Carlo random features)."""
        return self.num_features is None

    def _relevant(self, X: Tensor) -> Tensor:
        r"""The inputs scaled by :math:`\sqrt{r_h}` (with ``ard``), else as they are."""
        return X * self.input_relevance.sqrt() if self.ard else X

    def preactivation_covariance(self, X: Tensor, Z: Tensor) -> Tensor:
        r"""First layer :math:`\Sigma^{(1)}(x, z) = \sigma_b^2 + \sigma_w^2 \sum_h r_h x_h z_h
        / D`, shape (N, M)."""
        product = self._relevant(X) @ self._relevant(Z).T
        return self.bias_variance + self.weight_variance * product / self.input_dim

    def preactivation_variance(self, X: Tensor) -> Tensor:
        r"""(N,) :math:`\Sigma^{(1)}(x, x)`."""
        squares = (self._relevant(X) ** 2).sum(-1)
        return self.bias_variance + self.weight_variance * squares / self.input_dim

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
        units, fan_in = self._relevant(X), self.input_dim
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
