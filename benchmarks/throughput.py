"""Training throughput (samples per second) of ``bbb``, on 1 and more processes, against
a plain-PyTorch step, all at the same global batch.

* ``torch``: one process, a deterministic ``nn.Sequential`` MLP of the same widths,
  Gaussian negative log-likelihood, ``torch.optim.Adam``, op by op; ``torch compiled``
  (with ``--compiled``): the same step with its loss and gradient through ``torch.compile``
  (``reduce-overhead``: CUDA graphs, on a GPU);
* ``bbb xW``: the ``bbb`` entry's model and guide through :class:`bnn_zoo._core.step.SVIStep`
  (traced, as the entry trains; on a GPU replayed from its CUDA graph), stepped as the
  runner's loop does with the NaN guard's read-back every 100 steps, on ``W`` processes of
  ``torch.distributed`` (gloo on the CPU over loopback, nccl on GPUs), each stepping on
  ``batch / W`` rows of its shard with the gradients averaged over the processes (op by
  op). ``W = 1`` runs in this process without a process group;
* ``bbb rR``: ``R = --replicas`` independent fits of the same entry as replicas of one
  vectorised step (:class:`bnn_zoo._core.replicas.ReplicaSVIStep`), each on ``batch`` rows
  of its own copy of the data, in one process.

Samples per second are ``batch * replicas * steps / seconds`` (medians over ``--repeats``);
``ratio_to_torch`` and ``ratio_to_bbb`` divide them by those of ``torch`` and ``bbb x1``.
The floors on a GPU: ``bbb x1`` at batch 1024 at least as fast as ``torch`` (the Bayesian
step faster than the eager deterministic one), and 100 replicas at least 50 times the
throughput of ``bbb x1``. Written as ``throughput.md``, ``.csv``, ``.json`` and a bar chart
``throughput.png`` under ``--out``::

    python benchmarks/throughput.py --device cpu --processes 1 2
    python benchmarks/throughput.py --device cuda --processes 1 2   # two GPUs for W = 2
    python benchmarks/throughput.py --device cuda --processes 1 --replicas 100 --compiled
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence

import pyro
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from matplotlib.figure import Figure

from bnn_zoo import zoo
from bnn_zoo._core import distributed
from bnn_zoo._core.replicas import REPLICA_CHECK_EVERY, ReplicaSVIStep
from bnn_zoo._core.step import SVIStep
from bnn_zoo._harness import flags
from bnn_zoo._harness.figures import save_figure
from bnn_zoo._harness.tables import write_tables


def problem(n: int, in_dim: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """A synthetic regression set: ``y = sum(sin(x)) + noise``."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, in_dim, generator=g)
    y = torch.sin(x).sum(-1) + 0.1 * torch.randn(n, generator=g)
    return x.to(device), y.to(device)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_step(step: Callable[[], object], device: torch.device, steps: int, warmup: int,
              repeats: int) -> float:
    """Median seconds per call of ``step``, after ``warmup`` calls; with a process group,
    every repeat starts and ends together on all processes."""
    for _ in range(warmup):
        step()
    times = []
    for _ in range(repeats):
        if distributed.is_initialized():
            dist.barrier()
        synchronize(device)
        start = time.perf_counter()
        for _ in range(steps):
            step()
        synchronize(device)
        if distributed.is_initialized():
            dist.barrier()
        times.append((time.perf_counter() - start) / steps)
    return statistics.median(times)


def torch_step(x: torch.Tensor, y: torch.Tensor, hidden: list[int], compiled: bool = False
               ) -> Callable[[], None]:
    """A plain-PyTorch MAP step of the same MLP on the whole of ``x``; ``compiled``: its loss
    and gradient through ``torch.compile`` (``reduce-overhead``, CUDA graphs, on a GPU)."""
    widths = [x.shape[1], *hidden]
    layers: list[torch.nn.Module] = []
    for d_in, d_out in zip(widths[:-1], widths[1:]):
        layers += [torch.nn.Linear(d_in, d_out), torch.nn.ReLU()]
    net = torch.nn.Sequential(*layers, torch.nn.Linear(widths[-1], 1)).to(x.device)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)

    def loss() -> torch.Tensor:
        return 0.5 * ((net(x).squeeze(-1) - y) ** 2).sum()

    if compiled:
        loss = torch.compile(loss, mode="reduce-overhead" if x.is_cuda else "default")

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss().backward()
        opt.step()

    return step


def looped(step: SVIStep) -> Callable[[], None]:
    """``step`` as the runner's loop drives it on a device: [`advance`][] (on a GPU a replay
    of its CUDA graph), with the NaN guard's read-back every ``REPLICA_CHECK_EVERY`` steps."""

    def run() -> None:
        step.advance()
        if step.step_count % REPLICA_CHECK_EVERY == 0:
            step.check()

    return run


def bbb_step(x: torch.Tensor, y: torch.Tensor, hidden: list[int], batch: int,
             replicas: int = 1) -> SVIStep:
    """The ``bbb`` entry's model, guide, ELBO and step: data-parallel when a process group
    is initialised; with ``replicas`` > 1, that many fits at once, each on its own copy of
    ``x`` and ``y``, as ``entry.fit_many`` trains them."""
    entry = zoo.get("bbb")
    model = entry.model(x.shape[1], 1, task="regression", hidden=tuple(hidden))
    options = {"lr": 1e-3, "batch_size": batch, "elbo": entry.method.elbo,
               "jit": entry.budget.jit}
    if replicas == 1:
        model = model.to(x.device)
        return SVIStep(model, entry.guide(model), x, y,
                       distributed=distributed.is_initialized(), **options)
    model = model.replicated(replicas).to(x.device)
    return ReplicaSVIStep(model, entry.guide(model), x.expand(replicas, *x.shape),
                          y.expand(replicas, *y.shape), **options)


