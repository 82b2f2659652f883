"""How long the chains must be for the reference's gate: the largest rank-normalised split
R-hat over many test points (``bnn_zoo.methods._nuts.rank_r_hat``) of chains that have
converged, AR(1) chains started in their stationary law, so that any R-hat above 1 is
chance alone.

For each (chains, draws per chain, bulk ESS per draw) and ``--repeats`` independent sets of
chains at ``--points`` test points (51, boston's test set): the median over the repeats of
the largest R-hat and of the smallest bulk ESS, and the share of repeats whose largest
R-hat exceeds the gate's 1.01 (``bnn_zoo.methods.ConvergenceGate``). An AR(1) chain of
coefficient ``rho`` has ESS per draw ``(1 - rho) / (1 + rho)``; 1/8 is what `hmc` reaches
over boston's test predictive.

    python benchmarks/gate_floor.py --out results/gate_floor
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence

import torch

from bnn_zoo._harness import flags
from bnn_zoo._harness.tables import write_tables
from bnn_zoo.methods import ConvergenceGate
from bnn_zoo.methods._nuts import bulk_ess, rank_r_hat

COLUMNS = ("r_hat_max", "ess_min", "fails_gate")


def stationary_chains(chains: int, draws: int, points: int, ess_per_draw: float,
                      generator: torch.Generator) -> torch.Tensor:
    """AR(1) chains (chains, draws, points) of unit variance started in their stationary
    law, with coefficient ``rho = (1 - e) / (1 + e)`` for ESS per draw ``e``."""
    rho = (1 - ess_per_draw) / (1 + ess_per_draw)
    noise = torch.randn(chains, draws, points, generator=generator, dtype=torch.float64)
    x = torch.empty_like(noise)
    x[:, 0] = noise[:, 0]
    for t in range(1, draws):
        x[:, t] = rho * x[:, t - 1] + math.sqrt(1 - rho ** 2) * noise[:, t]
    return x


def main(argv: Sequence[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    flags.add_shared_flags(parser, out="results/gate_floor",
                           without=("splits", "device", "retain_freed_memory"))
    parser.add_argument("--chains", type=flags.positive_int, nargs="+", default=[4, 8, 16],
                        help="chain counts (default: 4 8 16)")
    parser.add_argument("--draws", type=flags.positive_int, nargs="+",
                        default=[500, 1000, 2000, 4000],
                        help="draws per chain (default: 500 1000 2000 4000)")
    parser.add_argument("--ess-per-draw", type=float, nargs="+", default=[0.125, 0.25],
                        help="bulk ESS per draw of the chains (default: 0.125 0.25)")
    parser.add_argument("--points", type=flags.positive_int, default=51,
                        help="test points (default: 51, boston's)")
    parser.add_argument("--repeats", type=flags.positive_int, default=20,
                        help="independent sets of chains (default: 20)")
    args = flags.parse(parser, argv)
    generator = torch.Generator().manual_seed(args.seed)
    threshold = ConvergenceGate().r_hat
    rows = []
    for chains in args.chains:
        for draws in args.draws:
            for ess_per_draw in args.ess_per_draw:
                r_hat, ess = [], []
                for _ in range(args.repeats):
                    x = stationary_chains(chains, draws, args.points, ess_per_draw, generator)
                    r_hat.append(float(rank_r_hat(x).max()))
                    ess.append(float(bulk_ess(x).min()))
                rows.append({"chains": chains, "draws": draws, "ess_per_draw": ess_per_draw,
                             "r_hat_max": float(torch.tensor(r_hat).median()),
                             "ess_min": float(torch.tensor(ess).median()),
                             "fails_gate": sum(r > threshold for r in r_hat) / len(r_hat)})
    print(write_tables(args.out, "gate_floor", rows,
                       keys=("chains", "draws", "ess_per_draw"), columns=COLUMNS))
    return rows


if __name__ == "__main__":
    main()
