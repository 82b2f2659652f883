"""Data-parallel SVI on ``torch.distributed`` (launched with ``torchrun``).

Each of the ``W`` processes holds a shard of the data (``n_r`` of the ``N`` rows)
and a full replica of the model and guide. At every step process ``r`` draws a
minibatch of ``B_r`` rows from its shard and computes the usual negative ELBO with
the data plate at the *global* size ``N``::

    loss_r = KL(q || p) - N / B_r * sum_{i in batch_r} E_q[log p(y_i | x_i, w)],

an unbiased estimate of the full-data loss on its own. The gradients of the
guide's (and model's) parameters are then averaged over the processes with one
``all_reduce`` before the optimiser step, so with equal shards (``B_r = B / W``)
the step is exactly the one a single process would take on the global minibatch
of ``B`` rows::

    1/W sum_r loss_r = KL(q || p) - N / B * sum_{i in global batch} E_q[log p(y_i | x_i, w)].

The parameters are broadcast from rank 0 when training starts, and every process
applies the same averaged gradient with the same Adam, so the replicas stay equal.
With the same ``seed`` on every process (what [`bnn_zoo.fit`][] does) the
processes also draw the same weight noise, which makes the equality above exact.
Rank 0 alone shows progress and writes checkpoints.

Launch (one machine, 4 processes; ``--nnodes``/``--rdzv-endpoint`` for several)::

    torchrun --standalone --nproc-per-node 4 benchmarks/distributed_fit.py

and in the script::

    from bnn_zoo._core import distributed
    distributed.init_process_group()          # gloo on CPU, nccl on GPU
    x, y = distributed.shard(x, y)            # or load only this process's rows
    bnn_zoo.fit(model, guide, x.to(distributed.device()), ..., distributed=True)
"""

from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist
from torch import Tensor

from bnn_zoo._core.checks import check_choice
from bnn_zoo._core.scaling import Standardizer

__all__ = ["GradientAverager", "device", "fit_standardizer", "free_port", "global_max",
           "global_size", "init_loopback_group", "init_process_group", "is_initialized",
           "is_main_process", "rank", "require", "shard", "world_size"]

BACKENDS = ("gloo", "nccl")


def is_initialized() -> bool:
    """Whether this process belongs to an initialised ``torch.distributed`` process group."""
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    """This process's rank (0 outside a process group)."""
    return dist.get_rank() if is_initialized() else 0


def world_size() -> int:
    """Number of processes (1 outside a process group)."""
    return dist.get_world_size() if is_initialized() else 1


def is_main_process() -> bool:
    """True on rank 0, and outside a process group: the process that writes."""
    return rank() == 0


def require() -> None:
    """Raise a ``ValueError`` unless a process group is initialised."""
    if not is_initialized():
        raise ValueError(
            "Expected an initialised torch.distributed process group for distributed=True: "
            "launch with torchrun and call bnn_zoo._core.distributed.init_process_group() first."
        )


def init_process_group(backend: str | None = None) -> bool:
    """Join the process group described by ``torchrun``'s environment variables.

    ``backend``: ``"gloo"`` (CPU) or ``"nccl"`` (GPU); by default ``nccl`` when
    CUDA is available, else ``gloo``. With ``nccl`` the process's CUDA device is
    set to ``LOCAL_RANK``. Returns ``True`` if it initialised a group, ``False``
    if one was already initialised or the process was not launched by
    ``torchrun`` (no ``RANK`` in the environment: a single-process run).
    """
    if is_initialized() or "RANK" not in os.environ:
        return False
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    check_choice("backend", backend, BACKENDS)
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend)
    return True


def free_port() -> int:
    """A free TCP port on the loopback interface, for `init_loopback_group`."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_loopback_group(rank: int, world_size: int, port: int, backend: str = "gloo") -> None:
    """Join a group of ``world_size`` processes on this machine over loopback, for
    processes started by ``torch.multiprocessing.spawn`` rather than ``torchrun``
    (tests, benchmarks). With ``nccl`` process ``rank`` uses GPU ``rank``."""
    check_choice("backend", backend, BACKENDS)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_RANK=str(rank))
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, rank=rank, world_size=world_size)


def device() -> torch.device:
    """The device this process should compute on: ``cuda:LOCAL_RANK`` when CUDA is
    available, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def shard(*tensors: Tensor) -> tuple[Tensor, ...]:
    """This process's rows ``rank, rank + W, rank + 2W, ...`` of each tensor.

    A convenience for data that fits on every machine; data that does not should be
    read shard by shard. Strided rows keep the shards' sizes within one of each other.
    """
    return tuple(t[rank()::world_size()] for t in tensors)


def _all_reduce(t: Tensor, op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM) -> Tensor:
    require()
    t = t.clone()
    dist.all_reduce(t, op=op)
    return t


def global_size(n: int, device: torch.device) -> int:
    """The sum of ``n`` over the processes (the global number of rows)."""
    return int(_all_reduce(torch.tensor(n, device=device)).item())


def global_sum(t: Tensor) -> Tensor:
    """The elementwise sum of ``t`` over the processes (every process gets it)."""
    return _all_reduce(t.clone())


def global_max(value: int, device: torch.device) -> int:
    """The largest ``value`` over the processes (e.g. the number of classes)."""
    return int(_all_reduce(torch.tensor(value, device=device), dist.ReduceOp.MAX).item())


def fit_standardizer(t: Tensor) -> Standardizer:
    """`Standardizer.fit` on the rows of ``t`` of every process together
    (mean and population standard deviation over all ``N`` rows, in two passes)."""
    n = global_size(t.shape[0], t.device)
    mean = _all_reduce(t.sum(0)) / n
    var = _all_reduce(((t - mean) ** 2).sum(0)) / n
    return Standardizer.from_mean_std(mean, var.sqrt())


class GradientAverager:
    """Keeps the replicas of ``params`` equal across the processes.

    On construction the parameters are broadcast from rank 0. Calling the object
    after ``loss.backward()`` replaces every gradient by its average over the
    processes (a missing gradient counts as zero) and returns the averaged loss,
    all in one ``all_reduce`` of a flat buffer.
    """

    def __init__(self, params: list[Tensor]) -> None:
        require()
        self.params = params
        with torch.no_grad():
            for p in params:
                dist.broadcast(p.data, src=0)

    def __call__(self, loss: Tensor) -> Tensor:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        flat = torch.cat([loss.detach().reshape(1), *(g.reshape(-1) for g in grads)])
        dist.all_reduce(flat)
        flat /= dist.get_world_size()
        offset = 1
        for p, g in zip(self.params, grads):
            p.grad = flat[offset:offset + g.numel()].view_as(g).to(g.dtype)
            offset += g.numel()
        return flat[0]
