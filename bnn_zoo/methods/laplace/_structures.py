"""Structures of the Laplace precision ``A = diag(alpha) + beta H`` (Bishop 2006, *Pattern
Recognition and Machine Learning*, 5.7), and the blocks of a curvature.

Each block holds the curvature ``H`` of one slice of the flat weights ``theta`` in one
structure and answers, for given prior precisions ``alpha`` (one per weight of the slice)
and noise precision ``beta``, what the posterior needs: ``log |A|``, the diagonal of
``A^-1``, quadratic forms ``g^T A^-1 g``, draws ``A^-1/2 eps`` and the dense ``A^-1``.

A block is built from a curvature (``DenseBlock.from_hessian``, ``KronBlock.from_factors``)
once, at fit time. ``block.state_dict()`` gives what it holds as tensors and plain data
(its ``kind``, its slice as ``start``, ``stop``, and the tensors its constructor takes);
`block_from_state` rebuilds exactly that block, without any data.

The blocks held entry by entry, [`DenseBlock`][bnn_zoo.methods.laplace.DenseBlock]
and [`DiagBlock`][bnn_zoo.methods.laplace.DiagBlock], are in
`dense_blocks`; the factored ones,
[`KronBlock`][bnn_zoo.methods.laplace.KronBlock] and
[`LowRankBlock`][bnn_zoo.methods.laplace.LowRankBlock], in
`factored_blocks`.

Each structure of the curvature is one [`Structure`][] class, registered by its name
in `STRUCTURES`: it builds the blocks of its curvature for one likelihood
([`Structure.blocks`][bnn_zoo.methods.laplace.Structure.blocks]) and, for a Gaussian with a
noise precision per output, the `OutputBlock` s of each output's curvature
([`Structure.output_blocks`][bnn_zoo.methods.laplace.Structure.output_blocks]). A new
structure is one class and one line in `STRUCTURES`;
[`CurvatureSettings`][bnn_zoo.methods.laplace.CurvatureSettings] turns a name and its options
into the structure.

A block's ``index`` is a slice of ``theta``, or for ``subnetwork`` an int64 tensor of
positions. Memory for ``p`` weights: [`DenseBlock`][] ``p^2`` (``hessian``, ``ggn``,
``last_layer``, ``subnetwork``; ``kron_separate``'s bias blocks), [`LowRankBlock`][]
``p k`` (``low_rank``), [`DiagBlock`][] ``p`` (``diag``),
[`KronBlock`][] ``(d_in + 1)^2 + d_out^2`` (``kron``, one per layer; ``kron_separate``
one of ``d_in^2 + d_out^2`` per layer's weight matrix).

.. warning:: The exact Hessian at the MAP of a ReLU network is often indefinite
   (the MAP found by SVI is not an exact mode, and the Hessian has negative
   directions along the residuals). Where ``alpha I + beta H`` is then not positive
   definite, even with jitter, ``curvature="hessian"`` raises
   `NotPositiveDefiniteError` by default; ``indefinite="clip"`` instead
   projects ``H`` onto the positive semi-definite cone and counts the clipped
   eigenvalues in the block's ``clipped``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar

import torch
from torch import Tensor

from bnn_zoo._core.checks import check_choice, check_positive_int
from bnn_zoo.methods.laplace._curvature import (
    MAX_DENSE_BYTES,
    diagonal_ggn,
    full_hessian,
    ggn,
    kron_ggn,
    last_layer_ggn,
    subnetwork_ggn,
    subnetwork_indices,
)
from bnn_zoo.methods.laplace._dense import DenseBlock, DiagBlock, Indefinite
from bnn_zoo.methods.laplace._factored import KronBlock, LowRankBlock
from bnn_zoo.methods.laplace._layouts import Layout
from bnn_zoo.methods.laplace._outputs import OutputBlock
from bnn_zoo.models._likelihood import GaussianPrecision, Likelihood

__all__ = ["OUTPUT_CURVATURES", "STRUCTURES", "Block", "CurvatureName", "Diag", "Ggn",
           "Hessian", "Kron", "KronSeparate", "LastLayer", "LowRank", "Structure", "Subnetwork",
           "block_from_state", "check_curvature"]

Block = DenseBlock | DiagBlock | KronBlock | LowRankBlock | OutputBlock
_KINDS = {cls.kind: cls for cls in (DenseBlock, DiagBlock, KronBlock, LowRankBlock,
                                    OutputBlock)}
#: The arguments of a curvature function: ``theta``, ``x``, ``y``, the layout and the
#: likelihood.
CurvatureArgs = tuple[Tensor, Tensor, Tensor, Layout, Likelihood]


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


@dataclass(frozen=True, eq=False)
class Structure:
    """A structure of the curvature ``H`` of the Laplace precision, with the options its
    blocks take: ``indefinite`` (``"raise"`` or ``"clip"``, for an indefinite exact
    Hessian), ``max_bytes`` (the largest dense ``P x P`` matrix), ``rank`` (the eigenpairs
    ``low_rank`` keeps) and ``subnetwork`` (the weights ``subnetwork`` covers)."""

    #: The name the structure is chosen by (`CurvatureName`).
    name: ClassVar[str]
    #: Whether it holds each output's curvature apart ([`output_blocks`][]).
    per_output: ClassVar[bool] = True

    indefinite: Indefinite = Indefinite.RAISE
    max_bytes: int = MAX_DENSE_BYTES
    rank: int = 10
    subnetwork: Sequence[int] | Tensor | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "indefinite", Indefinite(
            check_choice("indefinite", self.indefinite, tuple(Indefinite))))
        check_positive_int("rank", self.rank)
        check_positive_int("max_bytes", self.max_bytes)

    def blocks(self, theta: Tensor, x: Tensor, y: Tensor, layout: Layout,
               likelihood: Likelihood) -> list[Block]:
        """The blocks of this curvature at ``theta`` (P,) on data ``x`` (N, D), ``y``."""
        raise NotImplementedError

    def output_blocks(self, theta: Tensor, x: Tensor, y: Tensor, layout: Layout
                      ) -> list[OutputBlock]:
        """The `OutputBlock` s of this curvature at ``theta`` (P,) on ``x`` (N, ...)
        and targets ``y`` (N, D): each output's curvature ``H_d`` computed alone, under a
        `GaussianPrecision` of its indicator."""
        check_choice("curvature (for D outputs with a noise precision each)", self.name,
                     OUTPUT_CURVATURES)
        eye = torch.eye(y.shape[-1], dtype=theta.dtype, device=theta.device)
        return self._output_blocks([(theta, x, y, layout, GaussianPrecision(e))
                                    for e in eye])

    def _output_blocks(self, units: list[CurvatureArgs]) -> list[OutputBlock]:
        raise NotImplementedError


class _Dense(Structure):
    """A structure of one block: the matrix `matrix` on the weights `index`,
    held dense (or as `block` makes it)."""

    #: The structure of an `OutputBlock`'s sum of the outputs' matrices.
    inner: ClassVar[str] = "dense"

    def index(self, theta: Tensor, layout: Layout) -> slice | Tensor:
        """The weights the block covers: all of them."""
        return slice(0, layout.num_parameters)

    def matrix(self, args: CurvatureArgs, index: slice | Tensor) -> Tensor:
        """The curvature on the weights ``index``."""
        raise NotImplementedError

    def block(self, index: slice | Tensor, matrix: Tensor) -> Block:
        """The block of ``matrix``. A GGN is positive semi-definite in exact arithmetic;
        where even jitter does not absorb the round-off negatives of a float32 GGN times a
        large ``beta``, the projection removes them."""
        return DenseBlock.from_hessian(index, matrix, "clip")

    def output_indefinite(self) -> str:
        """What an `OutputBlock` does with an indefinite sum: clip."""
        return "clip"

    def blocks(self, theta, x, y, layout, likelihood):
        index = self.index(theta, layout)
        return [self.block(index, self.matrix((theta, x, y, layout, likelihood), index))]

    def _output_blocks(self, units: list[CurvatureArgs]) -> list[OutputBlock]:
        theta, layout = units[0][0], units[0][3]
        index = self.index(theta, layout)
        parts = [self.matrix(args, index) for args in units]
        return [OutputBlock(index, self.inner, torch.stack(parts), rank=self.rank,
                            indefinite=self.output_indefinite())]


class Hessian(_Dense):
    """The exact Hessian ``d^2 E / dtheta^2``, dense (P^2 memory)."""

    name = "hessian"

    def matrix(self, args, index):
        return full_hessian(*args, max_bytes=self.max_bytes)

    def block(self, index, matrix):
        return DenseBlock.from_hessian(index, matrix, self.indefinite)

    def output_indefinite(self) -> str:
        return self.indefinite


class Ggn(_Dense):
    """The full generalised Gauss-Newton ``sum_n J_n^T Lambda_n J_n``, dense (P^2 memory)."""

    name = "ggn"

    def matrix(self, args, index):
        return ggn(*args, max_bytes=self.max_bytes)


class LowRank(Ggn):
    """The top ``rank`` eigenpairs of the GGN (P rank memory, P^2 to build)."""

    name = "low_rank"
    inner = "low_rank"

    def block(self, index, matrix):
        return LowRankBlock.from_hessian(index, matrix, self.rank)


class LastLayer(_Dense):
    """The GGN of the last layer's weights, the others at the MAP (p_L^2 memory)."""

    name = "last_layer"

    def index(self, theta, layout):
        return layout.layer_slices[-1]

    def matrix(self, args, index):
        return last_layer_ggn(*args)


