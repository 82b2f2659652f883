"""Exact Gaussian-process regression with type-II maximum likelihood, as a method.

The model (e.g. [`NNGPRegression`][bnn_zoo.models.NNGPRegression]) integrates the function
out, ``y ~ N(0, K(X, X) + sigma^2 I)``, so its only sample site is ``obs`` and SVI with
the empty guide maximises the evidence ``log p(y | X, theta)`` over the kernel's
variances and the noise, by Adam on the full data (Rasmussen & Williams 2006, 5.4).
The posterior predictive is the GP's closed form (``model.posterior``); as a Pyro pair it
is [`ConditionedGP`][], a model whose ``obs`` is that predictive's marginal at each
input, with the empty guide.

Everything runs in float64: once the learned noise is small (yacht), the float32 kernel
``K + sigma^2 I`` is no longer positive definite (factorising it alone in float64 does not
help). Predictions come back in the data's dtype. Exact GP regression costs ``O(N^3)`` per
step; above ``max_points`` training points the method raises
[`UnsupportedProblem`][bnn_zoo.methods.UnsupportedProblem].

Numerical guards: the model escalates its Cholesky jitter where ``K + sigma^2 I`` is not
numerically positive definite (the largest relative jitter used is the posterior's
diagnostic ``jitter``). Where the factorisation still fails, or the evidence or its
gradient is not finite (an extreme learning rate), the fit stops with
[`TrainingDiverged`][bnn_zoo.TrainingDiverged] naming the learning rate, the step and the
last finite hyperparameters, which the model keeps. The hyperparameters after the last
step are checked too, so a fit that returns has a finite evidence and finite predictions.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pyro
import pyro.distributions as dist
import torch
from torch import Tensor, nn

from bnn_zoo._core.checks import check_positive_int
from bnn_zoo._core.loop import run_steps
from bnn_zoo._core.predictive import GaussianMixturePredictive
from bnn_zoo._core.step import SVIStep, TrainingDiverged
from bnn_zoo._core.training import FitResult
from bnn_zoo.methods._base import Budget, Method, ModelFactory, UnsupportedProblem
from bnn_zoo.methods._state import result_from_state, result_state
from bnn_zoo.models._nngp import NotPositiveDefinite

__all__ = ["ConditionedGP", "ExactGP", "GPPosterior", "fit_evidence", "no_guide"]


def no_guide(x: Tensor, y: Tensor | None = None) -> None:
    """The empty guide: the model has no latent site."""


class ConditionedGP(nn.Module):
    """The posterior predictive of ``gp`` given its training data as a Pyro model:
    ``obs_n ~ N(mu(x_n), s^2(x_n))`` independently for each input (see
    ``gp.posterior``), in the dtype of ``x``."""

    def __init__(self, gp: nn.Module, x_train: Tensor, y_train: Tensor) -> None:
        super().__init__()
        self.gp = gp
        self.register_buffer("x_train", x_train)
        self.register_buffer("y_train", y_train)

    def predictive(self, x: Tensor) -> GaussianMixturePredictive:
        """The closed-form predictive at ``x`` (M, D): ``loc``, ``scale`` of shape (1, M)."""
        # A private parameter store: in Pyro's default mode the GP's PyroParams would
        # otherwise read values of the same names left in the global store by another fit.
        with pyro.get_param_store().scope():
            pred = self.gp.posterior(self.x_train, self.y_train, x.to(self.x_train.dtype))
        return GaussianMixturePredictive(pred.loc.to(x.dtype), pred.scale.to(x.dtype))

    def forward(self, x: Tensor, y: Tensor | None = None) -> Tensor:
        pred = self.predictive(x)
        with pyro.plate("data", x.shape[0], device=x.device):
            return pyro.sample("obs", dist.Normal(pred.loc[0], pred.scale[0]), obs=y)


def _check_final_evidence(gp: nn.Module, x: Tensor, y: Tensor) -> None:
    """The optimiser's last update is not checked by a step of its own: check it here."""
    with torch.no_grad(), pyro.get_param_store().scope():
        value = float(gp.log_evidence(x, y))
    if not math.isfinite(value):
        raise TrainingDiverged(f"The log evidence became {value}.")


