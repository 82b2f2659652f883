"""Curvature of an MLP's negative log-likelihood at a point (seed 001; Bishop, PRML 5.7).

The weights of a :class:`~bnn_zoo.models.BayesianMLP` are handled as one flat
vector ``theta`` of length ``P`` (:class:`ParameterLayout`): layer by layer, the
weight ``W_l`` (d_in, d_out) row-major, then the bias ``b_l`` (d_out,). That is
the row-major flattening of the augmented matrix ``[W_l; b_l]`` of shape
(d_in + 1, d_out), so with ``a = [h_{l-1}, 1]`` the pre-activation is
``z_l = a^T [W_l; b_l]`` and the Jacobian of the network output ``f`` (K outputs)
with respect to the layer's weights is the outer product ``a ⊗ df/dz_l``.

Every function here returns the curvature ``H`` of the *unit-precision* negative
log-likelihood, so that the Laplace precision of the seed is

.. math:: A = \\alpha I + \\beta H,

with, per data point and ``f = f(x_n, theta)``,

* Gaussian likelihood: ``E(theta) = 1/2 sum_n ||f_n - t_n||^2`` (the seed's SSE term
  without its ``beta``); its Hessian in ``f`` is ``Lambda_n = I_K``;
* categorical likelihood: ``E(theta) = -sum_n log softmax(f_n)[t_n]`` (``beta = 1``);
  its Hessian in ``f`` is ``Lambda_n = diag(p_n) - p_n p_n^T``.

Structures (``P`` weights; ``L`` layers of ``p_l`` weights each):

=================  ==============================================  ==================
``hessian``        exact Hessian ``d^2 E / dtheta^2`` (``torch.func``)   P^2 memory
``ggn``            the full generalised Gauss-Newton                     P^2 memory
                   ``sum_n J_n^T Lambda_n J_n``
``diag``           the diagonal of the GGN                              P memory
``kron``           per layer ``(1/N sum_n a_n a_n^T) ⊗ (sum_n G_n)``     sum_l (d_in+1)^2 + d_out^2
                   on the joint ``[W; b]``, ``a_n = [h_n, 1]``,
                   ``G_n = J_{z,n}^T Lambda_n J_{z,n}`` (K-FAC)
``kron_separate``  per layer ``(1/N sum_n h_n h_n^T) ⊗ (sum_n G_n)``     sum_l d_in^2 + 2 d_out^2
                   on ``W`` and the exact ``sum_n G_n`` on ``b``, no
                   weight-bias cross terms (laplace-torch's ``kron``)
``last_layer``     the GGN of the last layer's weights only             p_L^2 memory
``low_rank``       the top ``rank`` eigenpairs of the GGN               P rank (P^2 to build)
``subnetwork``     the GGN of a chosen index set of weights, the       p_S^2 memory
                   rest fixed at the MAP
=================  ==============================================  ==================

laplace-torch users: its ``full`` is the GGN here (``ggn``), and its ``kron`` is
``kron_separate``; ``hessian`` is the exact Hessian, which laplace-torch does not offer
under that name.

The GGN is Bishop's outer-product approximation (PRML 5.84) generalised to any
likelihood; it equals the Hessian when the network is linear in ``theta`` and is
positive semi-definite always, unlike the exact Hessian at a ReLU net's MAP. The
Kronecker factorisation is exact for one data point, and for a network without
hidden layers under the Gaussian likelihood.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from bnn_zoo.core.checks import check_choice, check_data
from bnn_zoo.core.nn import mlp_forward

__all__ = ["CURVATURES", "LIKELIHOODS", "MAX_DENSE_BYTES", "ParameterLayout", "check_curvature",
           "check_dense_fits", "diagonal_ggn", "full_hessian", "ggn", "jacobian", "kron_ggn",
           "last_layer_ggn", "layer_jacobians", "loss_whitening", "negative_log_likelihood",
           "subnetwork_ggn", "subnetwork_indices"]

CURVATURES = ("hessian", "ggn", "diag", "kron", "kron_separate", "last_layer", "low_rank",
              "subnetwork")
LIKELIHOODS = ("gaussian", "categorical")
MAX_DENSE_BYTES = 2 * 1024**3
CHUNK = 256


@dataclass(frozen=True)
class ParameterLayout:
    """Where each weight tensor of an MLP sits in the flat vector ``theta``.

    ``sites`` is the model's ``(name, shape)`` list in forward order, alternating
    weight ``(d_in, d_out)`` and bias ``(d_out,)`` as :attr:`BayesianMLP.sites` gives it.
    """

    sites: tuple[tuple[str, tuple[int, ...]], ...]

    @classmethod
    def from_model(cls, model) -> ParameterLayout:
        sites = tuple((name, tuple(shape)) for name, shape in model.sites)
        if len(sites) % 2 or any(len(s) != 2 for _, s in sites[::2]) or any(
                len(s) != 1 for _, s in sites[1::2]):
            raise ValueError("Expected model.sites to alternate weight (d_in, d_out) and bias "
                             f"(d_out,) tensors, but got {sites}.")
        return cls(sites)

    @property
    def sizes(self) -> list[int]:
        """Layer widths ``[d_0, ..., d_L]``."""
        return [self.sites[0][1][0]] + [shape[1] for _, shape in self.sites[::2]]

    @property
    def num_layers(self) -> int:
        return len(self.sites) // 2

    @property
    def layer_slices(self) -> list[slice]:
        """Slice of ``theta`` holding layer ``l``'s ``[W_l; b_l]``, ``(d_in + 1) * d_out`` long."""
        out, start = [], 0
        for d_in, d_out in zip(self.sizes[:-1], self.sizes[1:]):
            out.append(slice(start, start + (d_in + 1) * d_out))
            start = out[-1].stop
        return out

    @property
    def num_parameters(self) -> int:
        return self.layer_slices[-1].stop

    def layer_index(self, like: Tensor) -> Tensor:
        """(P,) the layer of every entry of ``theta``, as int64 on ``like.device``."""
        sizes = [s.stop - s.start for s in self.layer_slices]
        return torch.repeat_interleave(torch.arange(len(sizes), device=like.device),
                                       torch.tensor(sizes, device=like.device))

    def flatten(self, tensors: dict[str, Tensor]) -> Tensor:
        """Concatenate the site tensors ``{name: (*S, *shape)}`` into ``theta`` (*S, P)."""
        parts = []
        for name, shape in self.sites:
            value = tensors[name]
            parts.append(value.reshape(*value.shape[:value.dim() - len(shape)], -1))
        return torch.cat(parts, -1)

    def unflatten(self, theta: Tensor) -> dict[str, Tensor]:
        """Split ``theta`` (*S, P) into ``{name: (*S, *shape)}``."""
        out, start = {}, 0
        for name, shape in self.sites:
            size = math.prod(shape)
            out[name] = theta[..., start:start + size].reshape(*theta.shape[:-1], *shape)
            start += size
        return out

    def network(self, theta: Tensor) -> list[tuple[Tensor, Tensor]]:
        """The ``(W, b)`` list of :func:`bnn_zoo.core.nn.mlp_forward` for ``theta`` (*S, P)."""
        values = list(self.unflatten(theta).values())
        return list(zip(values[::2], values[1::2]))


