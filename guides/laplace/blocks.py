"""Structures of the Laplace precision ``A = diag(alpha) + beta H`` (Bishop 2006, *Pattern
Recognition and Machine Learning*, 5.7), and the blocks of a curvature.

Each block holds the curvature ``H`` of one slice of the flat weights ``theta`` in one
structure and answers, for given prior precisions ``alpha`` (one per weight of the slice)
and noise precision ``beta``, what the posterior needs: ``log |A|``, the diagonal of
``A^-1``, quadratic forms ``g^T A^-1 g``, draws ``A^-1/2 eps`` and the dense ``A^-1``.

A block is built from a curvature (``DenseBlock.from_hessian``, ``KronBlock.from_factors``)
once, at fit time. ``block.state_dict()`` gives what it holds as tensors and plain data
(its ``kind``, its slice as ``start``, ``stop``, and the tensors its constructor takes);
:func:`block_from_state` rebuilds exactly that block, without any data.

The blocks held entry by entry, :class:`~bnn_zoo.guides.laplace.dense_blocks.DenseBlock`
and :class:`~bnn_zoo.guides.laplace.dense_blocks.DiagBlock`, are in
:mod:`~bnn_zoo.guides.laplace.dense_blocks`; the factored ones,
:class:`~bnn_zoo.guides.laplace.factored_blocks.KronBlock` and
:class:`~bnn_zoo.guides.laplace.factored_blocks.LowRankBlock`, in
:mod:`~bnn_zoo.guides.laplace.factored_blocks`.

A block's ``index`` is a slice of ``theta``, or for ``subnetwork`` an int64 tensor of
positions. Memory for ``p`` weights: :class:`DenseBlock` ``p^2`` (``hessian``, ``ggn``,
``last_layer``, ``subnetwork``; ``kron_separate``'s bias blocks), :class:`LowRankBlock`
``p k`` (``low_rank``), :class:`DiagBlock` ``p`` (``diag``),
:class:`KronBlock` ``(d_in + 1)^2 + d_out^2`` (``kron``, one per layer; ``kron_separate``
one of ``d_in^2 + d_out^2`` per layer's weight matrix).

.. warning:: The exact Hessian at the MAP of a ReLU network is often indefinite
   (the MAP found by SVI is not an exact mode, and the Hessian has negative
   directions along the residuals). Where ``alpha I + beta H`` is then not positive
   definite, even with jitter, ``curvature="hessian"`` raises
   :class:`NotPositiveDefiniteError` by default; ``indefinite="clip"`` instead
   projects ``H`` onto the positive semi-definite cone and counts the clipped
   eigenvalues in the block's ``clipped``.
"""

from __future__ import annotations

from torch import Tensor

from bnn_zoo.core.checks import check_choice
from bnn_zoo.guides.curvature import (
    MAX_DENSE_BYTES,
    Activation,
    check_curvature,
    diagonal_ggn,
    full_hessian,
    ggn,
    kron_ggn,
    last_layer_ggn,
    subnetwork_ggn,
    subnetwork_indices,
)
from bnn_zoo.guides.laplace.dense_blocks import INDEFINITE, DenseBlock, DiagBlock
from bnn_zoo.guides.laplace.factored_blocks import KronBlock, LowRankBlock
from bnn_zoo.guides.laplace.output_blocks import OutputBlock
from bnn_zoo.guides.layouts import Layout
from bnn_zoo.models.likelihood import Likelihood

__all__ = ["Block", "block_from_state", "curvature_blocks"]

Block = DenseBlock | DiagBlock | KronBlock | LowRankBlock | OutputBlock
_KINDS = {cls.kind: cls for cls in (DenseBlock, DiagBlock, KronBlock, LowRankBlock,
                                    OutputBlock)}


def block_from_state(state: dict) -> Block:
    """The block whose ``state_dict()`` is ``state``, dispatched on its ``kind``."""
    kind = state.get("kind")
    if kind not in _KINDS:
        raise ValueError(f"Expected a block state of kind {', '.join(_KINDS)}, "
                         f"but got {kind!r}.")
    return _KINDS[kind].from_state(state)


def _split_bias(index: slice | Tensor, d_out: int) -> tuple[slice | Tensor, slice | Tensor]:
    """A Kronecker index of ``[W^T; b]`` in row-major ``(D + 1, d_out)`` order split into
    that of ``W^T`` (the first ``D d_out``) and that of ``b`` (the last ``d_out``)."""
    if isinstance(index, slice):
        return slice(index.start, index.stop - d_out), slice(index.stop - d_out, index.stop)
    return index[:-d_out], index[-d_out:]


def curvature_blocks(curvature: str, theta: Tensor, x: Tensor, y: Tensor,
                     layout: Layout, act: Activation, likelihood: Likelihood,
                     *, indefinite: str = "raise", max_bytes: int = MAX_DENSE_BYTES,
                     rank: int = 10, subnetwork: Tensor | None = None) -> list[Block]:
    """The blocks of ``curvature`` (one of :data:`~bnn_zoo.guides.curvature.CURVATURES`) at
    ``theta`` (P,) on data ``x`` (N, D), ``y`` (N,); ``rank`` is the number of
    eigenpairs ``low_rank`` keeps, ``subnetwork`` the weights ``subnetwork`` covers."""
    check_curvature(curvature)
    check_choice("indefinite", indefinite, INDEFINITE)
    everything = slice(0, layout.num_parameters)
    args = (theta, x, y, layout, act, likelihood)
    if curvature == "hessian":
        return [DenseBlock.from_hessian(everything, full_hessian(*args, max_bytes=max_bytes),
                                        indefinite)]
    # A GGN is positive semi-definite in exact arithmetic; where even jitter does not
    # absorb the round-off negatives of a float32 GGN times a large beta, the projection
    # removes them.
    if curvature == "ggn":
        return [DenseBlock.from_hessian(everything, ggn(*args, max_bytes=max_bytes), "clip")]
    if curvature == "diag":
        return [DiagBlock(everything, diagonal_ggn(*args))]
    if curvature == "kron":
        return [KronBlock.from_factors(index, q, g)
                for (index, _), (q, g) in zip(layout.kron_indices(theta), kron_ggn(*args))]
    if curvature == "kron_separate":
        blocks: list[Block] = []
        for (index, bias), (q, g) in zip(layout.kron_indices(theta), kron_ggn(*args)):
            if not bias:
                blocks.append(KronBlock.from_factors(index, q, g))
                continue
            weights, biases = _split_bias(index, g.shape[0])
            blocks.append(KronBlock.from_factors(weights, q[:-1, :-1], g))
            blocks.append(DenseBlock.from_hessian(biases, g, "clip"))
        return blocks
    if curvature == "low_rank":
        return [LowRankBlock.from_hessian(everything, ggn(*args, max_bytes=max_bytes), rank)]
    if curvature == "subnetwork":
        if subnetwork is None:
            raise ValueError("curvature='subnetwork' needs the subnetwork's weight indices; "
                             "expected subnetwork=[...], but got None.")
        index = subnetwork_indices(subnetwork, layout.num_parameters).to(theta.device)
        return [DenseBlock.from_hessian(index, subnetwork_ggn(*args, indices=index), "clip")]
    return [DenseBlock.from_hessian(layout.layer_slices[-1], last_layer_ggn(*args), "clip")]
