"""Zoo entries of the Laplace approximation (seed 001, first half; Bishop, PRML 5.7).

Each entry runs :class:`~bnn_zoo.methods.laplace.Laplace`: the MAP by SVI (a
:class:`~bnn_zoo.guides.laplace.LaplaceGuide` as point mass, refined by full-batch
L-BFGS), then the Gaussian around it, with the GLM predictive:

* ``laplace``: GGN curvature, ``alpha`` and ``beta`` tuned by MacKay's evidence fixed
  point (the best of the variants in ``benchmarks/laplace_variants.py``);
* ``laplace_full`` (curvature ``"hessian"``, the exact Hessian), ``laplace_ggn``,
  ``laplace_diag``, ``laplace_kron``, ``laplace_last_layer``: one curvature each,
  ``alpha`` from the prior and ``beta`` from the MAP's learned noise (no evidence
  tuning). The exact Hessian of ``laplace_full`` is projected onto the PSD cone where
  the precision is not positive definite even with jitter (``indefinite="clip"``).

The entries fit the zoo's MLP; with ``entry.fit(..., net=...)`` they fit any torch module
the same way (its MAP
trained untraced; ``kron`` and ``kron_separate`` need every parameterised layer to be an
``nn.Linear`` or ``nn.Conv2d``, the other structures take any layer; see
:mod:`bnn_zoo.guides.layouts`).

``entry.fit_many`` (and ``benchmarks/uci.py``) trains the MAP phases of many fits (the
splits of a data set) as replicas in one pass, then builds each fit's posterior
(:meth:`~bnn_zoo.methods.laplace.Laplace.fit_many`).

Every field of :class:`~bnn_zoo.methods.laplace.Laplace` can be replaced through
``entry.fit(..., method_options={...})``, e.g. ``{"evidence": "fixed_point"}``,
``{"per_layer_alpha": True}``, ``{"predictive": "mc"}``, ``{"curvature": "kron_separate"}``,
``{"prior_precision": (1.0, 4.0)}``, ``{"link": "mc"}``.
"""

from __future__ import annotations

from bnn_zoo.methods.base import Budget
from bnn_zoo.methods.laplace import Laplace
from bnn_zoo.models.mlp import TASKS
from bnn_zoo.zoo import Entry, register
from bnn_zoo.zoo.bbb import mlp

BUDGET = Budget(steps=2000, lr=1e-2, batch_size=256, jit=True)
SOURCE = "001_c55daefe340e50b9.txt"


def laplace_entry(name: str, description: str, method: Laplace) -> Entry:
    """A Laplace entry on the zoo's MLP (or a user's network) with the shared budget and
    seed."""
    return register(Entry(name=name, description=description, tasks=TASKS, model=mlp,
                          method=method, budget=BUDGET, source=SOURCE, accepts_net=True))


laplace_entry("laplace", "GGN Laplace, GLM predictive, alpha and beta by evidence fixed point",
              Laplace(curvature="ggn", evidence="fixed_point"))
laplace_entry("laplace_full", "Laplace with the exact Hessian (PSD-projected), GLM predictive",
              Laplace(curvature="hessian", indefinite="clip"))
laplace_entry("laplace_ggn", "Laplace with the generalised Gauss-Newton, GLM predictive",
              Laplace(curvature="ggn"))
laplace_entry("laplace_diag", "Laplace with the diagonal GGN, GLM predictive",
              Laplace(curvature="diag"))
laplace_entry("laplace_kron",
              "Laplace with a Kronecker-factored GGN per layer (K-FAC), GLM predictive",
              Laplace(curvature="kron"))
laplace_entry("laplace_last_layer", "Laplace on the last layer's weights (GGN), GLM predictive",
              Laplace(curvature="last_layer"))
