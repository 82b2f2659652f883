"""MC dropout as a guide (Gal and Ghahramani 2016, "Dropout as a Bayesian Approximation:
Representing Model Uncertainty in Deep Learning").

Gal's variational distribution over a layer's weight matrix is a point mass ``M`` whose
input rows are switched off at random,

.. math::

    W = M \\,\\mathrm{diag}(z) / (1 - p), \\qquad z_j \\sim \\mathrm{Bernoulli}(1 - p),

``p`` the dropout rate (the ``1 / (1 - p)`` of inverted dropout keeps the expected input of
the next unit unchanged, so ``M / (1 - p)`` is the matrix of Gal's derivation). Dropping
input ``j`` of a layer is zeroing row (column, in torch's layout) ``j`` of its weight, so
[`MCDropoutGuide`][] draws the masks ``z`` at sample sites of its own (``dropout.<layer>``,
auxiliary: the model has none) and gives every weight site the point mass ``W`` above; the
model is any zoo model, unchanged ([`BayesianMLP`][bnn_zoo.models.BayesianMLP], or a user's network
as [`BayesianModule`][bnn_zoo.models.BayesianModule]). ``pyro.infer.Predictive(model, guide=guide)``
then draws the masks and averages the masked networks, the MC dropout predictive
``p(y | x) ~ 1/S sum_s p(y | x, W_s)``.

The ELBO of this pair is Gal's objective: the expected log-likelihood under the masks plus
``E_z[log p(W)]`` (the point mass has no entropy term that depends on ``M``). For the
Gaussian prior ``N(0, l^-2)`` (``l`` the prior length-scale, ``l = 1 / s`` for the zoo's
``N(0, s^2)``), ``E_z[-log p(W)] = (1 - p) l^2 / 2 ||M / (1 - p)||^2 + const``: weight decay,
which per data point and per unit noise precision ``tau`` is Gal's

.. math:: \\lambda = \\frac{(1 - p)\\, l^2}{2 N \\tau}.

Which inputs drop: those of every weight matrix except the first (the data are not
dropped), in the order of the model's sites (`dropout_masks`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import pyro
import pyro.distributions as dist
from pyro.infer.autoguide import AutoDelta
from pyro.infer.autoguide.initialization import init_to_sample
from pyro.nn import PyroModule
from pyro.poutine.messenger import Messenger
from torch import Tensor

from bnn_zoo._core.checks import check_fraction
from bnn_zoo._core.nn import NOISY_LAYER_TYPES

__all__ = ["MCDropoutGuide", "dropout_masks"]


def dropout_masks(model: object) -> dict[str, tuple[str, tuple[int, ...]]]:
    """The weight sites whose inputs drop, each mapped to ``(mask site, shape)``: the name
    of its mask's sample site, and the shape in which the mask multiplies the weight (the
    number of inputs along the weight's input dimension ``dim``, 1 along the others).

    On the zoo's MLP (weights ``layers.{l}.weight`` of shape ``(d_in, d_out)``) the inputs
    of every layer but the first, ``dim`` 0, masks ``dropout.layers.{l}``. On a user's
    network (a model with ``net``: [`BayesianModule`][bnn_zoo.models.BayesianModule]) the inputs of
    every ``nn.Linear`` and ``nn.Conv{1,2,3}d`` with a random weight but the first, in the
    order of ``net.named_modules()``: the weight's ``dim`` 1 in torch's ``(out, in, *kernel)``
    layout (input features, or input channels, a whole channel dropping at once), masks
    ``dropout.<module name>``.
    """
    shapes = dict(model.sites)
    net = getattr(model, "net", None)
    if net is None:
        weights = [(name, 0) for name in shapes if name.endswith(".weight")]
    else:
        weights = [(f"{prefix}.weight", 1) for prefix, layer in net.named_modules()
                   if isinstance(layer, NOISY_LAYER_TYPES) and f"{prefix}.weight" in shapes]
    return {name: (f"dropout.{name.removesuffix('.weight')}",
                   tuple(size if d == dim else 1 for d, size in enumerate(shapes[name])))
            for name, dim in weights[1:]}


class _mask_point_masses(Messenger):
    """Multiply the point mass (``Delta``) of each weight site named in ``factors`` by its
    factor ``diag(z) / (1 - p)``, broadcast along the sample and replica dims."""

    def __init__(self, factors: Mapping[str, Tensor]) -> None:
        super().__init__()
        self.factors = factors

    def _pyro_sample(self, msg) -> None:
        factor = self.factors.get(msg["name"])
        if factor is not None:
            fn = msg["fn"]
            msg["fn"] = dist.Delta(fn.v * factor, log_density=fn.log_density,
                                   event_dim=fn.event_dim)


class MCDropoutGuide(PyroModule):
    """Gal's MC dropout posterior over ``model``'s weights (see the module doc): Pyro's
    ``AutoDelta`` (the point masses ``M``, started at ``init_loc_fn``) whose weights are
    masked by Bernoulli draws at the auxiliary sites of `dropout_masks`.

    Parameters
    ----------
    model : a zoo model with ``sites`` (the zoo's MLP, a `BayesianModule`); its
        ``replicas`` (R fits in one pass) give masks and point masses per replica.
    dropout : the dropout rate ``p`` in [0, 1).
    init_loc_fn : where the point masses start (Pyro's ``init_to_sample`` by default).
    """

    def __init__(self, model: Callable, *, dropout: float = 0.05,
                 init_loc_fn: Callable[[dict], Tensor] = init_to_sample) -> None:
        super().__init__()
        self.dropout = check_fraction("dropout", dropout)
        self.masks = dropout_masks(model)
        self.replicas = getattr(model, "replicas", None)
        self.point = AutoDelta(model, init_loc_fn=init_loc_fn)

    def sample_masks(self, like: Tensor) -> dict[str, Tensor]:
        """Draw every mask ``z`` (site ``dropout.<layer>``, ``z_j ~ Bernoulli(1 - p)``, one
        per input, per replica and per sample of any plate around the guide) and return, by
        weight site, the factor ``diag(z) / (1 - p)`` laid along the weight's input dim."""
        keep = 1.0 - self.dropout
        # Per replica by the masks' own batch shape (R, 1), the replica plate's layout: the
        # plate itself is AutoDelta's to open.
        batch = () if self.replicas is None else (self.replicas, 1)
        factors = {}
        for weight, (site, shape) in self.masks.items():
            probs = like.new_full((*batch, max(shape)), keep)
            z = pyro.sample(site, dist.Bernoulli(probs).to_event(1), infer={"is_auxiliary": True})
            factors[weight] = z.reshape(*z.shape[:-1], *shape) / keep
        return factors

    def forward(self, x: Tensor, y: Tensor | None = None) -> dict[str, Tensor]:
        factors = self.sample_masks(x)
        with _mask_point_masses(factors):
            return self.point(x, y)
