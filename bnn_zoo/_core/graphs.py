"""The SVI step as a CUDA graph: recorded once, replayed on every later step.

On a GPU a small network's step is bound by the host, not the device: every op of the
model, the guide, the ELBO, the backward pass and the optimiser costs a Python call and a
kernel launch, while the kernels themselves take microseconds. A CUDA graph
(``torch.cuda.CUDAGraph``) records the kernels of one whole step (gradients, the NaN guard's
bookkeeping and the fused Adam update) and replays them with one launch and no Python.

What a replay needs is what the recorded kernels read, at the addresses they were recorded
with:

* the minibatch: its indices and point weights are copied into the graph's own buffers
  before each replay (the data themselves stay where they are; a loader's batch is copied
  too);
* the random draws: the graph takes them from the CUDA generator's Philox stream, whose
  offset torch advances on every replay, so every step draws fresh noise;
* the learning rate: a tensor on the device (``Adam(capturable=True)``), which a schedule
  fills in place;
* lazily made state (Adam's moments, the trace of the loss, cuBLAS workspaces): made by
  [`WARMUP`][] ordinary steps of each minibatch shape on a side stream before its
  recording, as the PyTorch guide to CUDA graphs prescribes.

Only a traced step (``jit=True``) is recorded: Pyro's ELBO op by op reads the loss back to
check it for NaN, which a recording cannot hold, and a trace already asks of a model what a
replay does, that its Python does the same on every step. A traced step that still cannot
be recorded (an op that reads back sizes, such as ``nonzero`` or boolean indexing) raises
during recording; the step then runs op by op, and says so once with a [`GraphWarning`][].
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

__all__ = ["WARMUP", "GraphWarning", "StepGraphs", "capturable"]

#: Ordinary steps of each minibatch shape before its graph is recorded.
WARMUP = 3


class GraphWarning(RuntimeWarning):
    """The step could not be recorded as a CUDA graph and runs op by op."""


def capturable(device: torch.device, cuda_graph: bool | None, *, jit: bool,
               distributed: bool) -> bool:
    """Whether a step on ``device`` records its CUDA graph: ``cuda_graph`` ``None`` (the
    default) where one can be, ``True`` always (a ``ValueError`` where none can be),
    ``False`` never. One can be for a traced step (``jit``: Pyro's ELBO op by op reads the
    loss back to check it for NaN) on a CUDA device in one process (``distributed``
    averages the gradients over processes, op by op)."""
    problem = ("a distributed step" if distributed else
               f"data on {device}" if device.type != "cuda" else
               None if jit else "jit=False (Pyro's ELBO op by op reads the loss back)")
    if cuda_graph and problem is not None:
        raise ValueError(f"Expected cuda_graph=True only for a traced step (jit=True) on a "
                         f"CUDA device in one process, but got {problem}; pass "
                         "cuda_graph=None or False.")
    return problem is None if cuda_graph is None else cuda_graph


class StepGraphs:
    """The CUDA graphs of one step, one per minibatch key (module doc).

    ``update(i, idx, weights)`` is the device side of a step (gradients, NaN guard, optimiser
    update; nothing read back); ``inputs()`` the tensors besides ``idx`` and ``weights``
    that it reads and that may be replaced between steps (a loader's batch): each is
    copied into the graph's own buffer before a replay.
    """

    def __init__(self, update: Callable[[int, Tensor, Tensor], Tensor],
                 inputs: Callable[[], tuple[Tensor, ...]], device: torch.device) -> None:
        self.update, self.inputs, self.device = update, inputs, device
        self.side = torch.cuda.Stream(device)
        self.reset()

    def reset(self) -> None:
        """Forget every graph and warm-up (the state they read was replaced)."""
        self.graphs: dict[Any, tuple[torch.cuda.CUDAGraph, tuple[Tensor, ...], Tensor]] = {}
        self.warm: dict[Any, int] = {}
        self.failure: str | None = None

    def __call__(self, i: int, key: Any, idx: Tensor, weights: Tensor) -> Tensor:
        """Run the step of minibatch ``i`` (indices ``idx``, point weights ``weights``) under
        the graph of ``key``, recording it after its warm-up; return the loss."""
        if self.failure is not None:
            return self.update(i, idx, weights)
        feeds = (*self.inputs(), idx, weights)
        key = (key, *(tuple(t.shape) for t in feeds))
        if self.warm.get(key, 0) < WARMUP:
            self.warm[key] = self.warm.get(key, 0) + 1
            return self.warm_up(i, idx, weights)
        recorded = self.graphs.get(key) or self.record(key, i, feeds)
        if recorded is None:
            return self.update(i, idx, weights)
        graph, buffers, loss = recorded
        for buffer, feed in zip(buffers, feeds):
            if buffer is not feed:
                buffer.copy_(feed)
        graph.replay()
        return loss.clone()

    def warm_up(self, i: int, idx: Tensor, weights: Tensor) -> Tensor:
        """An ordinary step on the side stream, as a recording's warm-up."""
        self.side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.side):
            loss = self.update(i, idx, weights)
        torch.cuda.current_stream(self.device).wait_stream(self.side)
        return loss

    def record(self, key: Any, i: int, feeds: tuple[Tensor, ...]
               ) -> tuple[torch.cuda.CUDAGraph, tuple[Tensor, ...], Tensor] | None:
        """Record the step of ``key`` on copies of the index and weight buffers (the inputs
        that stay put are read where they are); ``None`` (and a [`GraphWarning`][], once)
        if it cannot be recorded."""
        *inputs, idx, weights = feeds
        buffers = (*inputs, idx.clone(), weights.clone())
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize(self.device)
        try:
            with torch.cuda.graph(graph):
                loss = self.update(i, *buffers[-2:])
        except RuntimeError as error:
            self.failure = str(error).splitlines()[0]
            warnings.warn(f"The SVI step could not be recorded as a CUDA graph "
                          f"({self.failure}); it runs op by op.", GraphWarning, stacklevel=2)
            return None
        self.graphs[key] = (graph, buffers, loss)
        return self.graphs[key]