def check_curvature(curvature: str) -> None:
    """Refuse a ``curvature`` outside :data:`CURVATURES`, saying what the old ``"full"`` is now
    called (it was the exact Hessian; laplace-torch's ``"full"`` is the GGN)."""
    if curvature == "full":
        raise ValueError("curvature='full' is ambiguous and no longer accepted: the exact "
                         "Hessian it named is now curvature='hessian', and the full GGN "
                         "(laplace-torch's 'full') is curvature='ggn'.")
    check_choice("curvature", curvature, CURVATURES)


def check_dense_fits(num_parameters: int, dtype: torch.dtype, curvature: str,
                     max_bytes: int = MAX_DENSE_BYTES) -> None:
    """Refuse a dense ``P x P`` matrix larger than ``max_bytes`` with a clear error."""
    need = num_parameters**2 * torch.finfo(dtype).bits // 8
    if need > max_bytes:
        raise ValueError(
            f"curvature={curvature!r} needs a dense {num_parameters} x {num_parameters} matrix "
            f"({need / 1024**3:.1f} GiB, more than the limit of {max_bytes / 1024**3:.1f} GiB); "
            "use curvature='kron', 'diag' or 'last_layer', whose memory grows as the layer "
            "sizes, P, or the last layer's size squared."
        )


