"""Wall time of R fits of an entry as replicas in one pass against one fit, in one run.

The ``bbb`` entry (13-50-1 net, its own budget but ``--steps`` steps) on a synthetic
regression set of boston's size (455 training points, 13 inputs): one ``entry.fit``, then
``entry.fit_many`` of ``--replicas`` R sets of the same size, each timed end to end
(standardisation, building, JIT tracing, training), after a warm-up, alternated
``--repeats`` times; medians. Beside the times, the peak memory of each (``one_fit_mib``,
``replicas_mib``: the largest over the repeats of the peak above what was in use before the
fit, by :class:`~bnn_zoo._harness.memory.PeakMemory`: the resident set size on the CPU, the
CUDA allocator's count on a GPU). The goal: 20 replicas cost at most 3x one fit
(``ratio`` <= 3), i.e. a replica costs at most 3/20 of a fit done alone.

What the hardware allows: ``hand_step_ratio`` is the time of one step of a hand-written
plain-torch Bayes-by-Backprop step with the local reparameterisation trick (batched
matrix products over R replicas, closed-form KL, fused Adam) for R replicas over the same
step for one (interleaved medians of ``--repeats`` x 50 steps, same minibatch size): a
lower bound, up to the zoo's overhead, on what R replicas of a fit can cost against one.

Each run measures one setting, ``--threads`` and the allocator (the shared flag
``--retain-freed-memory``: glibc keeps freed memory for reuse,
:func:`~bnn_zoo._harness.memory.retain_freed_memory`), and writes its row into the table of
``--out``, keeping the rows of other settings:

    python benchmarks/replicas.py --out results/replicas --threads 1
    python benchmarks/replicas.py --out results/replicas --threads 2 --retain-freed-memory
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence

import pyro
import torch

from bnn_zoo import zoo
from bnn_zoo._harness import flags
from bnn_zoo._harness.memory import PeakMemory
from bnn_zoo._harness.provenance import provenance, run_columns, versions
from bnn_zoo._harness.tables import merge_summary, write_tables
from bnn_zoo._harness.timing import interleaved_medians

#: The goal: R = 20 replicas of ``bbb`` in at most this many one-fit times.
FLOOR = 3.0
#: What identifies a row: the entry, the problem and the setting it was measured in.
KEYS = ("entry", "replicas", "steps", "threads", "allocator")


def data(replicas: int, n: int, d: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """R regression sets (R, n, d), (R, n): a random 1-hidden-layer function plus noise."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(replicas, n, d, generator=g)
    w = torch.randn(replicas, d, 1, generator=g)
    y = torch.tanh(x @ w).squeeze(-1) + 0.1 * torch.randn(replicas, n, generator=g)
    return x, y


def hand_lrt_step(replicas: int, d: int, hidden: int, batch: int, device: torch.device
                  ) -> Callable[[], None]:
    """One plain-torch BBB step with local reparameterisation on R replicas of a
    d-``hidden``-1 net: pre-activations ``N(h M + m, h^2 S^2 + s^2)`` by batched matrix
    products, the Gaussian NLL with a learned noise scale per replica, the closed-form KL
    to N(0, 1), fused Adam; a fresh random minibatch of ``batch`` points per replica."""
    shapes = [(replicas, d, hidden), (replicas, 1, hidden), (replicas, hidden, 1),
              (replicas, 1, 1)]
    locs = [(0.1 * torch.randn(s, device=device)).requires_grad_() for s in shapes]
    # softplus(-4.6) = 0.01, the bbb guide's initial scale
    rhos = [torch.full(s, -4.6, device=device).requires_grad_() for s in shapes]
    log_noise = torch.zeros(replicas, 1, device=device, requires_grad=True)
    opt = torch.optim.Adam([*locs, *rhos, log_noise], lr=1e-3, fused=True)
    x = torch.randn(replicas, 10 * batch, d, device=device)
    y = torch.randn(replicas, 10 * batch, device=device)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        idx = torch.randint(x.shape[1], (batch,), device=device)
        scales = [torch.nn.functional.softplus(r) for r in rhos]
        h = x[:, idx]
        for i in (0, 2):
            mean = torch.baddbmm(locs[i + 1], h, locs[i])
            var = torch.baddbmm(scales[i + 1] ** 2, h * h, scales[i] ** 2)
            h = mean + var.sqrt() * torch.randn_like(mean)
            h = torch.relu(h) if i == 0 else h.squeeze(-1)
        nll = (0.5 * ((h - y[:, idx]) / log_noise.exp()) ** 2 + log_noise).sum()
        kl = sum((0.5 * (s**2 + m**2 - 1) - s.log()).sum() for m, s in zip(locs, scales))
        (10 * nll + kl).backward()
        opt.step()

    return step


