"""Mixture-of-diagonal-Gaussians guide by gradient estimator and number of components.

For each target (``two_component``, ``banana``, ``ring``: KL to the normalised target,
``KL = log Z - ELBO``; ``bnn``: the weight posterior of a 1-10-1 tanh net on 100 points
of ``sine``, ELBO only) and each estimator (``score``, ``score_baseline``,
``pathwise``, ``enumerate``) and ``K``: the final KL or ELBO (Monte Carlo, with its
standard error), the effective number of components ``exp(H(pi))``, and the wall time.
Then, at one common state per target (the ``enumerate`` fit with the largest ``K >= 2``),
the variance of each estimator's gradient per particle (summed over parameters). A
figure shows the fitted densities over the 2-D targets. Writes ``mixture.md``,
``.csv``, ``.json`` (a row per target, estimator and K), ``mixture_by_estimator.*`` (the
same, a row per target and K with the estimators side by side: the KL, or the ELBO for
``bnn``), ``mixture_grad_variance.*`` (a row per target, estimators side by side) and
``mixture.png`` under ``--out``.

    python benchmarks/mixture.py --out results/mixture
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path

import pyro
import torch
from matplotlib.figure import Figure

from bnn_zoo import data, fit
from bnn_zoo._core.elbo import MixtureELBO, elbo_estimate
from bnn_zoo._core.step import TrainingDiverged
from bnn_zoo._harness import flags
from bnn_zoo._harness.figures import save_figure
from bnn_zoo._harness.tables import write_tables
from bnn_zoo.guides._mixture import MixtureGuide
from bnn_zoo.models._targets import TARGETS, UnnormalisedModel, bnn_posterior, target

ESTIMATORS = {"score": ("score", False), "score_baseline": ("score", True),
              "pathwise": ("pathwise", False), "enumerate": ("enumerate", False)}
NO_DATA = (torch.zeros(1, 1), torch.zeros(1))


def make_target(name: str) -> UnnormalisedModel:
    if name == "bnn":
        sine = data.load("sine")
        return bnn_posterior(sine.x_train[:100], sine.y_train[:100], hidden=(10,))
    return target(name)


def make_guide(model: UnnormalisedModel, estimator: str, k: int, bnn: bool) -> MixtureGuide:
    kind, baseline = ESTIMATORS[estimator]
    return MixtureGuide(model, k, estimator=kind, baseline=baseline,
                        init_scale=0.02 if bnn else 0.3, init_spread=0.5 if bnn else 1.0)


def own_parameters():
    """A private parameter store, as :func:`bnn_zoo.fit` trains in, for calling a guide: in
    Pyro's global mode a called ``PyroModule`` takes whatever tensor the global store holds
    under its parameter's name in place of its own, so after one ``MixtureGuide`` every later
    one (another estimator or K) would be scored with, and overwritten by, the first one's
    parameters. (Its methods called directly, such as ``mixture()``, read its own.)"""
    return pyro.get_param_store().scope()


def gradient_variance(model, state: dict, estimator: str, k: int, bnn: bool, particles: int,
                      repeats: int) -> float:
    """Trace of the covariance of a one-particle gradient of -ELBO at ``state``."""
    guide = make_guide(model, estimator, k, bnn)
    elbo = MixtureELBO(num_particles=particles, max_plate_nesting=1)
    draws = []
    with own_parameters():
        guide(*NO_DATA)
        guide.load_state_dict(state)
        params = [p for _, p in sorted(guide.named_parameters())]
        for _ in range(repeats):
            loss = elbo.differentiable_loss(model, guide, *NO_DATA)
            draws.append(torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params)]))
    return particles * torch.stack(draws).var(0).sum().item()


def by_estimator(rows: list[dict], value: str, keys: Sequence[str] = ("target", "K")
                 ) -> list[dict]:
    """One row per distinct ``keys`` with the ``value`` of each estimator side by side."""
    table: dict[tuple, dict] = {}
    for row in rows:
        side_by_side = table.setdefault(tuple(row[k] for k in keys), {k: row[k] for k in keys})
        side_by_side[row["estimator"]] = row[value]
    return list(table.values())


def plot(guides: dict, names: list[str], estimators: list[str], k: int, path: Path) -> None:
    grid = torch.linspace(-4.5, 4.5, 181)
    t1, t2 = torch.meshgrid(grid, grid, indexing="xy")
    theta = torch.stack([t1, t2], -1)
    fig = Figure(figsize=(2.6 * (len(estimators) + 1), 2.6 * len(names)), layout="constrained")
    axes = fig.subplots(len(names), len(estimators) + 1, squeeze=False)
    for row, name in zip(axes, names):
        model = guides[(name, estimators[0], k)][0]
        p = torch.exp(model.log_density(theta) - model.log_normalizer)
        row[0].contourf(t1, t2, p, levels=20, cmap="Greys")
        row[0].set_title(f"{name}: target", fontsize=8)
        for ax, est in zip(row[1:], estimators):
            guide = guides[(name, est, k)][1]
            with torch.no_grad():
                q = torch.exp(guide.mixture().log_prob(theta))
            ax.contourf(t1, t2, q, levels=20, cmap="Blues")
            ax.contour(t1, t2, p, levels=5, colors="k", linewidths=0.4)
            ax.set_title(f"{est}, K={k}", fontsize=8)
        for ax in row:
            ax.set_xticks([])
            ax.set_yticks([])
    save_figure(fig, path)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", nargs="+", default=[*TARGETS, "bnn"],
                        choices=[*TARGETS, "bnn"])
    parser.add_argument("--estimators", nargs="+", default=list(ESTIMATORS),
                        choices=list(ESTIMATORS))
    parser.add_argument("--components", nargs="+", type=flags.positive_int, default=[1, 2, 5, 10])
    parser.add_argument("--steps", type=flags.positive_int, default=1500)
    parser.add_argument("--lr", type=flags.positive_float, default=0.03)
    parser.add_argument("--particles", type=flags.positive_int, default=8)
    parser.add_argument("--eval-particles", type=flags.positive_int, default=16384)
    parser.add_argument("--grad-repeats", type=flags.positive_int, default=100)
    parser.add_argument("--grad-particles", type=flags.positive_int, default=16)
    flags.add_shared_flags(parser, out="results/mixture", threads=1,
                           without=("device", "splits"))
    return flags.parse(parser, argv)


def fit_one(name: str, est: str, k: int, args: argparse.Namespace) -> tuple[dict, tuple]:
    """One mixture fit of ``k`` components with estimator ``est`` on target ``name``: its
    row (KL or ELBO, effective components, time, status) and its (model, guide)."""
    pyro.set_rng_seed(args.seed)
    model = make_target(name)
    guide = make_guide(model, est, k, name == "bnn")
    started, status = time.perf_counter(), "ok"
    try:
        fit(model, guide, *NO_DATA, steps=args.steps, lr=args.lr,
            num_particles=args.particles, elbo=MixtureELBO, seed=args.seed)
    except TrainingDiverged:
        status = "diverged"
    seconds = time.perf_counter() - started
    elbo, se = elbo_estimate(model, guide, *NO_DATA, particles=args.eval_particles)
    kl = None if model.log_normalizer is None else model.log_normalizer - elbo
    row = {"target": name, "estimator": est, "K": k, "elbo": elbo, "elbo_se": se, "kl": kl,
           "effective_components": guide.effective_components(), "seconds": seconds,
           "status": status}
    return row, (model, guide)


def write_results(args: argparse.Namespace, rows: list[dict], variance_rows: list[dict]) -> None:
    preamble = (f"Steps {args.steps}, lr {args.lr}, {args.particles} particles; KL = log Z - "
                f"ELBO ({args.eval_particles} particles; ELBO only for bnn); "
                "effective_components = exp(H(pi)).")
    print(write_tables(args.out, "mixture", rows, keys=("target", "estimator", "K"),
                       columns=("kl", "elbo", "effective_components", "seconds", "status"),
                       preamble=preamble))
    scores = [dict(r, measure="ELBO" if r["kl"] is None else "KL",
                   score=r["elbo"] if r["kl"] is None else r["kl"]) for r in rows]
    print(write_tables(args.out, "mixture_by_estimator",
                       by_estimator(scores, "score", ("target", "measure", "K")),
                       keys=("target", "measure", "K"), columns=tuple(args.estimators),
                       preamble=preamble))
    if variance_rows:
        print(write_tables(args.out, "mixture_grad_variance",
                           by_estimator(variance_rows, "grad_variance"),
                           keys=("target", "K"), columns=tuple(args.estimators),
                           preamble="Gradient variance per particle (trace of the covariance, "
                                    "at the enumerate fit)."))


def main(argv: Sequence[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    rows, guides, variance_rows = [], {}, []
    for name in args.targets:
        for est in args.estimators:
            for k in args.components:
                row, guides[(name, est, k)] = fit_one(name, est, k, args)
                rows.append(row)
                print(row, flush=True)
        multi = [k for k in args.components if k >= 2]
        if "enumerate" in args.estimators and multi:
            model, reference = guides[(name, "enumerate", max(multi))]
            state = {key: v.detach().clone() for key, v in reference.state_dict().items()}
            for est in args.estimators:
                var = gradient_variance(model, state, est, max(multi), name == "bnn",
                                        args.grad_particles, args.grad_repeats)
                variance_rows.append({"target": name, "estimator": est, "K": max(multi),
                                      "grad_variance": var})
    write_results(args, rows, variance_rows)
    two_d = [n for n in args.targets if n != "bnn"]
    if two_d:
        plot(guides, two_d, args.estimators, max(args.components), args.out / "mixture.png")
    return rows

if __name__ == "__main__":
    main()
