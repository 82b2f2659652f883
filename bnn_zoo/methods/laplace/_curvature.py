"""Curvature of a network's negative log-likelihood at a point (Bishop 2006, *Pattern
Recognition and Machine Learning*, 5.7 for the Laplace approximation, 5.4 for the
Hessian and its outer-product approximation).

The weights are handled as one flat vector ``theta`` of length ``P``, grouped into
layers, by a layout ([`bnn_zoo.methods.laplace._layouts`][]): [`ParameterLayout`][] for a
[`BayesianMLP`][bnn_zoo.models.BayesianMLP] (layer by layer the row-major ``[W_l; b_l]`` of shape
(d_in + 1, d_out)), `ModuleLayout` for a
[`BayesianModule`][bnn_zoo.models.BayesianModule] around any torch module (its ``named_parameters``
in order, torch's layout; a layer is the parameters of one submodule). The layout
evaluates the network ``f(x, theta)``, its Jacobian ``J = df/dtheta`` and, for
Kronecker factors, each layer's inputs and output Jacobian; everything here is written
on those alone, so every structure below works on both (``kron`` and ``kron_separate``
on a module need every layer to be an ``nn.Linear``, ``nn.Conv1d`` or ``nn.Conv2d``).
The layout carries the network's activation.

Every function here returns the curvature ``H`` of the *unit-precision* negative
log-likelihood ``E(theta)`` of a `Likelihood` object,
so that the Laplace precision (PRML 5.7.1) is

.. math:: A = \\alpha I + \\beta H;

the likelihood gives ``E``, its gradient in the outputs and the square root ``R_n`` of
its Hessian ``Lambda_n`` in each output ``f_n = f(x_n, theta)`` (``I_K`` for a Gaussian,
``diag(p_n) - p_n p_n^T`` for a categorical, the Fisher of ``N(mu, sigma^2)`` for a
heteroscedastic Gaussian, ``diag(beta)`` for a
`GaussianPrecision`).

Structures (``P`` weights; ``L`` layers of ``p_l`` weights each):

=================  ==============================================  ==================
``hessian``        exact Hessian ``d^2 E / dtheta^2`` (``torch.func``)   P^2 memory
``ggn``            the full generalised Gauss-Newton                     P^2 memory
                   ``sum_n J_n^T Lambda_n J_n``
``diag``           the diagonal of the GGN                              P memory
``kron``           per layer ``(1/N sum_n a_n a_n^T) ⊗ (sum_n G_n)``     sum_l (d_in+1)^2 + d_out^2
                   on the joint ``[W; b]``, ``a_n = [h_n, 1]``,
                   ``G_n = J_{z,n}^T Lambda_n J_{z,n}`` (K-FAC; summed
                   over the output pixels of a convolution, KFC)
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

import torch
from torch import Tensor

from bnn_zoo._core.batches import Batches, chunks
from bnn_zoo._core.checks import check_data
from bnn_zoo._core.nn import ACTIVATION_BACKWARD
from bnn_zoo.methods.laplace._layouts import Layout
from bnn_zoo.methods.laplace._layouts import ParameterLayout as ParameterLayout
from bnn_zoo.models._likelihood import Gaussian, Likelihood

__all__ = ["MAX_DENSE_BYTES", "ParameterLayout", "check_dense_fits", "diagonal_ggn",
           "energy_and_gradient", "full_hessian", "ggn", "kron_ggn", "last_layer_ggn",
           "subnetwork_ggn", "subnetwork_indices"]

MAX_DENSE_BYTES = 2 * 1024**3
GAUSSIAN = Gaussian()
CHUNK = 256


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


def energy_and_gradient(theta: Tensor, x: Tensor, y: Tensor, layout: Layout,
                        likelihood: Likelihood) -> tuple[Tensor, Tensor]:
    """``E(theta)`` (the likelihood's negative log-likelihood of the outputs) and
    ``dE/dtheta`` (P,), detached.

    For the zoo's MLP ([`ParameterLayout`][]) with an activation whose backward pass
    `ACTIVATION_BACKWARD` knows, backpropagation written out (Bishop,
    PRML 5.3, eqs. 5.53-5.56): with ``z_l = h_{l-1} W_l + b_l``, ``h_l = act(z_l)`` and
    ``delta_L = dE/df`` (the likelihood's ``output_gradient``),

    .. math::

        \\delta_{l-1} = (\\delta_l W_l^T) \\odot act'(z_{l-1}), \\qquad
        \\frac{\\partial E}{\\partial W_l} = h_{l-1}^T \\delta_l, \\qquad
        \\frac{\\partial E}{\\partial b_l} = \\sum_n \\delta_{l,n},

    a dozen tensor operations for a one-hidden-layer net where autograd's graph takes
    twice as many, and no more large tensors than autograd allocates: on the small
    networks of the UCI sets autograd's per-call overhead is most of the cost of an
    evaluation, and a Laplace refit makes hundreds. Otherwise (a module, or another
    activation) by autograd.
    """
    act = layout.act if isinstance(layout, ParameterLayout) else None
    backward = ACTIVATION_BACKWARD.get(act)
    if backward is None:
        theta = theta.detach().requires_grad_()
        with torch.enable_grad():
            energy = likelihood.negative_log_likelihood(layout.output(theta, x), y)
        return energy.detach(), torch.autograd.grad(energy, theta)[0]
    theta = theta.detach()
    net = layout.network(theta)
    inputs, pre = [x], []
    for weight, bias in net[:-1]:
        pre.append(torch.addmm(bias, inputs[-1], weight))
        inputs.append(act(pre[-1]))
    f = torch.addmm(net[-1][1], inputs[-1], net[-1][0])
    delta = likelihood.output_gradient(f, y)
    grads: list[Tensor] = []
    for i in reversed(range(len(net))):
        grads += [delta.sum(0), (inputs[i].mT @ delta).reshape(-1)]
        if i > 0:
            delta = backward(delta @ net[i][0].mT, pre[i - 1], inputs[i])
    return likelihood.negative_log_likelihood(f, y), torch.cat(grads[::-1])


def _checked(theta: Tensor, x: Tensor, y: Tensor, layout: Layout):
    """``x`` and ``y`` checked (``x`` of the shape the layout's network takes) and
    the length of ``theta``; ``x`` may be a loader's
    [`Batches`][bnn_zoo._core.batches.Batches] (``y`` ``None``), checked batch by batch, whose
    sums go over one pass ([`chunks`][bnn_zoo._core.batches.chunks])."""
    if not isinstance(x, Batches):
        x, y = check_data(x, y, any_shape=True)
    layout.check_input(x.first[0] if isinstance(x, Batches) else x)
    if theta.shape != (layout.num_parameters,):
        raise ValueError(f"Expected theta of shape ({layout.num_parameters},), "
                         f"but got {tuple(theta.shape)}.")
    return x, y


def _whitened_rows(theta, x, layout, likelihood, layers=None) -> Tensor:
    """(N K, P) the rows of ``R_n J_n`` (only ``layers``' columns, if given), so that
    ``rows^T rows = sum_n J_n^T Lambda_n J_n``."""
    _, rows = layout.jacobian(theta, x, layers,
                              whiten=likelihood.hessian_root)
    return rows.flatten(0, 1)


def full_hessian(theta: Tensor, x: Tensor, y: Tensor, layout: Layout,
                 likelihood: Likelihood = GAUSSIAN, max_bytes: int = MAX_DENSE_BYTES,
                 chunk: int = CHUNK) -> Tensor:
    """(P, P) exact Hessian ``d^2 E / dtheta^2``: ``E`` is a sum over data points, so its
    Hessian is the sum of the Hessians of chunks of ``chunk`` points, each in one vectorised
    ``torch.func`` call (``jacrev`` of ``jacrev``, not a row-by-row loop; reverse-over-reverse
    because the forward mode of ``torch.func.hessian`` scripts decompositions with the
    deprecated ``torch.jit.script`` on first use). The vectorised call holds P copies of the
    chunk's activations, so the chunk, not ``N``, bounds the memory."""
    x, y = _checked(theta, x, y, layout)
    check_dense_fits(theta.shape[0], theta.dtype, "hessian", max_bytes)
    theta = theta.detach()
    out = theta.new_zeros(theta.shape[0], theta.shape[0])
    for xc, yc in chunks(x, y, chunk):  # memory grows with the chunk, not N

        def energy(t: Tensor, xc: Tensor = xc, yc: Tensor = yc) -> Tensor:
            return likelihood.negative_log_likelihood(layout.output(t, xc), yc)

        out += torch.func.jacrev(torch.func.jacrev(energy))(theta)
    return out


def ggn(theta: Tensor, x: Tensor, y: Tensor, layout: Layout,
        likelihood: Likelihood = GAUSSIAN, max_bytes: int = MAX_DENSE_BYTES,
        chunk: int = CHUNK) -> Tensor:
    """(P, P) generalised Gauss-Newton ``sum_n J_n^T Lambda_n J_n``, in chunks of data points."""
    x, y = _checked(theta, x, y, layout)
    check_dense_fits(theta.shape[0], theta.dtype, "ggn", max_bytes)
    return _dense_ggn(theta, x, y, layout, likelihood, None, chunk)


def last_layer_ggn(theta: Tensor, x: Tensor, y: Tensor, layout: Layout,
                   likelihood: Likelihood = GAUSSIAN, chunk: int = CHUNK) -> Tensor:
    """(p_L, p_L) the GGN block of the last layer's weights (the rest held at ``theta``)."""
    x, y = _checked(theta, x, y, layout)
    return _dense_ggn(theta, x, y, layout, likelihood, [layout.num_layers - 1], chunk)


def _dense_ggn(theta, x, y, layout, likelihood, layers, chunk) -> Tensor:
    size = sum(s.stop - s.start for i, s in enumerate(layout.layer_slices)
               if layers is None or i in layers)
    out = theta.new_zeros(size, size)
    for xc, _ in chunks(x, y, chunk):  # memory grows with the chunk, not N
        rows = _whitened_rows(theta, xc, layout, likelihood, layers)
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


def subnetwork_ggn(theta: Tensor, x: Tensor, y: Tensor, layout: Layout,
                   likelihood: Likelihood = GAUSSIAN, *, indices: Tensor,
                   chunk: int = CHUNK) -> Tensor:
    """(p_S, p_S) the GGN block ``sum_n J_{n,S}^T Lambda_n J_{n,S}`` of the weights
    ``theta[indices]`` (Daxberger et al. 2021, "Bayesian Deep Learning via Subnetwork
    Inference"), in chunks of data points."""
    x, y = _checked(theta, x, y, layout)
    indices = subnetwork_indices(indices, layout.num_parameters).to(theta.device)
    out = theta.new_zeros(indices.numel(), indices.numel())
    for xc, _ in chunks(x, y, chunk):  # memory grows with the chunk, not N
        rows = _whitened_rows(theta, xc, layout, likelihood)[:, indices]
        out += rows.T @ rows
    return out


def diagonal_ggn(theta: Tensor, x: Tensor, y: Tensor, layout: Layout,
                 likelihood: Likelihood = GAUSSIAN, chunk: int = CHUNK) -> Tensor:
    """(P,) the diagonal of the GGN, ``sum_{n,k} (R_n J_n)_{k,i}^2``, in chunks of data
    points. Where every layer's Jacobian is an outer product ``a_n ⊗ J_{z,n}`` laid out
    as ``theta`` (``layout.outer_product_jacobian``: the MLP) that is
    ``sum_{n,k} a_{n,i}^2 (R_n J_{z,n})_{k,j}^2`` per layer, without forming ``J``;
    otherwise from ``J`` itself (``chunk K P`` numbers at a time)."""
    x, y = _checked(theta, x, y, layout)
    out = theta.new_zeros(theta.shape[0])
    for xc, _ in chunks(x, y, chunk):  # memory grows with the chunk, not N
        if layout.outer_product_jacobian:
            f, parts = layout.layer_factors(theta, xc)
            r = likelihood.hessian_root(f)
            out += torch.cat([torch.einsum("ni,nkj->ij", a[:, 0] ** 2,
                                           (r @ jz[:, :, 0]) ** 2).flatten()
                              for a, jz in parts])
        else:
            out += (_whitened_rows(theta, xc, layout, likelihood) ** 2).sum(0)
    return out


def kron_ggn(theta: Tensor, x: Tensor, y: Tensor, layout: Layout,
             likelihood: Likelihood = GAUSSIAN, chunk: int = CHUNK
             ) -> list[tuple[Tensor, Tensor]]:
    """Per layer the Kronecker factors ``(Q_l, G_l)`` with GGN block ``≈ Q_l ⊗ G_l`` (K-FAC),
    on the layer's weights in the order of ``layout.kron_indices``.

    ``Q_l = 1/(N L) sum_{n,l} a_{n,l} a_{n,l}^T`` of shape (D + 1, D + 1) and
    ``G_l = sum_{n,l} J_{z,n,l}^T Lambda_n J_{z,n,l}`` of shape (d_out, d_out), over the
    ``L`` locations of the layer (1 for a dense layer; see
    [`bnn_zoo.methods.laplace._layouts`][]; Martens & Grosse 2015, "Optimizing Neural Networks with
    Kronecker-factored Approximate Curvature"; Grosse & Martens 2016, "A Kronecker-factored
    Approximate Fisher Matrix for Convolution Layers"; Ritter, Botev & Barber 2018, "A
    Scalable Laplace Approximation for Neural Networks"). For ``L = 1`` the exact block is
    ``sum_n a_n a_n^T ⊗ G_n``. A
    `ModuleLayout` with a layer other than ``nn.Linear``,
    ``nn.Conv1d`` or ``nn.Conv2d`` raises a ``ValueError`` naming it.
    """
    x, y = _checked(theta, x, y, layout)
    factors: list[list[Tensor]] = []
    counts: list[int] = []
    for xc, _ in chunks(x, y, chunk):  # memory grows with the chunk, not N
        f, parts = layout.layer_factors(theta, xc)
        r = likelihood.hessian_root(f)
        if not factors:
            factors = [[theta.new_zeros(a.shape[-1], a.shape[-1]),
                        theta.new_zeros(jz.shape[-1], jz.shape[-1])] for a, jz in parts]
            counts = [0] * len(parts)
        for i, (a, jz) in enumerate(parts):
            a = a.flatten(0, 1)
            rj = torch.einsum("nkj,njlo->nklo", r, jz).flatten(0, 2)
            factors[i][0] += a.T @ a
            factors[i][1] += rj.T @ rj
            counts[i] += a.shape[0]
    return [(q / count, g) for (q, g), count in zip(factors, counts)]
