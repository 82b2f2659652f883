"""Milliseconds per SVI step of the ``bbb`` entry's model and guide against plain PyTorch.

Three steps of the same network, timed in the same run, interleaved, medians:

* ``torch_map``: a deterministic plain-PyTorch step (MSE-style Gaussian NLL, Adam);
* ``torch_bbb``: a hand-written Bayes-by-Backprop step (reparameterised diagonal
  Gaussian, closed-form KL, Adam) -- what the zoo's pair computes, without Pyro;
* ``zoo_bbb``: ``BayesianMLP`` + ``BayesByBackpropGuide`` through the loss that
  ``bnn_zoo.fit`` uses, one fused Adam.

* ``zoo_bbb_jit``: the same with the JIT-traced loss;
* ``zoo_bbb_lrt_jit``: the JIT-traced loss with the local reparameterisation trick,
  as the ``bbb`` entry trains.

Ratios to ``torch_map`` and to the hand-written step are printed and written as
``speed.md``, ``.csv``, ``.json`` and a bar chart ``speed.png`` under ``--out``.

    python benchmarks/speed.py --out results/speed
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path

import pyro
import torch
from matplotlib.figure import Figure

from bnn_zoo.core.elbo import LocalReparameterizationELBO, MeanFieldELBO
from bnn_zoo.core.nn import mlp_forward
from bnn_zoo.core.training import SVIStep
from bnn_zoo.guides import BayesByBackpropGuide
from bnn_zoo.harness import flags
from bnn_zoo.harness.figures import save_figure
from bnn_zoo.harness.tables import write_tables
from bnn_zoo.harness.timing import interleaved_medians
from bnn_zoo.models import BayesianMLP

STEPS = ("torch_map", "torch_bbb", "zoo_bbb", "zoo_bbb_jit", "zoo_bbb_lrt_jit")
NETS = {"13-50-1": ([13, 50, 1], 100), "784-400-400-10": ([784, 400, 400, 10], 128)}


def torch_params(sizes: list[int]) -> list[torch.Tensor]:
    params = []
    for d_in, d_out in zip(sizes[:-1], sizes[1:]):
        params += [(torch.randn(d_in, d_out) / d_in**0.5).requires_grad_(),
                   torch.zeros(d_out, requires_grad=True)]
    return params


def nll(f: torch.Tensor, y: torch.Tensor, classification: bool) -> torch.Tensor:
    if classification:
        return torch.nn.functional.cross_entropy(f, y, reduction="sum")
    return 0.5 * ((f.squeeze(-1) - y) ** 2).sum()


def torch_map_step(sizes, x, y, n, classification) -> Callable[[], None]:
    params = torch_params(sizes)
    opt = torch.optim.Adam(params, lr=1e-3)

    def step():
        opt.zero_grad()
        f = mlp_forward(x, list(zip(params[::2], params[1::2])))
        loss = n / x.shape[0] * nll(f, y, classification)
        loss = loss + 0.5 * sum((p**2).sum() for p in params)
        loss.backward()
        opt.step()

    return step


def torch_bbb_step(sizes, x, y, n, classification) -> Callable[[], None]:
    locs = torch_params(sizes)
    rhos = [torch.full_like(p, -4.6).requires_grad_() for p in locs]
    opt = torch.optim.Adam(locs + rhos, lr=1e-3)

    def step():
        opt.zero_grad()
        sigmas = [torch.nn.functional.softplus(r) for r in rhos]
        ws = [m + s * torch.randn_like(s) for m, s in zip(locs, sigmas)]
        f = mlp_forward(x, list(zip(ws[::2], ws[1::2])))
        kl = sum((0.5 * (s**2 + m**2 - 1) - torch.log(s)).sum() for m, s in zip(locs, sigmas))
        loss = n / x.shape[0] * nll(f, y, classification) + kl
        loss.backward()
        opt.step()

    return step


def zoo_bbb_step(sizes, x, y, n, classification, jit=False,
                 elbo=MeanFieldELBO) -> Callable[[], None]:
    task = "classification" if classification else "regression"
    model = BayesianMLP(sizes[0], sizes[-1], sizes[1:-1], task=task, noise_scale=1.0)
    guide = BayesByBackpropGuide(model)
    return SVIStep(model, guide, x, y, lr=1e-3, elbo=elbo,
                   batch_size=n // 10, jit=jit)


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=flags.positive_int, default=15)
    parser.add_argument("--inner", type=flags.positive_int, default=20)
    parser.add_argument("--nets", nargs="+", default=list(NETS), choices=list(NETS))
    flags.add_shared_flags(parser, out="results/speed", threads=1,
                           without=("device", "splits"))
    args = flags.parse(parser, argv)
    pyro.set_rng_seed(args.seed)
    rows = []
    for net in args.nets:
        sizes, batch = NETS[net]
        classification = sizes[-1] > 1
        n = 10 * batch
        x = torch.randn(n, sizes[0])
        y = torch.randint(sizes[-1], (n,)) if classification else torch.randn(n)
        xb, yb = x[:batch], y[:batch]
        steps = {
            "torch_map": torch_map_step(sizes, xb, yb, n, classification),
            "torch_bbb": torch_bbb_step(sizes, xb, yb, n, classification),
            "zoo_bbb": zoo_bbb_step(sizes, x, y, n, classification),
            "zoo_bbb_jit": zoo_bbb_step(sizes, x, y, n, classification, jit=True),
            "zoo_bbb_lrt_jit": zoo_bbb_step(sizes, x, y, n, classification, jit=True,
                                            elbo=LocalReparameterizationELBO),
        }
        ms = interleaved_medians(steps, repeats=args.repeats, inner=args.inner)
        rows.append({"net": net, "batch": batch, **{f"{k}_ms": v for k, v in ms.items()},
                     **{f"{k}_per_map": v / ms["torch_map"] for k, v in ms.items()},
                     "zoo_vs_hand": ms["zoo_bbb"] / ms["torch_bbb"],
                     "zoo_jit_vs_hand": ms["zoo_bbb_jit"] / ms["torch_bbb"],
                     "zoo_lrt_jit_vs_hand": ms["zoo_bbb_lrt_jit"] / ms["torch_bbb"]})
    columns = [*(f"{k}_ms" for k in STEPS), *(f"{k}_per_map" for k in STEPS[1:]),
               "zoo_vs_hand", "zoo_jit_vs_hand", "zoo_lrt_jit_vs_hand"]
    print(write_tables(args.out, "speed", rows, keys=("net", "batch"), columns=columns))
    plot(rows, args.out / "speed.png")
    return {"rows": rows}


def plot(rows: list[dict], path: Path) -> None:
    """Bar chart of each step's time as a multiple of the plain-PyTorch MAP step."""
    fig = Figure(figsize=(6, 3.5), layout="constrained")
    ax = fig.add_subplot()
    width = 0.8 / len(rows)
    for i, r in enumerate(rows):
        ax.bar([j + i * width for j in range(len(STEPS))],
               [r[f"{k}_per_map"] for k in STEPS], width, label=r["net"])
    ax.set_xticks([j + width * (len(rows) - 1) / 2 for j in range(len(STEPS))], STEPS)
    ax.set_ylabel("time per step / plain-PyTorch MAP step")
    ax.axhline(1.0, color="k", lw=0.5)
    ax.legend()
    save_figure(fig, path, dpi=120)


if __name__ == "__main__":
    main()
