"""Seed 000's three objectives for the ``rff_logitnormal`` entry, compared on UCI sets.

For every data set, split and objective (``alg3``, ``alg1``, ``collapsed``): test
log-likelihood per point and RMSE (original units), fit time, and, at the fitted
parameters, the variance of the objective's estimate (negative ELBO, nats) and of
its gradient (summed over the guide's parameters) over repeated evaluations.
``alg1`` is evaluated with a fresh ``beta`` per evaluation, i.e. the variance of
one outer iteration's estimate. Writes ``rff.md``, ``rff.csv`` and ``rff.png``.

    BNN_ZOO_DATA=../shared/data/uci python benchmarks/rff.py --out results/rff
    python benchmarks/rff.py --datasets sine --splits 1 --steps 20   # a few seconds
"""

from __future__ import annotations

import argparse
import csv
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pyro  # noqa: E402
import torch  # noqa: E402

from bnn_zoo import data, zoo  # noqa: E402
from bnn_zoo.zoo.rff import OBJECTIVES, objective_elbo  # noqa: E402

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
    for _ in range(repeats):
        loss = elbo.differentiable_loss(fitted.model, fitted.guide, xs, ys)
        grads.append(torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params)]))
        losses.append(loss.detach())
    return float(torch.stack(losses).var()), float(torch.stack(grads).var(0).sum())


def run(dataset: str, split: int, objective: str, args) -> dict:
    d = data.load(dataset, split)
    fitted = zoo.get("rff_logitnormal").fit(
        d.x_train, d.y_train, objective=objective, seed=split, steps=args.steps,
        num_features=args.num_features, num_particles=args.num_particles)
    out = fitted.evaluate(d.x_test, d.y_test, num_samples=args.num_samples)
    elbo_var, grad_var = estimator_variance(fitted, d.x_train, d.y_train, objective,
                                            args.num_particles, args.variance_samples)
    return {"dataset": dataset, "objective": objective, "split": split,
            **{k: out[k] for k in METRICS[:3]}, "elbo_var": elbo_var, "grad_var": grad_var}


def summarise(rows: list[dict]) -> str:
    lines = ["| data | objective | test LL | RMSE | fit s | ELBO var | grad var |",
             "|---|---|---|---|---|---|---|"]
    for dataset in dict.fromkeys(r["dataset"] for r in rows):
        for objective in dict.fromkeys(r["objective"] for r in rows):
            group = [r for r in rows if r["dataset"] == dataset and r["objective"] == objective]
            cells = []
            for key in METRICS:
                values = [r[key] for r in group]
                se = statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else 0.0
                cells.append(f"{statistics.mean(values):.3g} ± {se:.2g}")
            lines.append(f"| {dataset} | {objective} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    fig, axes = plt.subplots(1, len(datasets), figsize=(4 * len(datasets), 3), squeeze=False)
    for ax, dataset in zip(axes[0], datasets):
        for i, objective in enumerate(OBJECTIVES):
            values = [r["ll"] for r in rows if r["dataset"] == dataset
                      and r["objective"] == objective]
            ax.scatter([i] * len(values), values, label=objective)
        ax.set_xticks(range(len(OBJECTIVES)), OBJECTIVES)
        ax.set_title(dataset)
        ax.set_ylabel("test log-likelihood per point")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="+", default=["uci/concrete", "uci/yacht"])
    parser.add_argument("--splits", type=int, default=5)
    parser.add_argument("--objectives", nargs="+", default=list(OBJECTIVES), choices=OBJECTIVES)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--num-features", type=int, default=100)
    parser.add_argument("--num-particles", type=int, default=4)
    parser.add_argument("--num-samples", type=int, default=200)
    parser.add_argument("--variance-samples", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("results/rff"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    pyro.set_rng_seed(0)
    rows = []
    for dataset in args.datasets:
        for split in range(args.splits):
            for objective in args.objectives:
                rows.append(run(dataset, split, objective, args))
                print({k: v if isinstance(v, str) else round(v, 4) for k, v in rows[-1].items()},
                      flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "rff.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    table = summarise(rows)
    (args.out / "rff.md").write_text(table + "\n")
    plot(rows, args.out / "rff.png")
    print(table)
    return rows


if __name__ == "__main__":
    main()
