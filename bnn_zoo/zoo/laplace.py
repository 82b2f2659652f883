"""Zoo entries of the Laplace approximation (seed 001, first half; Bishop, PRML 5.7).

Each entry finds the MAP by SVI (a :class:`~bnn_zoo.guides.laplace.LaplaceGuide` as
point mass, refined by full-batch L-BFGS), then builds the Gaussian around it:

* ``laplace``: GGN curvature, GLM predictive, ``alpha`` and ``beta`` tuned by MacKay's
  evidence fixed point (the best of the variants in ``benchmarks/laplace.py``);
* ``laplace_full``, ``laplace_ggn``, ``laplace_diag``, ``laplace_kron``,
  ``laplace_last_layer``: one curvature each, GLM predictive, ``alpha`` from the
  prior and ``beta`` from the MAP's learned noise (no evidence tuning). The exact
  Hessian of ``laplace_full`` is projected onto the PSD cone (``indefinite="clip"``).

Every option of :func:`~bnn_zoo.guides.laplace.fit_laplace` and
:meth:`~bnn_zoo.guides.laplace.LaplaceGuide.laplace_approximation` can be passed to
``entry.fit``, e.g. ``evidence="fixed_point"``, ``per_layer_alpha=True``,
``predictive="mc"``.
"""

from __future__ import annotations

from collections.abc import Callable

from bnn_zoo.core.checks import check_choice
from bnn_zoo.core.scaling import Standardizer
from bnn_zoo.guides.laplace import PREDICTIVES, LaplaceGuide, fit_laplace
from bnn_zoo.zoo import register
from bnn_zoo.zoo._entry import Budget, Entry, Fitted, split_options
from bnn_zoo.zoo.bbb import mlp

BUDGET = Budget(steps=2000, lr=1e-2, batch_size=256, jit=True)


def laplace_fitter(**defaults) -> Callable[..., Fitted]:
    """An :class:`Entry` fitter running :func:`fit_laplace` with ``defaults`` as options."""

    def fitter(entry: Entry, x, y, *, task: str, out_dim: int, seed: int, budget: Budget,
               progress: bool | None, options: dict) -> Fitted:
        settings = {"predictive": "glm", **defaults, **options}
        predictive = check_choice("predictive", settings.pop("predictive"), PREDICTIVES)
        model_kw, fit_kw, approx_kw = split_options(settings, entry.model, fit_laplace,
                                                    LaplaceGuide.laplace_approximation)
        model = entry.model(x.shape[1], out_dim, task=task, **model_kw).to(device=x.device)
        guide, post, result = fit_laplace(
            model, x, y, steps=budget.steps, lr=budget.lr, batch_size=budget.batch_size,
            seed=seed, progress=progress, jit=budget.jit, **fit_kw, **approx_kw)
        glm = (lambda z, num_samples: post.glm_predictive(z)) if predictive == "glm" else None
        return Fitted(entry.name, task, model, guide, Standardizer.identity(x), None,
                      result.seconds, result, glm)

    return fitter


VARIANTS = {
    "laplace": ("GGN Laplace, GLM predictive, alpha and beta by evidence fixed point",
                dict(curvature="ggn", evidence="fixed_point")),
    "laplace_full": ("Laplace with the exact Hessian (PSD-projected), GLM predictive",
                     dict(curvature="full", indefinite="clip")),
    "laplace_ggn": ("Laplace with the generalised Gauss-Newton, GLM predictive",
                    dict(curvature="ggn")),
    "laplace_diag": ("Laplace with the diagonal GGN, GLM predictive", dict(curvature="diag")),
    "laplace_kron": ("Laplace with a Kronecker-factored GGN per layer (K-FAC), GLM predictive",
                     dict(curvature="kron")),
    "laplace_last_layer": ("Laplace on the last layer's weights (GGN), GLM predictive",
                           dict(curvature="last_layer")),
}

for _name, (_description, _defaults) in VARIANTS.items():
    register(Entry(
        name=_name,
        description=_description,
        tasks=("regression", "classification"),
        seed="001_c55daefe340e50b9.txt",
        model=mlp,
        guide=LaplaceGuide,
        budget=BUDGET,
        fitter=laplace_fitter(**_defaults),
    ))
