"""Zoo entries and fitted results (the contract of DESIGN.md)."""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace

import pyro
import torch
from torch import Tensor

from bnn_zoo.core import distributed
from bnn_zoo.core.checks import check_data, check_device, check_positive_int
from bnn_zoo.core.predictive import CategoricalPredictive, GaussianMixturePredictive, predict
from bnn_zoo.core.scaling import Standardizer
from bnn_zoo.core.training import FitResult, fit
from bnn_zoo.evaluation.metrics import metrics
from bnn_zoo.evaluation.noise_tuning import holdout, validated_noise_scale, with_noise_scale
from bnn_zoo.methods.base import Budget

Predictive = GaussianMixturePredictive | CategoricalPredictive


class UnsupportedProblem(ValueError):
    """An entry cannot handle this problem (task, data size, ...); benchmarks and the
    CLI skip it and report the message as the reason."""


@dataclass
class Fitted:
    """A fitted entry, working in the caller's units.

    ``predict(x)`` standardises ``x`` with the training statistics, predicts, and
    maps regression predictives back to the units of ``y``; ``x`` must be on the
    device the entry was fitted on.
    """

    entry: str
    task: str
    model: Callable
    guide: Callable | None
    x_scaler: Standardizer
    y_scaler: Standardizer | None
    fit_seconds: float
    result: FitResult | None = None
    predict_standardized: Callable[[Tensor, int], Predictive] | None = field(default=None,
                                                                           repr=False)
    diagnostics: dict[str, float] = field(default_factory=dict)

    def predict(self, x: Tensor, num_samples: int = 200) -> Predictive:
        """Posterior predictive at ``x`` (N, D) in original units."""
        x, _ = check_data(x)
        check_device("x", x.device, expected=self.x_scaler.mean.device)
        check_positive_int("num_samples", num_samples)
        if x.shape[1] != self.x_scaler.mean.shape[0]:
            raise ValueError(
                f"Expected x with {self.x_scaler.mean.shape[0]} columns, got {x.shape[1]}."
            )
        pred = self.predict_in_fit_units(self.x_scaler.transform(x), num_samples)
        if self.y_scaler is not None:
            pred = pred.affine(self.y_scaler.mean, self.y_scaler.std)
        return pred

    def predict_in_fit_units(self, z: Tensor, num_samples: int) -> Predictive:
        """Posterior predictive at standardised inputs ``z``, in standardised units."""
        if self.predict_standardized is not None:
            return self.predict_standardized(z, num_samples)
        return predict(self.model, self.guide, z, num_samples=num_samples)

    def evaluate(self, x: Tensor, y: Tensor, num_samples: int = 200) -> dict[str, float]:
        """Test metrics in original units (see :mod:`bnn_zoo.evaluation.metrics`) plus ``fit_seconds``."""
        x, y = check_data(x, y)
        out = metrics(self.predict(x, num_samples), y)
        out["fit_seconds"] = self.fit_seconds
        if self.result is not None:
            out["steps_per_second"] = self.result.steps_per_second
        return out


def split_options(kwargs: dict, *targets: Callable) -> list[dict]:
    """Route each keyword to the first of ``targets`` whose signature accepts it."""
    accepted = [set(inspect.signature(t).parameters) for t in targets]
    routed: list[dict] = [{} for _ in targets]
    for key, value in kwargs.items():
        for names, out in zip(accepted, routed):
            if key in names:
                out[key] = value
                break
        else:
            every = sorted(set().union(*accepted) - {"self", "model", "in_dim", "out_dim", "task"})
            raise ValueError(f"Unknown option {key!r}; expected one of: {', '.join(every)}.")
    return routed


