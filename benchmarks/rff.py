"""The four objectives of the ``rff_logitnormal`` entry, compared on UCI sets.

For every data set, split and objective (after Coker's notes "LogitNormal model": ``alg3``,
``alg3_literal``, ``alg1``, ``collapsed``): test log-likelihood per point and RMSE (original
units), fit time, and, at the fitted parameters, the variance of the objective's estimate
(negative ELBO, nats) and of its gradient (summed over the guide's parameters) over repeated
evaluations. ``alg1`` is evaluated with a fresh ``beta`` per evaluation, i.e. the variance
of one outer iteration's estimate. Writes ``rff.md``, ``.csv``, ``.json`` (mean ± standard
error over splits) and ``rff.png``.

    BNN_ZOO_DATA=../shared/data/uci python benchmarks/rff.py --out results/rff
    python benchmarks/rff.py --datasets sine --splits 1 --steps 20   # a few seconds
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import pyro
import torch
from matplotlib.figure import Figure

from bnn_zoo import data, zoo
from bnn_zoo._harness import flags
from bnn_zoo._harness.compare import split_indices
from bnn_zoo._harness.figures import save_figure
from bnn_zoo._harness.summary import aggregate
from bnn_zoo._harness.tables import run_line, write_tables
from bnn_zoo.methods._logitnormal import OBJECTIVES, objective_elbo

METRICS = ("ll", "rmse", "fit_seconds", "elbo_var", "grad_var")


def estimator_variance(fitted, x, y, objective: str, num_particles: int,
                       repeats: int) -> tuple[float, float]:
    """Variance of the loss and total variance of its gradient over ``repeats`` draws."""
    xs, ys = fitted.x_scaler.transform(x), fitted.y_scaler.transform(y)
    elbo = objective_elbo(objective, inner_steps=1)(num_particles=num_particles,
                                                    vectorize_particles=num_particles > 1,
                                                    max_plate_nesting=1)
    params = list(fitted.guide.parameters())
    losses, grads = [], []
    # A private param-store scope, as bnn_zoo.fit uses: in Pyro's global mode the guide's
    # PyroParams would otherwise resolve to an earlier fit's parameters of the same names.
    with pyro.get_param_store().scope():
        for _ in range(repeats):
            loss = elbo.differentiable_loss(fitted.model, fitted.guide, xs, ys)
            grads.append(torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params)]))
            losses.append(loss.detach())
    return float(torch.stack(losses).var()), float(torch.stack(grads).var(0).sum())


def run(dataset: str, split: int, objective: str, args: argparse.Namespace) -> dict:
    d = data.load(dataset, split).to(args.device)
    fitted = zoo.get("rff_logitnormal").fit(
        d.x_train, d.y_train, seed=args.seed + split, steps=args.steps,
        num_particles=args.num_particles, model_options={"num_features": args.num_features},
        method_options={"objective": objective})
    out = fitted.evaluate(d.x_test, d.y_test, num_samples=args.num_samples)
    elbo_var, grad_var = estimator_variance(fitted, d.x_train, d.y_train, objective,
                                            args.num_particles, args.variance_samples)
    return {"data": dataset, "objective": objective, "split": split,
            **{k: out[k] for k in METRICS[:3]}, "elbo_var": elbo_var, "grad_var": grad_var}


def plot(rows: list[dict], path: Path) -> None:
    datasets = list(dict.fromkeys(r["data"] for r in rows))
    fig = Figure(figsize=(4 * len(datasets), 3), layout="constrained")
    axes = fig.subplots(1, len(datasets), squeeze=False)[0]
    for ax, dataset in zip(axes, datasets):
        for i, objective in enumerate(OBJECTIVES):
            values = [r["ll"] for r in rows if r["data"] == dataset
                      and r["objective"] == objective]
            ax.scatter([i] * len(values), values, label=objective)
        ax.set_xticks(range(len(OBJECTIVES)), OBJECTIVES)
        ax.set_title(dataset)
        ax.set_ylabel("test log-likelihood per point")
    save_figure(fig, path, dpi=120)


def main(argv: Sequence[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    flags.add_data_flag(parser, ("uci/concrete", "uci/yacht"))
    parser.add_argument("--objectives", nargs="+", default=list(OBJECTIVES), choices=OBJECTIVES)
    flags.add_fit_flags(parser, steps=1000)
    parser.add_argument("--num-features", type=flags.positive_int, default=100)
    parser.add_argument("--num-particles", type=flags.positive_int, default=4)
    parser.add_argument("--variance-samples", type=flags.positive_int, default=20)
    flags.add_shared_flags(parser, out="results/rff", threads=1, splits=5)
    args = flags.parse(parser, argv)
    pyro.set_rng_seed(args.seed)
    rows = []
    for dataset in args.data:
        for split in split_indices(dataset, args.splits):
            for objective in args.objectives:
                rows.append(run(dataset, split, objective, args))
                print(run_line(rows[-1]), flush=True)
    summary = aggregate(rows, ("data", "objective"), ignore=("split",))
    print(write_tables(args.out, "rff", summary, keys=("data", "objective"), columns=METRICS,
                       runs=rows))
    plot(rows, args.out / "rff.png")
    return rows


if __name__ == "__main__":
    main()