def negative_log_likelihood(f: Tensor, y: Tensor, likelihood: str) -> Tensor:
    """``E`` of the module docstring: ``1/2 sum (f - y)^2`` or the summed cross-entropy."""
    if likelihood == "gaussian":
        return 0.5 * ((f.squeeze(-1) - y) ** 2).sum()
    return torch.nn.functional.cross_entropy(f, y.long(), reduction="sum")


def loss_whitening(f: Tensor, likelihood: str) -> Tensor:
    """(N, K, K) factors ``R_n`` with ``R_n^T R_n = Lambda_n``, the Hessian of ``E`` in ``f_n``.

    Categorical: ``R_n = diag(sqrt(p_n)) (I - 1 p_n^T)``, since
    ``diag(p) - p p^T = sum_k p_k (e_k - p)(e_k - p)^T``.
    """
    eye = torch.eye(f.shape[-1], dtype=f.dtype, device=f.device)
    if likelihood == "gaussian":
        return eye.expand(f.shape[0], -1, -1)
    p = torch.softmax(f, -1)
    return p.sqrt().unsqueeze(-1) * (eye - p.unsqueeze(-2))


def layer_jacobians(theta: Tensor, x: Tensor, layout: ParameterLayout,
                    act: Callable[[Tensor], Tensor]) -> tuple[Tensor, list[Tensor], list[Tensor]]:
    """Network output and, per layer, its inputs and the output's Jacobian in its pre-activation.

    Returns ``f`` (N, K), ``a_l = [h_{l-1}, 1]`` (N, d_in + 1) and
    ``J_l[n, k, j] = d f_nk / d z_l,nj`` (N, K, d_out) for every layer ``l``. The
    Jacobian of ``f_nk`` in layer ``l``'s flat weights is ``outer(a_l[n], J_l[n, k])``.
    One backward pass per output (K of them), none per data point.
    """
    h, inputs, pre = x, [], []
    net = layout.network(theta.detach())
    with torch.enable_grad():
        for i, (weight, bias) in enumerate(net):
            inputs.append(torch.cat([h, h.new_ones(h.shape[0], 1)], -1))
            z = (h @ weight + bias).requires_grad_()
            pre.append(z)
            h = act(z) if i < len(net) - 1 else z
        f = h
        rows = [torch.autograd.grad(f[:, k].sum(), pre, retain_graph=k < f.shape[1] - 1)
                for k in range(f.shape[1])]
    jacs = [torch.stack([row[i] for row in rows], 1) for i in range(len(pre))]
    return f.detach(), [a.detach() for a in inputs], jacs


def _whitened(theta, x, layout, act, likelihood, layers=None):
    """``a_l`` and ``R_n J_l`` for the requested layers (all by default)."""
    f, inputs, jacs = layer_jacobians(theta, x, layout, act)
    r = loss_whitening(f, likelihood)
    keep = range(layout.num_layers) if layers is None else layers
    return [(inputs[i], r @ jacs[i]) for i in keep]