class Subnetwork(_Dense):
    """The GGN of the weights ``subnetwork``, the others at the MAP (p_S^2 memory)."""

    name = "subnetwork"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.subnetwork is None:
            raise ValueError("curvature='subnetwork' needs the subnetwork's weight indices; "
                             "expected subnetwork=(...), but got None.")

    def index(self, theta, layout):
        return subnetwork_indices(self.subnetwork, layout.num_parameters).to(theta.device)

    def matrix(self, args, index):
        return subnetwork_ggn(*args, indices=index)


class Diag(Structure):
    """The diagonal of the GGN (P memory)."""

    name = "diag"

    def blocks(self, theta, x, y, layout, likelihood):
        args = (theta, x, y, layout, likelihood)
        return [DiagBlock(slice(0, layout.num_parameters), diagonal_ggn(*args))]

    def _output_blocks(self, units):
        everything = slice(0, units[0][3].num_parameters)
        return [OutputBlock(everything, "diag", torch.stack([diagonal_ggn(*a) for a in units]))]


class Kron(Structure):
    """K-FAC per layer on the joint ``[W; b]`` (``(d_in + 1)^2 + d_out^2`` per layer)."""

    name = "kron"

    def blocks(self, theta, x, y, layout, likelihood):
        return [KronBlock.from_factors(index, q, g)
                for (index, _), (q, g) in zip(layout.kron_indices(theta),
                                              kron_ggn(theta, x, y, layout, likelihood))]

    def _output_blocks(self, units):
        theta, layout = units[0][0], units[0][3]
        per_output = [kron_ggn(*args) for args in units]
        return [OutputBlock(index, "kron", torch.stack([factors[i][1] for factors in per_output]),
                            q=per_output[0][i][0])
                for i, (index, _) in enumerate(layout.kron_indices(theta))]