@dataclass(frozen=True)
class Entry:
    """A registered model/guide pair.

    ``model(in_dim, out_dim, *, task, **hyper)`` builds the Pyro model,
    ``guide(model, **options)`` its guide, ``elbo`` the ELBO class, and
    ``fit`` runs the whole method on data in the caller's units. An entry whose
    method is not plain SVI (Laplace, NUTS, ensembles) passes its own ``fitter``
    with the signature of :func:`svi_fitter`. ``tunable_noise`` marks an entry whose
    regression predictive is a mixture ``1/S sum_s N(f_s(x), sigma^2)`` with one
    learned ``sigma``, which ``Budget.validation`` may replace by a held-out optimum
    (not so where the predictive variance has an epistemic part in closed form, as in
    Laplace's GLM predictive or a GP).
    """

    name: str
    description: str
    tasks: tuple[str, ...]
    model: Callable[..., Callable]
    guide: Callable[..., Callable] | None
    seed: str | None = None
    budget: Budget = Budget()
    elbo: type[pyro.infer.ELBO] = pyro.infer.Trace_ELBO
    fitter: Callable[..., Fitted] | None = None
    tunable_noise: bool = False

    def fit(self, x: Tensor, y: Tensor, *, task: str | None = None, seed: int = 0,
            progress: bool | None = False, **overrides) -> Fitted:
        """Standardise with the training statistics, build model and guide, and fit.

        ``overrides`` may change any :class:`Budget` field (``steps``, ``lr``, ...),
        any hyperparameter of the model factory (``hidden``, ``prior``, ...) and any
        option of the guide factory. Everything runs on the device and in the dtype
        of ``x``. With ``distributed=True`` (see :mod:`bnn_zoo.core.distributed`) ``x`` and
        ``y`` are this process's shard, and the standardisation statistics and the
        number of classes are those of all the shards together.
        """
        x, y = check_data(x, y)
        task = task or ("classification" if not y.is_floating_point() else "regression")
        if task not in self.tasks:
            raise UnsupportedProblem(
                f"Entry {self.name!r} supports {', '.join(self.tasks)}, not {task!r}.")
        if task == "regression" and (y.dim() != 1 or not y.is_floating_point()):
            raise ValueError(f"Expected y to be a float vector (N,) for regression, got "
                             f"{y.dtype} of shape {tuple(y.shape)}.")
        if task == "classification" and (y.dim() != 1 or y.is_floating_point() or y.min() < 0):
            raise ValueError("Expected y to be integer class labels 0..C-1 of shape (N,) for "
                             "classification.")
        budget_keys = {f.name for f in fields(Budget)}
        budget = replace(self.budget, **{k: v for k, v in overrides.items() if k in budget_keys})
        rest = {k: v for k, v in overrides.items() if k not in budget_keys}
        fitter = self.fitter or svi_fitter
        if budget.distributed and fitter is not svi_fitter:
            raise ValueError(f"Entry {self.name!r} has its own fitter, which does not train "
                             "data-parallel; distributed=True needs an SVI entry.")
        fit_scaler = distributed.fit_standardizer if budget.distributed else Standardizer.fit
        x_scaler = fit_scaler(x)
        y_scaler = fit_scaler(y) if task == "regression" else None
        xs = x_scaler.transform(x)
        ys = y_scaler.transform(y) if y_scaler is not None else y
        validate_noise = budget.validation > 0 and task == "regression"
        if validate_noise:
            if not self.tunable_noise:
                raise ValueError(f"Entry {self.name!r} has no single noise scale to tune: "
                                 "expected validation=0.")
            xs, ys, x_val, y_val = holdout(xs, ys, budget.validation, seed=seed)
        out_dim = 1 if task == "regression" else int(y.max()) + 1
        if budget.distributed and task == "classification":
            out_dim = distributed.global_max(out_dim, y.device)
        pyro.set_rng_seed(seed)
        started = time.perf_counter()
        fitted = fitter(self, xs, ys, task=task, out_dim=out_dim, seed=seed, budget=budget,
                        progress=progress, options=rest)
        if validate_noise:
            fitted = with_validated_noise(fitted, x_val, y_val, distributed=budget.distributed)
        return replace(fitted, entry=self.name, task=task, x_scaler=x_scaler, y_scaler=y_scaler,
                       fit_seconds=time.perf_counter() - started)


def with_validated_noise(fitted: Fitted, x_val: Tensor, y_val: Tensor, *,
                         num_samples: int = 200, distributed: bool = False) -> Fitted:
    """``fitted`` with its predictive noise scale tuned on held-out standardised data (with
    ``distributed=True``, on the held-out rows of every process's shard together)."""
    sigma = validated_noise_scale(fitted.predict_in_fit_units(x_val, num_samples).loc, y_val,
                                  distributed=distributed)

    def predict_standardized(z: Tensor, n: int) -> Predictive:
        return with_noise_scale(fitted.predict_in_fit_units(z, n), sigma)

    return replace(fitted, predict_standardized=predict_standardized,
                   diagnostics={**fitted.diagnostics, "validated_noise_scale": sigma})


def svi_fitter(entry: Entry, x: Tensor, y: Tensor, *, task: str, out_dim: int, seed: int,
               budget: Budget, progress: bool | None, options: dict) -> Fitted:
    """Build the entry's model and guide on the device and in the dtype of ``x`` and
    fit them by SVI."""
    model_kw, guide_kw = split_options(options, entry.model, entry.guide)
    model = entry.model(x.shape[1], out_dim, task=task, **model_kw)
    if isinstance(model, torch.nn.Module):
        model = model.to(device=x.device, dtype=x.dtype)
    guide = entry.guide(model, **guide_kw)
    if isinstance(guide, torch.nn.Module):
        guide = guide.to(device=x.device, dtype=x.dtype)
    result = fit(model, guide, x, y, steps=budget.steps, lr=budget.lr,
                 batch_size=budget.batch_size, num_particles=budget.num_particles,
                 kl_weighting=budget.kl_weighting, elbo=entry.elbo, seed=seed,
                 progress=progress, jit=budget.jit, distributed=budget.distributed)
    placeholder = Standardizer.identity(x)
    return Fitted(entry.name, task, model, guide, placeholder, None, result.seconds, result)
