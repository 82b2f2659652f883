"""The zoo's ``laplace`` pipeline against a plain-torch MAP followed by laplace-torch.

On each split of ``--data`` (default ``uci/yacht``), in one process, the order of the
three rotated from split to split:

* **zoo**: ``zoo.get("laplace").fit``: the MAP by SVI (its budget: 2000 Adam steps, lr
  1e-2, minibatches of 256, traced), full-batch L-BFGS refits, the full GGN, ``alpha``
  and ``beta`` by MacKay's evidence fixed point (Bishop 2006, section 5.7);
* **zoo_posthoc**: the same with ``method_options={"refine": False}``: ``alpha`` and
  ``beta`` tuned at the SVI MAP and its curvature, no refits, the post-hoc recipe
  laplace-torch follows;
* **laplace-torch**: the same network (D-50-1 ReLU, standardised data) trained by a
  hand-written torch loop on the same MAP objective (Gaussian likelihood with a learned
  noise scale, N(0, 1) prior; the same steps, learning rate and minibatches), then
  ``laplace.Laplace(net, "regression", subset_of_weights="all",
  hessian_structure="full")``, ``fit`` on the training set and the prior precision and
  noise scale tuned on its log marginal likelihood by Adam (``--marglik-steps`` steps, lr
  0.1, the recipe of laplace-torch's README), GLM predictive.

Each side is timed end to end (training, curvature, tuning; not the prediction), and
scored on the test split: log-likelihood per point, RMSE and 90% coverage in the data's
units. ``ratio`` is zoo time over laplace-torch time, ``ratio_posthoc`` zoo_posthoc's
(medians over splits; scores are means); the goal is ``ratio <= 1`` on yacht.
``*_map_s`` are the MAP phases alone (the zoo's SVI steps, the plain-torch loop) and
``ratio_map`` their ratio (the goal: the MAP phase at the speed of a plain-torch MAP).
laplace-torch (``pip install laplace-torch``) is not a dependency of bnn-zoo: the script
says so and stops when it is missing.

    BNN_ZOO_DATA=../shared/data/uci python benchmarks/laplace_torch.py \\
        --out benchmarks/results/laplace_torch
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Sequence

import pyro
import torch
from torch import Tensor, nn

from bnn_zoo import data, zoo
from bnn_zoo._core.predictive import GaussianMixturePredictive
from bnn_zoo._core.scaling import Standardizer
from bnn_zoo._harness import flags
from bnn_zoo._harness.tables import write_tables
from bnn_zoo._harness.timing import epoch_batches
from bnn_zoo.evaluation._metrics import regression_metrics

#: The MAP budget of the zoo's `laplace` entry, which both pipelines train with.
BUDGET = zoo.get("laplace").budget

#: The goal: the zoo's pipeline no slower than MAP + laplace-torch (``ratio`` at most this).
FLOOR = 1.0
SCORES = ("ll", "rmse", "coverage_90")


def import_laplace_torch():
    """laplace-torch's ``Laplace``, or a clear ``SystemExit`` when it is not installed."""
    try:
        from laplace import Laplace
    except ImportError as error:
        raise SystemExit("benchmarks/laplace_torch.py needs laplace-torch, which bnn-zoo does "
                         f"not depend on: pip install laplace-torch ({error}).") from error
    return Laplace


def scores(pred: GaussianMixturePredictive, y: Tensor) -> dict[str, float]:
    """Test log-likelihood per point, RMSE and 90% coverage, as the zoo scores every fit."""
    return {k: v for k, v in regression_metrics(pred, y).items() if k in SCORES}


def torch_map(x: Tensor, y: Tensor, *, hidden: int, steps: int, lr: float, batch: int,
              seed: int) -> tuple[nn.Module, Tensor]:
    """A D-``hidden``-1 ReLU net and its noise scale at the MAP of
    ``sum_n log N(y_n; f(x_n), sigma^2) + log N(theta; 0, I)``, by Adam on minibatches
    (the likelihood scaled by N / batch), in plain torch."""
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(x.shape[1], hidden), nn.ReLU(), nn.Linear(hidden, 1))
    log_sigma = torch.tensor(math.log(0.5), requires_grad=True)
    params = [*net.parameters(), log_sigma]
    opt = torch.optim.Adam(params, lr=lr, fused=True)  # as the zoo's step and speed.py's
    n, batch = x.shape[0], min(batch, x.shape[0])
    next_batch = epoch_batches(n, batch, seed=seed)
    for _ in range(steps):
        idx = next_batch()
        f = net(x[idx]).squeeze(-1)
        nll = -torch.distributions.Normal(f, log_sigma.exp()).log_prob(y[idx]).sum()
        prior = 0.5 * sum(p.pow(2).sum() for p in net.parameters())
        loss = n / idx.numel() * nll + prior
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return net, log_sigma.detach().exp()


