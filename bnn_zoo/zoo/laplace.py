"""Zoo entries of the Laplace approximation (seed 001, first half; Bishop, PRML 5.7).

Each entry finds the MAP by SVI (a :class:`~bnn_zoo.guides.laplace.LaplaceGuide` as
point mass, refined by full-batch L-BFGS), then builds the Gaussian around it:

* ``laplace``: GGN curvature, GLM predictive, ``alpha`` and ``beta`` tuned by MacKay's
  evidence fixed point (the best of the variants in ``benchmarks/laplace.py``);
* ``laplace_full``, ``laplace_ggn``, ``laplace_diag``, ``laplace_kron``,
  ``laplace_last_layer``: one curvature each, GLM predictive, ``alpha`` from the
  prior and ``beta`` from the MAP's learned noise (no evidence tuning). The exact
  Hessian of ``laplace_full`` is projected onto the PSD cone (``indefinite="clip"``).

The options of :func:`~bnn_zoo.guides.laplace.fit_laplace` are the fields of
:class:`LaplaceFit`, passed as ``entry.fit(..., method_options={"evidence":
"fixed_point", "predictive": "mc"})``. (A stand-in for ``bnn_zoo.methods.laplace``;
saving a Laplace fit is not supported yet.)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from bnn_zoo.core.checks import check_choice
from bnn_zoo.core.predictive import predict
from bnn_zoo.core.training import FitResult
from bnn_zoo.guides.laplace import PREDICTIVES, LaplaceGuide, LaplacePosterior, fit_laplace
from bnn_zoo.methods.base import Budget, ModelFactory, Predictive
from bnn_zoo.zoo import Entry, register
from bnn_zoo.zoo.bbb import mlp

BUDGET = Budget(steps=2000, lr=1e-2, batch_size=256, jit=True)


@dataclass
class LaplaceFitPosterior:
    """The Laplace posterior; ``predictive="glm"`` predicts with the linearised network."""

    model: Callable
    guide: LaplaceGuide
    laplace: LaplacePosterior
    result: FitResult
    predictive: str
    diagnostics: dict[str, float] = field(default_factory=dict)

    def predict(self, x: Tensor, num_samples: int) -> Predictive:
        if self.predictive == "glm":
            return self.laplace.glm_predictive(x)
        return predict(self.model, self.guide, x, num_samples=num_samples)

    def state_dict(self) -> dict:
        raise NotImplementedError("Saving a Laplace fit is not supported yet.")


@dataclass(frozen=True)
class LaplaceFit:
    """MAP then the Laplace approximation by :func:`fit_laplace` (fields: its options)."""

    curvature: str = "ggn"
    evidence: str | None = None
    predictive: str = "glm"
    indefinite: str = "raise"
    per_layer_alpha: bool = False
    refine: bool = True
    iterations: int = 30
    bias_scale: float = 1.0

    def __post_init__(self) -> None:
        check_choice("predictive", self.predictive, PREDICTIVES)

    def with_guide_options(self, options: Mapping[str, Any]) -> LaplaceFit:
        raise ValueError("The Laplace entries build their guide themselves: expected no "
                         f"guide_options, got {sorted(options)}.")

    def fit(self, build_model: ModelFactory, x: Tensor, y: Tensor, *, task: str, seed: int,
            budget: Budget, progress: bool | None) -> LaplaceFitPosterior:
        if budget.distributed:
            raise ValueError("Laplace does not run data-parallel: expected distributed=False.")
        model = build_model()
        guide, laplace, result = fit_laplace(
            model, x, y, steps=budget.steps, lr=budget.lr, batch_size=budget.batch_size,
            seed=seed, progress=progress, jit=budget.jit, bias_scale=self.bias_scale,
            curvature=self.curvature, evidence=self.evidence, indefinite=self.indefinite,
            per_layer_alpha=self.per_layer_alpha, refine=self.refine,
            iterations=self.iterations)
        return LaplaceFitPosterior(model, guide, laplace, result, self.predictive)

    def restore(self, build_model: ModelFactory, state: dict, *, x: Tensor,
                y: Tensor):
        raise NotImplementedError("Loading a Laplace fit is not supported yet.")


VARIANTS = {
    "laplace": ("GGN Laplace, GLM predictive, alpha and beta by evidence fixed point",
                LaplaceFit(curvature="ggn", evidence="fixed_point")),
    "laplace_full": ("Laplace with the exact Hessian (PSD-projected), GLM predictive",
                     LaplaceFit(curvature="full", indefinite="clip")),
    "laplace_ggn": ("Laplace with the generalised Gauss-Newton, GLM predictive",
                    LaplaceFit(curvature="ggn")),
    "laplace_diag": ("Laplace with the diagonal GGN, GLM predictive",
                     LaplaceFit(curvature="diag")),
    "laplace_kron": ("Laplace with a Kronecker-factored GGN per layer (K-FAC), GLM predictive",
                     LaplaceFit(curvature="kron")),
    "laplace_last_layer": ("Laplace on the last layer's weights (GGN), GLM predictive",
                           LaplaceFit(curvature="last_layer")),
}

for _name, (_description, _method) in VARIANTS.items():
    register(Entry(
        name=_name,
        description=_description,
        tasks=("regression", "classification"),
        source="001_c55daefe340e50b9.txt",
        model=mlp,
        method=_method,
        budget=BUDGET,
    ))
