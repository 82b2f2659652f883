"""The ``priors`` subcommand: the Gaussian limit of the output as the width grows and the
tail parameter of the units against depth (the second half of Arbel's lecture notes
"Bayesian NN under a Laplace approximation" (2021)).

    python -m bnn_zoo priors --widths 1 10 100 1000 --depth 3 --width 2 --out results/priors
    python -m bnn_zoo priors --nngp-depth 3      # the width sweep with 3 hidden layers

prints two Markdown tables and writes ``priors.md``, ``priors.json``, a CSV per table,
``output_vs_gaussian.png`` and ``tail_parameters.png`` into ``--out``
(`bnn_zoo._harness.tables.write_table_group`); it takes the shared flags
``--out``, ``--threads``, ``--device`` and ``--seed``. The nets are the
zoo's MLP (entry ``bbb``'s model factory) with the fan-in Gaussian prior whose
infinite-width limit is the kernel of entry ``nngp`` with every variance 1; the width
sweep (``--nngp-depth`` hidden layers of each width) samples their outputs layer by
layer (`fan_in_prior_outputs`), so wide deep
nets cost ``O(S N H)`` per layer. With more than one hidden layer the covariance is
exact only in the limit: its error falls as ``1/H``.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence

import pyro
import torch
from torch import Tensor

from bnn_zoo import zoo
from bnn_zoo._core.checks import check_positive_int
from bnn_zoo._core.nn import ACTIVATIONS
from bnn_zoo._harness import flags
from bnn_zoo._harness.outputs import check_writable
from bnn_zoo._harness.prior_diagnostics import excess_kurtosis, fan_in_prior_outputs, tail_table
from bnn_zoo._harness.prior_figures import plot_output_vs_gaussian, plot_tail_parameters
from bnn_zoo._harness.tables import Table, write_table_group
from bnn_zoo.models._priors import GaussianPrior

__all__ = ["add_parser", "fan_in_net", "run", "width_sweep"]


CHUNK = 2000
#: What ``run`` writes under ``--out``.
OUTPUT_FILES = ("priors.md", "priors.json", "priors_width_sweep.csv", "priors_tails.csv",
                "output_vs_gaussian.png", "tail_parameters.png")


def fan_in_net(in_dim: int, hidden: Sequence[int], activation: str, like: Tensor):
    """The zoo MLP with prior N(0, 1/d_in) on weight matrices and N(0, 1) on biases."""
    net = zoo.get("bbb").model(in_dim, 1, hidden=tuple(hidden), activation=activation,
                               prior=GaussianPrior(1.0, fan_in=True), noise_scale=1.0)
    return net.to(device=like.device, dtype=like.dtype)


def _ks_to_gaussian(values: Tensor, variance: Tensor) -> float:
    """Kolmogorov-Smirnov distance between the samples and ``N(0, variance)``."""
    v, _ = values.sort()
    n = v.shape[0]
    cdf = 0.5 * (1 + torch.erf(v / (2 * variance).sqrt()))
    ranks = torch.arange(1, n + 1, dtype=v.dtype, device=v.device)
    return float(torch.maximum(ranks / n - cdf, cdf - (ranks - 1) / n).max())


def width_sweep(widths: Sequence[int], x: Tensor, num_samples: int, activation: str = "relu",
                depth: int = 1) -> tuple[list[dict[str, float]], dict[int, Tensor]]:
    """For each width ``H``: prior samples of ``f(x)`` of the net with ``depth`` hidden
    layers of width ``H`` at the inputs ``x`` (N, D), and per ``H`` the largest error of
    the empirical covariance against the NNGP kernel in Monte Carlo standard errors, the
    variance at ``x[0]`` against ``K(x_0, x_0)``, the excess kurtosis and the KS distance
    to the GP marginal. Returns the rows and the samples at ``x[0]`` per width."""
    kernel = zoo.get("nngp").model(x.shape[1], 1, activation=activation, depth=depth).kernel
    kernel = kernel.to(device=x.device, dtype=x.dtype)
    with torch.no_grad():
        k = kernel(x)
    rows, samples = [], {}
    for width in widths:
        check_positive_int("width", width)
        # Chunks of at most CHUNK samples keep the (S, N, H) hidden units small.
        f = torch.cat([fan_in_prior_outputs(x, width, depth, activation,
                                            min(CHUNK, num_samples - start))
                       for start in range(0, num_samples, CHUNK)])  # (S, N)
        products = f.unsqueeze(-1) * f.unsqueeze(-2)
        stderr = products.std(0) / math.sqrt(num_samples)
        rows.append({
            "width": width,
            "cov_error_in_se": float(((products.mean(0) - k).abs() / stderr).max()),
            "variance": float(f[:, 0].var()),
            "kernel_variance": float(k[0, 0]),
            "excess_kurtosis": float(excess_kurtosis(f[:, 0])),
            "ks_to_gaussian": _ks_to_gaussian(f[:, 0], k[0, 0]),
        })
        samples[width] = f[:, 0]
    return rows, samples


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``priors`` subcommand to the CLI's subparsers."""
    parser = subparsers.add_parser("priors", help="prior diagnostics: Gaussian limit and "
                                   "sub-Weibull tails of the units", description=__doc__)
    parser.add_argument("--widths", type=flags.positive_int, nargs="+",
                        default=[1, 10, 100, 1000],
                        help="hidden widths H of the one-hidden-layer sweep")
    parser.add_argument("--nngp-depth", type=flags.positive_int, default=1,
                        help="hidden layers of the width sweep's nets and their NNGP kernel")
    parser.add_argument("--depth", type=flags.int_at_least(2), default=3,
                        help="layers L of the tail study (one hidden layer at least)")
    parser.add_argument("--width", type=flags.positive_int, default=2,
                        help="hidden width of the tail study")
    parser.add_argument("--samples", type=flags.int_at_least(2), default=20000,
                        help="prior samples")
    parser.add_argument("--activation", default="relu", choices=sorted(ACTIVATIONS))
    flags.add_shared_flags(parser, out="results/priors", without=("splits",))
    parser.set_defaults(run=run)
    return parser