def jacobian(theta: Tensor, x: Tensor, layout: ParameterLayout, act: Callable[[Tensor], Tensor],
             layers: list[int] | None = None) -> tuple[Tensor, Tensor]:
    """Output ``f`` (N, K) and its Jacobian ``g = df/dtheta`` (N, K, P) at ``theta``.

    With ``layers`` given, only those layers' columns, concatenated in order.
    This is the seed's ``g = grad_w y(x, w)`` at ``w_MAP``, one row per output.
    """
    f, inputs, jacs = layer_jacobians(theta, x, layout, act)
    keep = range(layout.num_layers) if layers is None else layers
    cols = [(inputs[i][:, None, :, None] * jacs[i][:, :, None, :]).flatten(2) for i in keep]
    return f, torch.cat(cols, -1)


def _checked(theta: Tensor, x: Tensor, y: Tensor, layout: ParameterLayout, likelihood: str):
    x, y = check_data(x, y)
    check_choice("likelihood", likelihood, LIKELIHOODS)
    if theta.shape != (layout.num_parameters,):
        raise ValueError(f"Expected theta of shape ({layout.num_parameters},), "
                         f"but got {tuple(theta.shape)}.")
    return x, y


def full_hessian(theta: Tensor, x: Tensor, y: Tensor, layout: ParameterLayout,
                 act: Callable[[Tensor], Tensor], likelihood: str = "gaussian",
                 max_bytes: int = MAX_DENSE_BYTES) -> Tensor:
    """(P, P) exact Hessian ``d^2 E / dtheta^2`` in one vectorised ``torch.func`` call
    (``jacrev`` of ``jacrev``, not a row-by-row loop; reverse-over-reverse because the
    forward mode of ``torch.func.hessian`` scripts decompositions with the deprecated
    ``torch.jit.script`` on first use)."""
    x, y = _checked(theta, x, y, layout, likelihood)
    check_dense_fits(theta.shape[0], theta.dtype, "hessian", max_bytes)

    def energy(t: Tensor) -> Tensor:
        return negative_log_likelihood(mlp_forward(x, layout.network(t), act), y, likelihood)

    return torch.func.jacrev(torch.func.jacrev(energy))(theta.detach())


def ggn(theta: Tensor, x: Tensor, y: Tensor, layout: ParameterLayout,
        act: Callable[[Tensor], Tensor], likelihood: str = "gaussian",
        max_bytes: int = MAX_DENSE_BYTES, chunk: int = CHUNK) -> Tensor:
    """(P, P) generalised Gauss-Newton ``sum_n J_n^T Lambda_n J_n``, in chunks of data points."""
    x, y = _checked(theta, x, y, layout, likelihood)
    check_dense_fits(theta.shape[0], theta.dtype, "ggn", max_bytes)
    return _dense_ggn(theta, x, layout, act, likelihood, None, chunk)


def last_layer_ggn(theta: Tensor, x: Tensor, y: Tensor, layout: ParameterLayout,
                   act: Callable[[Tensor], Tensor], likelihood: str = "gaussian",
                   chunk: int = CHUNK) -> Tensor:
    """(p_L, p_L) the GGN block of the last layer's ``[W_L; b_L]`` (the rest held at ``theta``)."""
    x, y = _checked(theta, x, y, layout, likelihood)
    return _dense_ggn(theta, x, layout, act, likelihood, [layout.num_layers - 1], chunk)


def _dense_ggn(theta, x, layout, act, likelihood, layers, chunk) -> Tensor:
    size = sum(s.stop - s.start for i, s in enumerate(layout.layer_slices)
               if layers is None or i in layers)
    out = theta.new_zeros(size, size)
    for xc in x.split(chunk):  # memory grows with the chunk, not N
        rows = torch.cat([(a[:, None, :, None] * rj[:, :, None, :]).flatten(2)
                          for a, rj in _whitened(theta, xc, layout, act, likelihood, layers)], -1)
        rows = rows.flatten(0, 1)
        out += rows.T @ rows
    return out