def worker(rank: int, world: int, port: int, args: argparse.Namespace, results) -> None:
    """One process of a ``world``-process run; rank 0 puts seconds per step on ``results``."""
    flags.set_threads(args.threads)
    cuda = args.device.type == "cuda"
    distributed.init_loopback_group(rank, world, port, "nccl" if cuda else "gloo")
    try:
        device = torch.device("cuda", rank) if cuda else args.device
        x, y = distributed.shard(*problem(args.n, args.in_dim, device))
        seconds = time_step(looped(bbb_step(x, y, args.hidden, args.batch // world)), device,
                            args.steps, args.warmup, args.repeats)
        if rank == 0:
            results.put(seconds)
    finally:
        dist.destroy_process_group()


def bbb_seconds(world: int, args: argparse.Namespace) -> float:
    """Seconds per step of ``bbb`` on ``world`` processes."""
    if world == 1:
        x, y = problem(args.n, args.in_dim, args.device)
        return time_step(looped(bbb_step(x, y, args.hidden, args.batch)), args.device,
                         args.steps, args.warmup, args.repeats)
    results = mp.get_context("spawn").SimpleQueue()
    mp.spawn(worker, args=(world, distributed.free_port(), args, results), nprocs=world, join=True)
    return results.get()


def write(rows: list[dict], args: argparse.Namespace) -> str:
    """Write the table (Markdown, CSV, JSON) and the bar chart; return the Markdown."""
    table = write_tables(args.out, "throughput", rows,
                         keys=("step", "device", "processes", "replicas", "batch"),
                         columns=("samples_per_second", "ratio_to_torch", "ratio_to_bbb",
                                  "ms_per_step"))
    fig = Figure(figsize=(5, 3), layout="constrained")
    ax = fig.add_subplot()
    ax.bar([r["step"] for r in rows], [r["samples_per_second"] for r in rows], color="C0")
    ax.set_ylabel("samples / s")
    ax.set_title(f"training throughput, batch {args.batch}, {args.device}")
    save_figure(fig, args.out / "throughput.png", dpi=120)
    return table


def main(argv: Sequence[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=flags.positive_int, nargs="+", default=[1, 2],
                        help="processes of the data-parallel rows (1 is always run)")
    parser.add_argument("--batch", type=flags.positive_int, default=1024,
                        help="global rows per step")
    parser.add_argument("--n", type=flags.positive_int, default=16384,
                        help="training rows (all processes)")
    parser.add_argument("--in-dim", type=flags.positive_int, default=16)
    parser.add_argument("--hidden", type=flags.positive_int, nargs="+", default=[50])
    parser.add_argument("--replicas", type=flags.positive_int, default=20,
                        help="fits in the replica row")
    parser.add_argument("--steps", type=flags.positive_int, default=50,
                        help="steps per timed repeat")
    parser.add_argument("--warmup", type=flags.int_at_least(0), default=10)
    parser.add_argument("--compiled", action="store_true",
                        help="also time the plain-torch step through torch.compile")
    parser.add_argument("--repeats", type=flags.positive_int, default=5)
    flags.add_shared_flags(parser, out="results/throughput", threads=1, without=("splits",))
    args = flags.parse(parser, argv)
    if args.device.type == "cuda" and max(args.processes) > torch.cuda.device_count():
        parser.error(f"argument --processes: expected at most {torch.cuda.device_count()} "
                     f"(one GPU per process), got {max(args.processes)}")
    pyro.set_rng_seed(args.seed)
    x, y = problem(args.n, args.in_dim, args.device)
    torch_seconds = time_step(torch_step(x[:args.batch], y[:args.batch], args.hidden),
                              args.device, args.steps, args.warmup, args.repeats)
    processes = sorted({1, *args.processes})  # bbb x1 is what the other rows compare with
    timings = [("torch", 1, 1, torch_seconds)]
    if args.compiled:
        timings += [("torch compiled", 1, 1, time_step(
            torch_step(x[:args.batch], y[:args.batch], args.hidden, compiled=True),
            args.device, args.steps, args.warmup, args.repeats))]
    timings += [(f"bbb x{w}", w, 1, bbb_seconds(w, args)) for w in processes]
    timings += [(f"bbb r{args.replicas}", 1, args.replicas, time_step(
        looped(bbb_step(x, y, args.hidden, args.batch, args.replicas)), args.device,
        args.steps, args.warmup, args.repeats))]
    rows = [{"step": name, "device": str(args.device), "processes": w, "replicas": r,
             "batch": args.batch, "ms_per_step": 1e3 * s,
             "samples_per_second": args.batch * r / s} for name, w, r, s in timings]
    bbb = next(row for row in rows if row["step"] == "bbb x1")
    for row in rows:
        row["ratio_to_torch"] = row["samples_per_second"] / rows[0]["samples_per_second"]
        row["ratio_to_bbb"] = row["samples_per_second"] / bbb["samples_per_second"]
    print(write(rows, args))
    return rows


if __name__ == "__main__":
    main()
