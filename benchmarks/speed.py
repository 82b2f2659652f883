"""Milliseconds per SVI step of the ``bbb`` entry's model and guide against plain PyTorch.

Steps of the same network, timed in the same run, interleaved, medians; every step walks
the same ``10 B`` points in minibatches of ``B`` (a fresh permutation every epoch):

* ``torch_map``: a deterministic plain-PyTorch step (Gaussian or categorical NLL scaled by
  ``N / B`` plus the ``N(0, 1)`` prior's ``|w|^2 / 2``, Adam);
* ``torch_bbb``: a hand-written Bayes-by-Backprop step (one weight sample ``w = mu +
  softplus(rho) * eps`` for the minibatch, closed-form KL, Adam) -- what the zoo's pair
  computes under :class:`~bnn_zoo._core.elbo.MeanFieldELBO`, without Pyro;
* ``torch_bbb_lrt``: the hand-written step with the local reparameterisation trick
  (Kingma et al. 2015): each layer's pre-activations drawn from their Gaussian, mean
  ``h @ M + m``, variance ``h^2 @ S^2 + s^2``, one noise draw per point and unit;
* ``zoo_bbb``: ``BayesianMLP`` + ``BayesByBackpropGuide`` through
  :class:`~bnn_zoo._core.step.SVIStep` (what ``bnn_zoo.fit`` runs) with ``MeanFieldELBO``;
* ``zoo_bbb_jit``: the same with the JIT-traced loss;
* ``zoo_bbb_lrt_jit``: the JIT-traced loss with :class:`LocalReparameterizationELBO`, as
  the ``bbb`` entry trains.

All with Pyro's validation off, as ``bnn_zoo.fit`` trains by default, and
``torch.optim.Adam(fused=True)``, as :class:`~bnn_zoo._core.step.SVIStep` steps. Ratios
to ``torch_map`` and the zoo-to-hand-written ratios of like estimators
(``zoo_lrt_jit_vs_hand``: the goal is at most 1.0) are printed and written as
``speed.md``, ``.csv``, ``.json`` and a bar chart ``speed.png`` under ``--out``, with each
step's peak memory (``<step>_mib``): after the timing, ``--inner`` more calls of each step
alone, the largest peak of a call above what was in use before it (beyond the step's
parameters and optimiser state), by :func:`~bnn_zoo._harness.memory.step_peaks` (the
process's resident set size).

With ``--runs K`` the whole measurement is repeated ``K`` times, each with its steps built
afresh: a row holds the medians over the runs, and ``<ratio>_min``/``_max`` the spread of
each zoo-to-hand ratio (one run on a noisy machine is not a figure)::

    python benchmarks/speed.py --runs 5 --out results/speed
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path

import pyro
import torch
from matplotlib.figure import Figure
from torch import Tensor
from torch.nn import functional as F

from bnn_zoo._core.elbo import LocalReparameterizationELBO, MeanFieldELBO
from bnn_zoo._core.nn import mlp_forward
from bnn_zoo._core.step import SVIStep
from bnn_zoo._harness import flags
from bnn_zoo._harness.figures import save_figure
from bnn_zoo._harness.memory import step_peaks
from bnn_zoo._harness.tables import write_tables
from bnn_zoo._harness.timing import epoch_batches, interleaved_medians
from bnn_zoo.guides import BayesByBackpropGuide
from bnn_zoo.guides._bbb import softplus_inverse
from bnn_zoo.models import BayesianMLP

STEPS = ("torch_map", "torch_bbb", "torch_bbb_lrt", "zoo_bbb", "zoo_bbb_jit", "zoo_bbb_lrt_jit")
#: zoo step -> the hand-written step with the same estimator
LIKE = {"zoo_bbb": "torch_bbb", "zoo_bbb_jit": "torch_bbb", "zoo_bbb_lrt_jit": "torch_bbb_lrt"}
RATIOS = {"zoo_vs_hand": "zoo_bbb", "zoo_jit_vs_hand": "zoo_bbb_jit",
          "zoo_lrt_jit_vs_hand": "zoo_bbb_lrt_jit"}
NETS = {"13-50-1": ([13, 50, 1], 100), "784-400-400-10": ([784, 400, 400, 10], 128)}
INIT_SCALE = 1e-2  # the bbb guide's default initial posterior scale
#: The goal: the bbb entry's step at most this multiple of the hand-written one.
FLOOR = 1.0

Forward = Callable[[Tensor, Sequence[Tensor], Sequence[Tensor]], Tensor]


def torch_params(sizes: list[int]) -> list[Tensor]:
    params = []
    for d_in, d_out in zip(sizes[:-1], sizes[1:]):
        params += [(torch.randn(d_in, d_out) / d_in**0.5).requires_grad_(),
                   torch.zeros(d_out, requires_grad=True)]
    return params


def nll(f: Tensor, y: Tensor, classification: bool) -> Tensor:
    if classification:
        return F.cross_entropy(f, y, reduction="sum")
    return 0.5 * ((f.squeeze(-1) - y) ** 2).sum()


def sample_forward(x: Tensor, locs: Sequence[Tensor], scales: Sequence[Tensor]) -> Tensor:
    """The MLP with one weight sample ``M + S * eps`` for the whole minibatch."""
    ws = [m + s * torch.randn_like(s) for m, s in zip(locs, scales)]
    return mlp_forward(x, list(zip(ws[::2], ws[1::2])))


def lrt_forward(x: Tensor, locs: Sequence[Tensor], scales: Sequence[Tensor]) -> Tensor:
    """The MLP with every layer's pre-activations drawn from their Gaussian: mean
    ``h @ M + m``, variance ``h^2 @ S^2 + s^2``, fresh noise per point and unit."""
    h, last = x, len(locs) // 2 - 1
    for i in range(last + 1):
        mean = torch.addmm(locs[2 * i + 1], h, locs[2 * i])
        var = torch.addmm(scales[2 * i + 1] ** 2, h**2, scales[2 * i] ** 2)
        h = mean + var.sqrt() * torch.randn_like(mean)
        if i < last:
            h = torch.relu(h)
    return h


def torch_map_step(sizes, x, y, batch, classification) -> Callable[[], None]:
    params = torch_params(sizes)
    opt = torch.optim.Adam(params, lr=1e-3, fused=True)
    n, next_batch = x.shape[0], epoch_batches(x.shape[0], batch)

    def step():
        opt.zero_grad(set_to_none=True)
        idx = next_batch()
        f = mlp_forward(x[idx], list(zip(params[::2], params[1::2])))
        loss = n / batch * nll(f, y[idx], classification)
        loss = loss + 0.5 * sum((p**2).sum() for p in params)
        loss.backward()
        opt.step()

    return step


def torch_bbb_step(sizes, x, y, batch, classification, forward: Forward = sample_forward
                   ) -> Callable[[], None]:
    locs = torch_params(sizes)
    rhos = [torch.full_like(p, softplus_inverse(INIT_SCALE)).requires_grad_() for p in locs]
    opt = torch.optim.Adam(locs + rhos, lr=1e-3, fused=True)
    n, next_batch = x.shape[0], epoch_batches(x.shape[0], batch)

    def step():
        opt.zero_grad(set_to_none=True)
        idx = next_batch()
        scales = [F.softplus(r) for r in rhos]
        f = forward(x[idx], locs, scales)
        # KL(N(m, s^2) || N(0, 1)) in closed form
        kl = sum((0.5 * (s**2 + m**2 - 1) - s.log()).sum() for m, s in zip(locs, scales))
        loss = n / batch * nll(f, y[idx], classification) + kl
        loss.backward()
        opt.step()

    return step


def zoo_bbb_step(sizes, x, y, batch, classification, jit=False,
                 elbo=MeanFieldELBO) -> Callable[[], None]:
    task = "classification" if classification else "regression"
    model = BayesianMLP(sizes[0], sizes[-1], sizes[1:-1], task=task, noise_scale=1.0)
    guide = BayesByBackpropGuide(model, init_scale=INIT_SCALE)
    return SVIStep(model, guide, x, y, lr=1e-3, elbo=elbo, batch_size=batch, jit=jit)


def build_steps(net: str, steps: Sequence[str] = STEPS) -> dict[str, Callable[[], object]]:
    """The named steps on the net ``net`` (a key of ``NETS``), with data of ``10 B`` random
    points; build them with Pyro's validation off (as they are timed)."""
    sizes, batch = NETS[net]
    classification = sizes[-1] > 1
    n = 10 * batch
    x = torch.randn(n, sizes[0])
    y = torch.randint(sizes[-1], (n,)) if classification else torch.randn(n)
    builders = {
        "torch_map": lambda: torch_map_step(sizes, x, y, batch, classification),
        "torch_bbb": lambda: torch_bbb_step(sizes, x, y, batch, classification),
        "torch_bbb_lrt": lambda: torch_bbb_step(sizes, x, y, batch, classification,
                                                lrt_forward),
        "zoo_bbb": lambda: zoo_bbb_step(sizes, x, y, batch, classification),
        "zoo_bbb_jit": lambda: zoo_bbb_step(sizes, x, y, batch, classification, jit=True),
        "zoo_bbb_lrt_jit": lambda: zoo_bbb_step(sizes, x, y, batch, classification, jit=True,
                                                elbo=LocalReparameterizationELBO),
    }
    return {name: builders[name]() for name in steps}


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=flags.positive_int, default=15)
    parser.add_argument("--inner", type=flags.positive_int, default=20)
    parser.add_argument("--nets", nargs="+", default=list(NETS), choices=list(NETS))
    parser.add_argument("--runs", type=flags.positive_int, default=1,
                        help="whole measurements, each with its own steps (the row: their "
                             "medians, and the spread of the ratios)")
    flags.add_shared_flags(parser, out="results/speed", threads=1,
                           without=("device", "splits"))
    args = flags.parse(parser, argv)
    pyro.set_rng_seed(args.seed)
    with pyro.validation_enabled(False):  # as bnn_zoo.fit trains by default
        rows = [summary(net, [measure(net, args) for _ in range(args.runs)])
                for net in args.nets]
    columns = [*(f"{k}_ms" for k in STEPS), *(f"{k}_per_map" for k in STEPS[1:]), *RATIOS,
               *(f"{r}_{end}" for r in RATIOS for end in ("min", "max")),
               *(f"{k}_mib" for k in STEPS)]
    preamble = (f"{args.threads} thread(s), median of {args.runs} run(s), each the median of "
                f"{args.repeats} x {args.inner} steps (ratio_min, ratio_max: the spread over "
                "the runs); "
                "zoo_vs_hand and zoo_jit_vs_hand: zoo_bbb(_jit) / torch_bbb (weight sampling); "
                "zoo_lrt_jit_vs_hand: zoo_bbb_lrt_jit / torch_bbb_lrt (local "
                f"reparameterisation; the goal: at most {FLOOR}); *_mib: peak MiB above "
                f"the step's state, largest of {args.inner} steps (resident set size)")
    print(write_tables(args.out, "speed", rows, keys=("net", "batch"), columns=columns,
                       preamble=preamble))
    plot(rows, args.out / "speed.png")
    return {"rows": rows}