class KronSeparate(Structure):
    """K-FAC per layer on ``W``, the exact ``sum_n G_n`` on ``b``, no weight-bias cross
    terms (laplace-torch's ``kron``; ``d_in^2 + 2 d_out^2`` per layer)."""

    name = "kron_separate"
    per_output = False

    def blocks(self, theta, x, y, layout, likelihood):
        blocks: list[Block] = []
        for (index, bias), (q, g) in zip(layout.kron_indices(theta),
                                         kron_ggn(theta, x, y, layout, likelihood)):
            if not bias:
                blocks.append(KronBlock.from_factors(index, q, g))
                continue
            weights, biases = _split_bias(index, g.shape[0])
            blocks.append(KronBlock.from_factors(weights, q[:-1, :-1], g))
            blocks.append(DenseBlock.from_hessian(biases, g, "clip"))
        return blocks


#: The structures by name: a new structure is one class and one line here.
STRUCTURES: dict[str, type[Structure]] = {
    cls.name: cls for cls in (Hessian, Ggn, Diag, Kron, KronSeparate, LastLayer, LowRank,
                              Subnetwork)}
#: The names of the structures, as `STRUCTURES` registers them.
CurvatureName = StrEnum("CurvatureName", [(name.upper(), name) for name in STRUCTURES])
#: The structures a D-output Gaussian likelihood with a precision per output supports.
OUTPUT_CURVATURES = tuple(name for name, cls in STRUCTURES.items() if cls.per_output)


def check_curvature(curvature: str) -> CurvatureName:
    """``curvature`` as a `CurvatureName`; ``"full"``, which could mean the
    exact Hessian or laplace-torch's ``"full"`` (the GGN), is refused with both names."""
    if curvature == "full":
        raise ValueError("curvature='full' is ambiguous: the exact Hessian is "
                         "curvature='hessian', and the full GGN (laplace-torch's 'full') is "
                         "curvature='ggn'.")
    return CurvatureName(check_choice("curvature", curvature, tuple(CurvatureName)))