def subnetwork_indices(indices, num_parameters: int) -> Tensor:
    """``indices`` as a sorted int64 tensor of distinct positions in ``theta`` (P,)."""
    out = torch.as_tensor(indices)
    if out.dim() != 1 or out.numel() == 0 or out.dtype.is_floating_point or out.dtype == \
            torch.bool:
        raise ValueError(f"Expected subnetwork indices as a non-empty 1-d sequence of integers, "
                         f"but got {tuple(out.shape)} of {out.dtype}.")
    out = out.long().sort().values
    if int(out[0]) < 0 or int(out[-1]) >= num_parameters or bool((out[1:] == out[:-1]).any()):
        raise ValueError(f"Expected distinct subnetwork indices in [0, {num_parameters}), but "
                         f"got {out.tolist()}.")
    return out


def subnetwork_ggn(theta: Tensor, x: Tensor, y: Tensor, layout: ParameterLayout,
                   act: Callable[[Tensor], Tensor], likelihood: str = "gaussian", *,
                   indices: Tensor, chunk: int = CHUNK) -> Tensor:
    """(p_S, p_S) the GGN block ``sum_n J_{n,S}^T Lambda_n J_{n,S}`` of the weights
    ``theta[indices]`` (Daxberger et al. 2021, subnetwork Laplace), in chunks of data points."""
    x, y = _checked(theta, x, y, layout, likelihood)
    indices = subnetwork_indices(indices, layout.num_parameters).to(theta.device)
    out = theta.new_zeros(indices.numel(), indices.numel())
    for xc in x.split(chunk):  # memory grows with the chunk, not N
        f, g = jacobian(theta, xc, layout, act)
        rows = (loss_whitening(f, likelihood) @ g[..., indices]).flatten(0, 1)
        out += rows.T @ rows
    return out


def diagonal_ggn(theta: Tensor, x: Tensor, y: Tensor, layout: ParameterLayout,
                 act: Callable[[Tensor], Tensor], likelihood: str = "gaussian",
                 chunk: int = CHUNK) -> Tensor:
    """(P,) the diagonal of the GGN, ``sum_{n,k} a_{n,i}^2 (R_n J_n)_{k,j}^2`` per layer."""
    x, y = _checked(theta, x, y, layout, likelihood)
    out = theta.new_zeros(theta.shape[0])
    for xc in x.split(chunk):  # memory grows with the chunk, not N
        parts = [torch.einsum("ni,nkj->ij", a**2, rj**2).flatten()
                 for a, rj in _whitened(theta, xc, layout, act, likelihood)]
        out += torch.cat(parts)
    return out


def kron_ggn(theta: Tensor, x: Tensor, y: Tensor, layout: ParameterLayout,
             act: Callable[[Tensor], Tensor], likelihood: str = "gaussian",
             chunk: int = CHUNK) -> list[tuple[Tensor, Tensor]]:
    """Per layer the Kronecker factors ``(Q_l, G_l)`` with GGN block ``≈ Q_l ⊗ G_l`` (K-FAC).

    ``Q_l = 1/N sum_n a_n a_n^T`` of shape (d_in + 1, d_in + 1) and
    ``G_l = sum_n J_{z,n}^T Lambda_n J_{z,n}`` of shape (d_out, d_out) (Martens & Grosse
    2015; Ritter et al. 2018). The exact block is ``sum_n a_n a_n^T ⊗ G_n``.
    """
    x, y = _checked(theta, x, y, layout, likelihood)
    sizes = layout.sizes
    factors = [(theta.new_zeros(d_in + 1, d_in + 1), theta.new_zeros(d_out, d_out))
               for d_in, d_out in zip(sizes[:-1], sizes[1:])]
    for xc in x.split(chunk):  # memory grows with the chunk, not N
        for (q, g), (a, rj) in zip(factors, _whitened(theta, xc, layout, act, likelihood)):
            q += a.T @ a
            g += torch.einsum("nki,nkj->ij", rj, rj)
    return [(q / x.shape[0], g) for q, g in factors]