def measure(net: str, args: argparse.Namespace) -> dict:
    """One measurement of the steps of ``net``, built afresh: their times, ratios and peak
    memory."""
    steps = build_steps(net)
    ms = interleaved_medians(steps, repeats=args.repeats, inner=args.inner)
    mib = step_peaks(steps, calls=args.inner)
    return {**{f"{k}_ms": v for k, v in ms.items()},
            **{f"{k}_per_map": v / ms["torch_map"] for k, v in ms.items()},
            **{ratio: ms[zoo] / ms[LIKE[zoo]] for ratio, zoo in RATIOS.items()},
            **{f"{k}_mib": v for k, v in mib.items()}}


def summary(net: str, runs: list[dict]) -> dict:
    """The row of ``net``: the median over ``runs`` of every column, and the smallest and
    largest of each zoo-to-hand ratio."""
    row = {"net": net, "batch": NETS[net][1], "runs": len(runs),
           **{key: statistics.median(run[key] for run in runs) for key in runs[0]}}
    for ratio in RATIOS:
        row[f"{ratio}_min"] = min(run[ratio] for run in runs)
        row[f"{ratio}_max"] = max(run[ratio] for run in runs)
    return row


def plot(rows: list[dict], path: Path) -> None:
    """Bar chart of each step's time as a multiple of the plain-PyTorch MAP step."""
    fig = Figure(figsize=(7, 3.5), layout="constrained")
    ax = fig.add_subplot()
    width = 0.8 / len(rows)
    for i, r in enumerate(rows):
        ax.bar([j + i * width for j in range(len(STEPS))],
               [r[f"{k}_per_map"] for k in STEPS], width, label=r["net"])
    ax.set_xticks([j + width * (len(rows) - 1) / 2 for j in range(len(STEPS))], STEPS,
                  rotation=20)
    ax.set_ylabel("time per step / plain-PyTorch MAP step")
    ax.axhline(1.0, color="k", lw=0.5)
    ax.legend()
    save_figure(fig, path, dpi=120)


if __name__ == "__main__":
    main()
