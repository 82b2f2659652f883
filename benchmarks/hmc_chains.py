"""What many HMC chains cost against one: the ``hmc`` reference's potential and gradient
for C chains in one vectorised pass (``bnn_zoo.methods._hmc.ChainPotential``), against one
chain, in one run, compiled by ``torch.compile`` (``jit=True``, the entry's) and not.

The problem is boston's size (455 training points, 13 inputs, the 13-50-1 network of the
UCI protocol under the fan-in prior, noise 0.2), synthetic. For each ``--chains`` C and
``potential`` (``compiled``, or ``eager``: Pyro's trace and autograd at every call): the
median milliseconds of one evaluation of ``U`` and ``grad U`` for all C chains
(interleaved rounds, ``bnn_zoo._harness.timing.interleaved_medians``), ``ratio``, that
time over one chain's with the same potential, and ``speedup``, the eager time over the
compiled one. A ratio far below C is what lets a GPU run 64 chains for little more than
one; on a CPU, whose cores the arithmetic of one chain already keeps busy once the
overhead of the small operations is compiled away, it grows with C.

    python benchmarks/hmc_chains.py --device cuda --out results/hmc_chains"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import torch

from bnn_zoo._harness import flags
from bnn_zoo._harness.tables import write_tables
from bnn_zoo._harness.timing import interleaved_medians
from bnn_zoo.methods._hmc import ChainPotential
from bnn_zoo.zoo._defaults import fan_in_mlp

COLUMNS = ("ms", "ratio", "per_chain_ms", "speedup")
POTENTIALS = {"compiled": True, "eager": False}


def problem(n: int, d: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """A regression set of ``n`` points in ``d`` inputs: a random tanh function plus noise."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, d, generator=g)
    y = torch.tanh(x @ torch.randn(d, generator=g)) + 0.2 * torch.randn(n, generator=g)
    return x.to(device), y.to(device)


def main(argv: Sequence[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    flags.add_shared_flags(parser, out="results/hmc_chains",
                           without=("seed", "splits", "retain_freed_memory"))
    parser.add_argument("--chains", type=flags.positive_int, nargs="+", default=[1, 8, 64, 512],
                        help="the chain counts to time (default: 1 8 64 512; 1 always runs)")
    parser.add_argument("--points", type=flags.positive_int, default=455,
                        help="training points (default: 455, boston's)")
    parser.add_argument("--repeats", type=flags.positive_int, default=7,
                        help="interleaved rounds (default: 7)")
    parser.add_argument("--inner", type=flags.positive_int, default=20,
                        help="evaluations per round (default: 20)")
    args = flags.parse(parser, argv)
    device = args.device
    x, y = problem(args.points, 13, device)
    model = fan_in_mlp(13, 1, noise_scale=0.2).to(device)
    counts = sorted(set([1, *args.chains]))
    calls = {}
    for chains in counts:
        potentials = {name: ChainPotential(model, x, y, chains, jit=jit)
                      for name, jit in POTENTIALS.items()}
        theta = 0.1 * torch.randn(chains, potentials["eager"].dim, device=device)
        for name, potential in potentials.items():
            calls[f"{name} {chains}"] = lambda potential=potential, theta=theta: potential(theta)
    ms = interleaved_medians(calls, repeats=args.repeats, inner=args.inner, device=device)
    rows = []
    for chains in counts:
        for name in POTENTIALS:
            t = ms[f"{name} {chains}"]
            rows.append({"device": device.type, "potential": name, "chains": chains, "ms": t,
                         "ratio": t / ms[f"{name} 1"], "per_chain_ms": t / chains,
                         "speedup": ms[f"eager {chains}"] / ms[f"compiled {chains}"]})
    print(write_tables(args.out, "hmc_chains", rows, keys=("device", "potential", "chains"),
                       columns=COLUMNS))
    return rows


if __name__ == "__main__":
    main()
