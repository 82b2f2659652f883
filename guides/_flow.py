"""A normalising-flow guide started where the other guides start: narrow, at a chosen point.

Pyro's `AutoNormalizingFlow` pushes ``z ~ N(0, I)``
through a flow ``T``; a freshly initialised MADE makes ``T(z)`` a random point of
scale about 1, far from a sensible network, from which a BNN's flow trained by SVI may
never leave the prior. [`AffineShiftedFlow`][] appends a learned elementwise affine map,

    w = loc + exp(log_scale) * T(z),      log|det dw/dT| = sum(log_scale),

with ``loc`` started at the model's ``init_loc_fn`` values (packed in the guide's
latent order) and ``exp(log_scale)`` at ``init_scale``, so the initial posterior is a
narrow cloud around that point, as for ``AutoNormal(init_scale=...)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from pyro.distributions import TransformedDistribution, constraints
from pyro.distributions.torch_transform import ComposeTransformModule, TransformModule
from pyro.infer.autoguide import AutoContinuous, AutoNormalizingFlow
from torch import Tensor, nn

from bnn_zoo._core.checks import check_positive
from bnn_zoo.guides._params import to_pyro_params_

__all__ = ["AffineShiftedFlow", "ElementwiseAffine"]


class ElementwiseAffine(TransformModule):
    """Learned ``y = loc + exp(log_scale) * x`` over the last dimension."""

    domain = constraints.real_vector
    codomain = constraints.real_vector
    bijective = True

    def __init__(self, loc: Tensor, scale: float) -> None:
        super().__init__(cache_size=1)
        self.loc = nn.Parameter(loc.detach().clone())
        self.log_scale = nn.Parameter(torch.full_like(self.loc, math.log(scale)))

    def _call(self, x: Tensor) -> Tensor:
        return self.loc + self.log_scale.exp() * x

    def _inverse(self, y: Tensor) -> Tensor:
        return (y - self.loc) * torch.exp(-self.log_scale)

    def log_abs_det_jacobian(self, x: Tensor, y: Tensor) -> Tensor:
        return self.log_scale.sum().expand(x.shape[:-1])


class AffineShiftedFlow(AutoNormalizingFlow):
    """``AutoNormalizingFlow`` with `ElementwiseAffine` after the flow.

    Parameters
    ----------
    model : the Pyro model.
    init_transform_fn : ``latent_dim -> TransformModule``, the flow ``T``.
    init_loc_fn : per-site initial values (e.g. `bnn_zoo.models._mlp.init_to_fan_in`).
    init_scale : initial ``exp(log_scale)``.
    """

    def __init__(self, model: Callable, init_transform_fn: Callable[[int], TransformModule], *,
                 init_loc_fn: Callable, init_scale: float = 0.01) -> None:
        # AutoNormalizingFlow fixes init_to_feasible; the shift needs our init_loc_fn.
        AutoContinuous.__init__(self, model, init_loc_fn=init_loc_fn)
        self.init_scale = check_positive("init_scale", init_scale)
        self._flow_fn = init_transform_fn
        self.transform = None
        self._prototype_tensor = torch.tensor(0.0)

    def get_posterior(self, *args, **kwargs) -> TransformedDistribution:
        """``T`` (built on the first call) applied to ``N(0, I)``.

        Pyro's ``AutoNormalizingFlow.get_posterior`` keeps the flow's first ``PyroParam``
        itself as its prototype tensor, which registers that parameter a second time under
        another name (and breaks ``JitTrace_ELBO``); the prototype only carries the device
        and dtype of the base distribution, so a zero of them is kept instead.
        """
        if self.transform is None:
            self.transform = self._build_transform()
            self._prototype_tensor = next(self.transform.parameters()).new_zeros(())
        return AutoContinuous.get_posterior(self, *args, **kwargs)

    def _build_transform(self) -> ComposeTransformModule:
        """``T`` then `ElementwiseAffine`, on the device and in the dtype of the
        initial values (those of the model, hence of the data): the flow factory builds its
        layers with torch's defaults. PyroParams throughout (the flow's own included), so
        Pyro's SVI trains it in either ``module_local_params`` mode (see
        [`bnn_zoo.guides._params`][])."""
        loc = self._init_loc()
        flow = self._flow_fn(self.latent_dim).to(device=loc.device, dtype=loc.dtype)
        return to_pyro_params_(ComposeTransformModule([flow, ElementwiseAffine(loc,
                                                                               self.init_scale)]))
