"""What every precision block of `bnn_zoo.methods.laplace._structures` shares: the saved
form of its index, and ``tr(diag(alpha) A^-1)`` from its inverse diagonal."""

from __future__ import annotations

from torch import Tensor

__all__ = ["TraceFromDiagonal", "index_from", "index_state"]


def index_state(kind: str, index: slice | Tensor) -> dict:
    """The block's ``kind`` and its ``index`` as plain data: ``start`` and ``stop`` of a
    slice, or the ``indices`` tensor of a subnetwork."""
    if isinstance(index, slice):
        return {"kind": kind, "start": index.start, "stop": index.stop}
    return {"kind": kind, "indices": index}


def index_from(state: dict) -> slice | Tensor:
    """The index `index_state` saved in ``state``."""
    if "indices" in state:
        return state["indices"]
    return slice(state["start"], state["stop"])


class TraceFromDiagonal:
    """``alpha_trace`` of a block from its ``inverse_diagonal``."""

    def alpha_trace(self, alpha: Tensor, beta: Tensor) -> Tensor:
        """``tr(diag(alpha) A^-1) = sum_i alpha_i [A^-1]_ii``: the block's weights less its
        effective number of parameters ``gamma`` (PRML 5.179)."""
        return (alpha * self.inverse_diagonal(alpha, beta)).sum()