def fit_evidence(gp: nn.Module, x: Tensor, y: Tensor, *, steps: int, lr: float, seed: int,
                 progress: bool | None = False, check_every: int = 1) -> FitResult:
    """Maximise ``gp``'s log evidence (its ``obs`` site; the empty guide) by full-batch Adam,
    one [`SVIStep`][bnn_zoo._core.step.SVIStep] per step, run by
    `run_steps` (``progress``: a tqdm bar; ``None``: only when
    stderr is a terminal; ``check_every``: steps between the NaN guard's read-backs).
    ``gp`` is a GP model like [`NNGPRegression`][bnn_zoo.models.NNGPRegression]:
    ``log_evidence(x, y)``, ``posterior``, ``hyperparameters()`` and ``largest_jitter``.

    Raises [`TrainingDiverged`][bnn_zoo.TrainingDiverged], naming ``lr``, the step and
    the hyperparameters, where the evidence, its gradient or the final evidence is not
    finite or ``K + sigma^2 I`` cannot be factorised (``NotPositiveDefinite`` from the
    model); ``gp`` then holds the last hyperparameters whose evidence was finite.
    """
    check_positive_int("steps", steps)
    check_positive_int("check_every", check_every)
    pyro.set_rng_seed(seed)
    step = SVIStep(gp, no_guide, x, y, lr=lr, seed=seed)
    losses: list[float] = []
    started = time.perf_counter()
    try:
        run_steps(step, steps, losses, progress=progress, check_every=check_every,
                  desc="ExactGP")
        _check_final_evidence(gp, x, y)
    except (NotPositiveDefinite, TrainingDiverged) as error:
        step.restore_parameters()
        # Pyro appends the trace's shapes to errors raised inside the model: keep line one.
        reason = str(error).splitlines()[0]
        raise TrainingDiverged(
            f"Type-II maximum likelihood diverged with lr={lr} at step {step.step_count} of "
            f"{steps}: {reason} The model keeps the last finite hyperparameters "
            f"{gp.hyperparameters()}; try a smaller lr.") from error
    return FitResult(losses=losses, seconds=time.perf_counter() - started, steps=steps,
                     parameters={f"0.{name}": p for name, p in gp.named_parameters()})


@dataclass
class GPPosterior:
    """The fitted GP conditioned on its training data."""

    model: ConditionedGP
    result: FitResult | None
    diagnostics: dict[str, float] = field(default_factory=dict)
    guide = staticmethod(no_guide)

    def predict(self, x: Tensor, num_samples: int) -> GaussianMixturePredictive:
        """The closed-form predictive (one component; ``num_samples`` is not needed)."""
        return self.model.predictive(x)

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "result": result_state(self.result)}


def check_budget(budget: Budget) -> None:
    """Refuse, by name, the fields of ``budget`` that exact GP regression cannot honour:
    the evidence needs the whole data set (``batch_size=None``) on one process
    (``distributed=False``); the model has no latent site, so nothing for particles or a KL
    weighting to act on (``num_particles=1``, ``kl_weighting="uniform"``); and its Cholesky
    jitter is chosen by data-dependent Python control flow, which a traced loss would
    freeze (``jit=False``); its few full-batch steps take a constant rate
    (``lr_schedule="constant"``). ``steps``, ``lr`` and ``check_every`` are honoured by
    [`fit_evidence`][]."""
    budget.check_supported("ExactGP", batch_size=None, distributed=False, num_particles=1,
                           kl_weighting="uniform", jit=False, lr_schedule="constant")


@dataclass(frozen=True)
class ExactGP(Method):
    """Type-II maximum likelihood of an exact GP model, in float64 (module doc)."""

    max_points: int = 3000

    def __post_init__(self) -> None:
        check_positive_int("max_points", self.max_points)

    def with_guide_options(self, options: Mapping[str, Any]) -> ExactGP:
        raise ValueError(f"ExactGP has no guide, so no guide_options: got {sorted(options)}.")

    def fit(self, build_model: ModelFactory, x: Tensor, y: Tensor, *, task: str, seed: int,
            budget: Budget, progress: bool | None) -> GPPosterior:
        if x.shape[0] > self.max_points:
            raise UnsupportedProblem(f"ExactGP is exact GP regression, O(N^3) per step: "
                                     f"{x.shape[0]} training points exceed "
                                     f"max_points={self.max_points}.")
        check_budget(budget)
        x64, y64 = x.double(), y.double()
        gp = build_model().to(dtype=torch.float64)
        result = fit_evidence(gp, x64, y64, steps=budget.steps, lr=budget.lr, seed=seed,
                              progress=progress, check_every=budget.check_interval())
        return GPPosterior(ConditionedGP(gp, x64, y64), result,
                           {"jitter": gp.largest_jitter})

    def restore(self, build_model: ModelFactory, state: dict, *, x: Tensor,
                y: Tensor) -> GPPosterior:
        """The posterior of `GPPosterior.state_dict`."""
        model_state = state["model"]
        gp = build_model().to(dtype=torch.float64)
        model = ConditionedGP(gp, model_state["x_train"], model_state["y_train"])
        model.load_state_dict(model_state)
        return GPPosterior(model, result_from_state(state["result"]))