def hand_step_ratio(replicas: int, d: int, batch: int, repeats: int,
                    device: torch.device) -> float:
    """Median time of :func:`hand_lrt_step` on ``replicas`` replicas over that on one."""
    steps = {"one": hand_lrt_step(1, d, 50, batch, device),
             "many": hand_lrt_step(replicas, d, 50, batch, device)}
    ms = interleaved_medians(steps, repeats=repeats, inner=50, device=device)
    return ms["many"] / ms["one"]


def main(argv: Sequence[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entry", type=flags.entry_name, default="bbb")
    parser.add_argument("--replicas", type=flags.positive_int, default=20)
    parser.add_argument("--steps", type=flags.positive_int, default=4000,
                        help="training steps of every fit (default: 4000, bbb's budget)")
    parser.add_argument("--repeats", type=flags.positive_int, default=3)
    parser.add_argument("--points", type=flags.positive_int, default=455)
    parser.add_argument("--inputs", type=flags.positive_int, default=13)
    flags.add_shared_flags(parser, out="results/replicas", threads=1, without=("splits",))
    args = flags.parse(parser, argv)
    entry = zoo.get(args.entry)
    x, y = data(args.replicas, args.points, args.inputs, args.seed)
    x, y = x.to(args.device), y.to(args.device)
    seeds = [args.seed + r for r in range(args.replicas)]
    options = {"steps": args.steps, "progress": False}
    entry.fit(x[0], y[0], steps=2, progress=False)  # warm-up: first-call imports and caches
    entry.fit_many(x[:2], y[:2], seeds=seeds[:2], steps=2, progress=False)
    one, many, one_mib, many_mib = [], [], [], []
    for _ in range(args.repeats):
        pyro.set_rng_seed(args.seed)
        with PeakMemory(x.device) as peak:  # its reset and read stay outside the clock
            started = time.perf_counter()
            entry.fit(x[0], y[0], seed=args.seed, **options)
            one.append(time.perf_counter() - started)
        one_mib.append(peak.mib)
        with PeakMemory(x.device) as peak:
            started = time.perf_counter()
            entry.fit_many(x, y, seeds=seeds, **options)
            many.append(time.perf_counter() - started)
        many_mib.append(peak.mib)
    one_s, many_s = statistics.median(one), statistics.median(many)
    process = provenance()  # this run's: its row's code, and the file's torch, date, threads
    row = {"entry": args.entry, "replicas": args.replicas, "steps": args.steps,
           "threads": torch.get_num_threads(),
           "allocator": "retained" if args.retain_freed_memory else "default",
           "batched": zoo.batches_replicas(entry), "one_fit_s": one_s, "replicas_s": many_s,
           "ratio": many_s / one_s, "floor": FLOOR,
           "speedup_vs_one_by_one": args.replicas * one_s / many_s,
           "hand_step_ratio": hand_step_ratio(args.replicas, args.inputs,
                                              min(entry.budget.batch_size or args.points,
                                                  args.points), args.repeats, x.device),
           "one_fit_mib": max(one_mib), "replicas_mib": max(many_mib),
           "device": str(x.device), **run_columns({"provenance": process})}
    rows = merge_summary(args.out, "replicas", [row], keys=KEYS)
    print(write_tables(args.out, "replicas", rows, keys=KEYS,
                       columns=("batched", "one_fit_s", "replicas_s", "ratio", "floor",
                                "speedup_vs_one_by_one", "hand_step_ratio", "one_fit_mib",
                                "replicas_mib",
                                "device"), provenance={**versions(rows), "process": process}))
    return [row]


if __name__ == "__main__":
    main()
