"""Zoo entries of the Laplace approximation (MacKay 1992, "A Practical Bayesian Framework
for Backpropagation Networks"; Bishop 2006, "Pattern Recognition and Machine Learning",
section 5.7; the first half of Arbel's lecture notes "Bayesian NN under a Laplace
approximation" (2021)).

Each entry runs [`Laplace`][bnn_zoo.methods.laplace.Laplace]: the MAP by SVI (a
[`LaplaceGuide`][bnn_zoo.methods.laplace.LaplaceGuide] as point mass, refined by full-batch
L-BFGS), then the Gaussian around it, with the GLM predictive:

* ``laplace``: GGN curvature, ``alpha`` and ``beta`` tuned by MacKay's evidence fixed
  point with MAP refits (the best of the variants in ``benchmarks/laplace_variants.py``);
* ``laplace_full`` (curvature ``"hessian"``, the exact Hessian), ``laplace_ggn`` (the GGN
  with one ``alpha`` per layer), ``laplace_diag``, ``laplace_kron``: one curvature each,
  tuned the same way. The exact Hessian of ``laplace_full`` is projected onto the PSD cone
  where the precision is not positive definite even with jitter (``indefinite="clip"``);
* ``laplace_last_layer``: the last layer's GGN around the trained MAP without refits (a
  refit would let the other layers, fixed like hyperparameters, fit the noise of the
  training points), ``alpha`` and ``beta`` from the evidence, then scaled on a tenth of the
  training points held out ([`bnn_zoo.methods.laplace._validation`][]).

A classifier's MAP is trained once, under the model's prior, and every entry tunes its
``alpha`` post hoc (``refine="auto"``: refits under the evidence's ``alpha`` make a
classifier's MAP underconfident), then chooses a factor of it on held-out points
(``holdout="auto"``: a tenth of the points; the evidence-tuned GLM predictive of a
classifier is underconfident too). A regression's MAP is refitted under the tuned
``alpha`` and ``beta`` (the MAP of the model's prior fits the noise of the training
points). The structures follow Daxberger et al. 2021 ("Laplace Redux --
Effortless Bayesian Deep Learning"); K-FAC is Ritter et al. 2018 ("A Scalable Laplace
Approximation for Neural Networks"), the last layer Kristiadi et al. 2020 ("Being
Bayesian, Even Just a Bit, Fixes Overconfidence in ReLU Networks").

The entries fit the zoo's MLP; with ``entry.fit(..., net=...)`` they fit any torch module
on inputs of the shape it takes (images (N, C, H, W), series (N, C, L)) the same way (its
MAP trained untraced; ``kron`` and ``kron_separate`` need every parameterised layer to be
an ``nn.Linear``, ``nn.Conv1d`` or ``nn.Conv2d``, the other structures take any layer; see
[`bnn_zoo.methods.laplace._layouts`][]).

``entry.fit_many`` (and ``benchmarks/uci.py``) trains the MAP phases of many fits (the
splits of a data set) as replicas in one pass, then builds each fit's posterior
([`fit_many`][bnn_zoo.methods.laplace.Laplace.fit_many]).

Every field of [`Laplace`][bnn_zoo.methods.laplace.Laplace] can be replaced through
``entry.fit(..., method_options={...})``, e.g. ``{"evidence": "fixed_point"}``,
``{"per_layer_alpha": True}``, ``{"predictive": "mc"}``, ``{"curvature": "kron_separate"}``,
``{"prior_precision": (1.0, 4.0)}``, ``{"link": "mc"}``.
"""

from __future__ import annotations

from bnn_zoo._core.tasks import TASKS
from bnn_zoo.methods.laplace import Laplace
from bnn_zoo.zoo import TINY_BUDGET, Entry, register
from bnn_zoo.zoo._defaults import (
    ARBEL_NOTES,
    LAPLACE_BUDGET,
    LAPLACE_METHOD,
    LAPLACE_TUNED,
    mlp,
)

#: The L-BFGS refinement of the MAP is most of a tiny fit's time: left out.
TINY = {**TINY_BUDGET, "method_options": {"refine": False}}


def _laplace_entry(name: str, description: str, method: Laplace, source: str) -> Entry:
    """A Laplace entry on the zoo's MLP (or a user's network) with the shared budget, notes
    and tiny fit."""
    return register(Entry(name=name, description=description, tasks=TASKS, model=mlp,
                          method=method, budget=LAPLACE_BUDGET, source=source,
                          notes=ARBEL_NOTES, tiny=TINY, accepts_net=True))


REDUX = 'Daxberger et al. 2021, "Laplace Redux -- Effortless Bayesian Deep Learning"'

_laplace_entry("laplace", "GGN Laplace, GLM predictive, alpha and beta by evidence fixed point",
              LAPLACE_METHOD,
              'MacKay 1992, "A Practical Bayesian Framework for Backpropagation Networks"')
_laplace_entry("laplace_full", "Laplace with the exact Hessian (PSD-projected), GLM predictive, "
              "alpha and beta by evidence",
              Laplace(curvature="hessian", indefinite="clip", **LAPLACE_TUNED),
              'Bishop 2006, "Pattern Recognition and Machine Learning", section 5.7')
_laplace_entry("laplace_ggn", "Laplace with the generalised Gauss-Newton, GLM predictive, one "
              "alpha per layer and beta by evidence",
              Laplace(curvature="ggn", per_layer_alpha=True, **LAPLACE_TUNED), REDUX)
_laplace_entry("laplace_diag", "Laplace with the diagonal GGN, GLM predictive, alpha and beta by "
              "evidence", Laplace(curvature="diag", **LAPLACE_TUNED), REDUX)
_laplace_entry("laplace_kron",
              "Laplace with a Kronecker-factored GGN per layer (K-FAC), GLM predictive, alpha "
              "and beta by evidence", Laplace(curvature="kron", **LAPLACE_TUNED),
              'Ritter et al. 2018, "A Scalable Laplace Approximation for Neural Networks"')
_laplace_entry("laplace_last_layer", "Laplace on the last layer's weights (GGN), GLM predictive, "
              "alpha and beta by evidence and held-out points",
              Laplace(curvature="last_layer", evidence="fixed_point", refine=False,
                      holdout=0.1),
              'Kristiadi et al. 2020, "Being Bayesian, Even Just a Bit, Fixes Overconfidence '
              'in ReLU Networks"')