def run(args: argparse.Namespace) -> dict:
    """Compute both tables, print them, and write tables and figures into ``args.out``
    (``args`` parsed and applied by `bnn_zoo._harness.flags.parse`)."""
    check_positive_int("depth", args.depth)
    check_positive_int("nngp_depth", args.nngp_depth)
    if args.depth < 2:
        raise ValueError(f"Expected depth >= 2 (one hidden layer at least), got {args.depth}.")
    check_writable("--out", args.out, files=OUTPUT_FILES)
    pyro.set_rng_seed(args.seed)
    x = torch.tensor([[1.0]], dtype=torch.float64, device=args.device)
    sweep, samples = width_sweep(args.widths, x, args.samples, args.activation,
                                 args.nngp_depth)
    net = fan_in_net(1, [args.width] * (args.depth - 1), args.activation, x)
    tails = tail_table(net, x, args.samples)
    print(write_table_group(args.out, "priors", [
        Table("width_sweep", f"Gaussian limit of f(x=1), {args.nngp_depth} hidden "
              f"{args.activation} layer(s)",
              sweep, keys=("width",), columns=[k for k in sweep[0] if k != "width"]),
        Table("tails", f"Tail parameter theta of the units, hidden width {args.width}", tails,
              keys=("layer",), columns=[k for k in tails[0] if k != "layer"]),
    ]))
    plot_output_vs_gaussian(samples, sweep[0]["kernel_variance"],
                            args.out / "output_vs_gaussian.png")
    plot_tail_parameters(tails, args.out / "tail_parameters.png")
    return {"width_sweep": sweep, "tails": tails}