def laplace_torch_fit(Laplace, x: Tensor, y: Tensor, *, seed: int, steps: int,
                      marglik_steps: int):
    """MAP in plain torch, then laplace-torch's full GGN Laplace with its prior precision
    and noise scale tuned on the log marginal likelihood; also the MAP's seconds."""
    started = time.perf_counter()
    net, sigma = torch_map(x, y, hidden=50, steps=steps, lr=BUDGET.lr,
                           batch=BUDGET.batch_size, seed=seed)
    map_seconds = time.perf_counter() - started
    la = Laplace(net, "regression", subset_of_weights="all", hessian_structure="full",
                 sigma_noise=float(sigma), prior_precision=1.0)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y[:, None]),
                                         batch_size=x.shape[0])
    la.fit(loader)
    log_prior = torch.zeros(1, requires_grad=True)
    log_sigma = sigma.log().reshape(1).clone().requires_grad_(True)
    opt = torch.optim.Adam([log_prior, log_sigma], lr=0.1)
    for _ in range(marglik_steps):
        opt.zero_grad()
        (-la.log_marginal_likelihood(log_prior.exp(), log_sigma.exp())).backward()
        opt.step()
    return la, map_seconds


def laplace_torch_predict(la, x: Tensor) -> tuple[Tensor, Tensor]:
    """The GLM predictive's mean and standard deviation (noise included) at ``x``."""
    f_mu, f_var = la(x, pred_type="glm")
    return f_mu.squeeze(-1), (f_var.reshape(-1) + la.sigma_noise.detach() ** 2).sqrt()


def run_split(Laplace, name: str, split: int, *, seed: int, steps: int, marglik_steps: int
              ) -> dict:
    """The three pipelines on one split (their order rotated by the split): times, scores
    and the ratios."""
    d = data.load(name, split)
    x_scaler, y_scaler = Standardizer.fit(d.x_train), Standardizer.fit(d.y_train)
    xs, ys = x_scaler.transform(d.x_train), y_scaler.transform(d.y_train)
    row = {"data": name, "split": split}

    def zoo_side(key: str, method_options: dict) -> None:
        pyro.set_rng_seed(seed)
        started = time.perf_counter()
        fitted = zoo.get("laplace").fit(d.x_train, d.y_train, seed=seed, steps=steps,
                                        method_options=method_options, progress=False)
        row[f"{key}_s"] = time.perf_counter() - started
        row[f"{key}_map_s"] = fitted.result.seconds
        row.update({f"{key}_{k}": v for k, v in scores(fitted.predict(d.x_test),
                                                      d.y_test).items()})

    def laplace_torch_side() -> None:
        started = time.perf_counter()
        la, row["laplace_torch_map_s"] = laplace_torch_fit(
            Laplace, xs, ys, seed=seed, steps=steps, marglik_steps=marglik_steps)
        row["laplace_torch_s"] = time.perf_counter() - started
        with torch.no_grad():
            loc, scale = laplace_torch_predict(la, x_scaler.transform(d.x_test))
        pred = GaussianMixturePredictive(y_scaler.inverse(loc)[None], scale[None] * y_scaler.std)
        row.update({f"laplace_torch_{k}": v for k, v in scores(pred, d.y_test).items()})

    sides = [lambda: zoo_side("zoo", {}), lambda: zoo_side("zoo_posthoc", {"refine": False}),
             laplace_torch_side]
    for side in sides[split % 3:] + sides[:split % 3]:
        side()
    row["ratio"] = row["zoo_s"] / row["laplace_torch_s"]
    row["ratio_posthoc"] = row["zoo_posthoc_s"] / row["laplace_torch_s"]
    row["ratio_map"] = row["zoo_map_s"] / row["laplace_torch_map_s"]
    return row


def summary_of(runs: list[dict]) -> dict:
    """Medians of the times and of the ratio, means of the scores, over the splits."""
    row = {"data": runs[0]["data"], "splits": len(runs), "floor": FLOOR}
    for key in runs[0]:
        if key in ("data", "split"):
            continue
        values = [r[key] for r in runs]
        median = key.endswith("_s") or key.startswith("ratio")
        row[key] = statistics.median(values) if median else statistics.fmean(values)
    return row


def main(argv: Sequence[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    flags.add_data_flag(parser, ["uci/yacht"])
    parser.add_argument("--steps", type=flags.positive_int, default=BUDGET.steps,
                        help=f"MAP steps of both (default: {BUDGET.steps}, the laplace "
                             "entry's budget)")
    parser.add_argument("--marglik-steps", type=flags.positive_int, default=100,
                        help="Adam steps on laplace-torch's log marginal likelihood "
                             "(default: 100, its README's)")
    flags.add_shared_flags(parser, out="results/laplace_torch", threads=1, splits=5,
                           without=("device",))
    args = flags.parse(parser, argv)
    Laplace = import_laplace_torch()
    zoo.get("laplace").fit(torch.randn(20, 2), torch.randn(20), steps=2, progress=False)
    runs, summary = [], []
    for name in args.data:
        splits = range(min(args.splits, data.num_splits(name)))
        done = [run_split(Laplace, name, k, seed=args.seed + k, steps=args.steps,
                          marglik_steps=args.marglik_steps)
                for k in splits]
        runs += done
        summary.append(summary_of(done))
    columns = [k for k in summary[0] if k not in ("data",)]
    print(write_tables(args.out, "laplace_torch", summary, keys=("data",), columns=columns,
                       runs=runs))
    return summary


if __name__ == "__main__":
    main()
