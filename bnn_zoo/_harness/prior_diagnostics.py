r"""Prior diagnostics: what a Gaussian weight prior says about the units of a network.

The second half of Arbel's lecture notes "Bayesian NN under a Laplace approximation"
(2021), after Vladimirova et al. (2019), "Understanding priors in Bayesian neural networks
at the unit level": with i.i.d. centred Gaussian weights
and a ReLU-like activation, the pre-activation of a unit of layer ``l``
(``l = 1`` the first hidden layer, the output layer ``L``) is *sub-Weibull* with
tail parameter :math:`\theta = l/2`,

.. math:: \|X\|_k = (E|X|^k)^{1/k} \le C k^\theta \quad \forall k \ge 1,
   \qquad P(|X| \ge t) \le a \exp(-b\, t^{1/\theta}),

and the bound is tight (the moment norms grow as :math:`k^{l/2}`). Layer 1 is
Gaussian (sub-Gaussian, :math:`\theta = 1/2`), layer 2 sub-exponential, deeper
layers heavier still. (The notes write :math:`\|X\|_k = (E[X^k])^{1/k}`; for odd
``k`` this needs :math:`|X|`, which is used here.)

Two estimators of :math:`\theta` from samples:

* moments (`tail_parameter_from_moments`): the least-squares slope of
  :math:`\log\|X\|_k` against :math:`\log k`;
* survival (`tail_parameter_from_survival`): if
  :math:`-\log P(|X| > t) \approx b t^{1/\theta}`, the slope of
  :math:`\log(-\log S(t))` against :math:`\log t` in the upper tail is :math:`1/\theta`.

Both converge slowly (the moment slope at order ``k`` approaches ``l/2`` only as
``k`` grows: `relu_chain_log_norms` gives it exactly for width-1 nets), so
they are compared across depths, not read as exact values.

Also: the vectorised prior predictive of a zoo model (`prior_predictive`), the
outputs of wide deep fan-in nets under their prior sampled layer by layer
(`fan_in_prior_outputs`),
the units of every layer under the prior (`prior_preactivations`), and the
excess kurtosis that measures the distance of the output from its Gaussian
(infinite-width) limit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import pyro
import torch
from pyro import poutine
from torch import Tensor

from bnn_zoo._core.checks import check_positive_int, check_tensor
from bnn_zoo._core.linalg import symmetric_eigh
from bnn_zoo._core.nn import activation, mlp_forward

__all__ = ["excess_kurtosis", "fan_in_prior_outputs", "log_moment_norms", "prior_predictive",
           "prior_preactivations",
           "preactivations", "relu_chain_log_norms", "tail_parameter_from_moments",
           "tail_parameter_from_survival", "tail_table"]


def _prior_trace(model: Callable, x: Tensor, num_samples: int) -> poutine.Trace:
    check_tensor("x", x, ndim=2, floating=True)
    check_positive_int("num_samples", num_samples)
    with torch.no_grad(), pyro.plate("_prior_samples", num_samples, dim=-2):
        return poutine.trace(model).get_trace(x, None)


def prior_predictive(model: Callable, x: Tensor, num_samples: int, site: str = "f") -> Tensor:
    """``num_samples`` draws of the model's site ``site`` at inputs ``x`` (N, D) under the
    prior, in one vectorised pass (a plate over samples outside the data plate).

    Returns a tensor of shape (S, N, ...) (for the zoo's MLPs and ``"f"``: (S, N, d_out)).
    """
    trace = _prior_trace(model, x, num_samples)
    if site not in trace.nodes:
        raise ValueError(f"Unknown site {site!r}; the model has: "
                         f"{', '.join(n for n in trace.nodes if not n.startswith('_'))}.")
    return trace.nodes[site]["value"]


def _gaussian_columns(cov: Tensor, columns: int) -> Tensor:
    """``columns`` i.i.d. draws of ``N(0, cov)`` for each (..., N, N) ``cov``, as the columns
    of a (..., N, columns) tensor; by the symmetric square root, so a singular ``cov``
    (duplicate inputs, dead units) is fine."""
    eigenvalues, eigenvectors, _ = symmetric_eigh(cov, "the prior's covariance")
    root = eigenvectors * eigenvalues.clamp_min(0).sqrt().unsqueeze(-2)
    noise = torch.randn(*cov.shape[:-1], columns, dtype=cov.dtype, device=cov.device)
    return root @ noise


def fan_in_prior_outputs(x: Tensor, width: int, depth: int, activation_name: str,
                         num_samples: int) -> Tensor:
    r"""(S, N) draws of the output :math:`f(x)` at the inputs ``x`` (N, D) of MLPs with
    ``depth`` hidden layers of ``width`` units under the fan-in prior (weights
    :math:`N(0, 1/d_{in})`, biases :math:`N(0, 1)`: the zoo's MLP with
    ``GaussianPrior(1, fan_in=True)``, whose NNGP kernel has every variance 1).

    Sampled layer by layer, exactly in distribution: given the units :math:`h` (N, H) of
    a layer, the pre-activations :math:`g = h W + b` of the next have i.i.d. columns
    :math:`N(0, 1 1^T + h h^T / H)`, so only those (N, N) covariances are needed, not the
    (H, H) weights: :math:`O(S N H)` per layer instead of :math:`O(S H^2)`. The first layer
    has covariance :math:`1 1^T + x x^T / D` and the output one column.
    """
    check_tensor("x", x, ndim=2, floating=True)
    check_positive_int("width", width)
    check_positive_int("depth", depth)
    check_positive_int("num_samples", num_samples)
    phi = activation(activation_name)
    units = x.expand(num_samples, *x.shape)
    for columns in [width] * depth + [1]:
        cov = 1 + units @ units.transpose(-1, -2) / units.shape[-1]
        g = _gaussian_columns(cov, columns)
        units = phi(g)
    return g.squeeze(-1)


def preactivations(x: Tensor, params: Sequence[tuple[Tensor, Tensor]],
                   act: Callable[[Tensor], Tensor] = torch.relu) -> list[Tensor]:
    r"""Pre-activations :math:`g^{(l)} = \phi(g^{(l-1)}) W_l + b_l` of every layer
    ``l = 1..L`` of the network ``params`` (as in `bnn_zoo._core.nn.mlp_forward`),
    each of shape (*S, N, d_l)."""
    return [mlp_forward(x, params[:depth], act) for depth in range(1, len(params) + 1)]


def prior_preactivations(model, x: Tensor, num_samples: int) -> list[Tensor]:
    """Units of every layer of a [`BayesianMLP`][bnn_zoo.models.BayesianMLP] under its prior:
    a list over layers ``l = 1..L`` of (S, N, d_l) pre-activations at inputs ``x``."""
    trace = _prior_trace(model, x, num_samples)
    values = [trace.nodes[name]["value"].squeeze(1) for name, _ in model.sites]
    return preactivations(x, list(zip(values[::2], values[1::2])), model.act)


def log_moment_norms(samples: Tensor, orders: Sequence[float]) -> Tensor:
    r""":math:`\log \|X\|_k = \frac1k \log \frac1S \sum_s |x_s|^k` for each order ``k``,
    from samples of shape (S, ...) (each trailing entry is one variable); computed
    with a log-sum-exp so high orders do not overflow. Returns (len(orders), ...)."""
    check_tensor("samples", samples, floating=True)
    k = torch.as_tensor(orders, dtype=samples.dtype, device=samples.device)
    if k.dim() != 1 or bool((k <= 0).any()):
        raise ValueError(f"Expected orders to be a sequence of numbers > 0, but got {orders!r}.")
    k = k.reshape(-1, *([1] * samples.dim()))
    log_abs = samples.abs().log().unsqueeze(0)
    return (torch.logsumexp(k * log_abs, dim=1) - math.log(samples.shape[0])) / k.squeeze(1)


def relu_chain_log_norms(depth: int, orders: Sequence[float]) -> Tensor:
    r"""Exact :math:`\log\|g^{(l)}\|_k` for the width-1 ReLU net without biases,
    standard normal weights and input ``x = 1``: :math:`g^{(1)} = w_1`,
    :math:`g^{(l)} = w_l \,\mathrm{relu}(g^{(l-1)})`, so

    .. math:: E|g^{(l)}|^k = m_k^l / 2^{l-1}, \qquad
       m_k = E|Z|^k = 2^{k/2}\Gamma(\tfrac{k+1}{2}) / \sqrt{\pi},

    a product of ``l`` Gaussians up to the ReLU's halving. Returns (len(orders),) float64.
    """
    check_positive_int("depth", depth)
    k = torch.as_tensor(orders, dtype=torch.float64)
    log_m = k / 2 * math.log(2) + torch.lgamma((k + 1) / 2) - 0.5 * math.log(math.pi)
    return (depth * log_m - (depth - 1) * math.log(2)) / k


def tail_parameter_from_moments(log_norms: Tensor, orders: Sequence[float]) -> Tensor:
    r"""Least-squares slope :math:`\hat\theta` of :math:`\log\|X\|_k` on :math:`\log k`
    (``log_norms`` of shape (K, ...) as from `log_moment_norms`)."""
    if len(orders) < 2:
        raise ValueError(f"Expected at least two orders, but got {orders!r}.")
    log_k = torch.log(torch.as_tensor(orders, dtype=log_norms.dtype, device=log_norms.device))
    log_k = (log_k - log_k.mean()).reshape(-1, *([1] * (log_norms.dim() - 1)))
    centred = log_norms - log_norms.mean(0)
    return (log_k * centred).sum(0) / (log_k**2).sum(0)


def tail_parameter_from_survival(samples: Tensor, lower: float = 0.9,
                                 upper: float = 0.999) -> Tensor:
    r""":math:`\hat\theta = 1 / \hat s`, with :math:`\hat s` the least-squares slope of
    :math:`\log(-\log \hat S(t))` on :math:`\log t` over the order statistics of
    :math:`|X|` between the ``lower`` and ``upper`` quantiles (``samples``: (S,))."""
    check_tensor("samples", samples, ndim=1, floating=True)
    if not 0.0 < lower < upper < 1.0:
        raise ValueError(f"Expected 0 < lower < upper < 1, but got {lower!r} and {upper!r}.")
    t, _ = samples.abs().sort()
    n = t.shape[0]
    ranks = torch.arange(1, n + 1, dtype=t.dtype, device=t.device)
    survival = 1 - ranks / (n + 1)
    keep = (ranks > lower * n) & (ranks < upper * n) & (t > 0)
    if int(keep.sum()) < 3:
        raise ValueError(f"Expected more samples in the tail, but got {n} samples.")
    u, v = t[keep].log(), (-survival[keep].log()).log()
    u = u - u.mean()
    return (u**2).sum() / (u * (v - v.mean())).sum()


def excess_kurtosis(samples: Tensor) -> Tensor:
    """Sample excess kurtosis ``E(X - m)^4 / Var(X)^2 - 3`` over dim 0 (0 for a Gaussian)."""
    check_tensor("samples", samples, floating=True)
    centred = samples - samples.mean(0)
    return (centred**4).mean(0) / (centred**2).mean(0) ** 2 - 3


def tail_table(model, x: Tensor, num_samples: int,
               orders: Sequence[float] = (1, 2, 3, 4)) -> list[dict[str, float]]:
    """Per layer of ``model`` (a [`BayesianMLP`][bnn_zoo.models.BayesianMLP]) at one input ``x``
    (1, D): both tail-parameter estimates, the theorem's ``l/2``, and the excess kurtosis,
    pooling the units of the layer."""
    if x.dim() != 2 or x.shape[0] != 1:
        raise ValueError(f"Expected x of shape (1, D), but got {tuple(x.shape)}.")
    rows = []
    for depth, units in enumerate(prior_preactivations(model, x, num_samples), start=1):
        pooled = units.reshape(-1)
        rows.append({
            "layer": depth,
            "width": units.shape[-1],
            "theta_moments": float(tail_parameter_from_moments(
                log_moment_norms(pooled, orders), orders)),
            "theta_survival": float(tail_parameter_from_survival(pooled)),
            "theta_theory": depth / 2,
            "excess_kurtosis": float(excess_kurtosis(pooled)),
        })
    return rows
