"""The data plate and the likelihood shared by the zoo's network models.

Every network model ends the same way: the inputs go into ``pyro.plate("data", N)``
(subsampled when :class:`~bnn_zoo.core.handlers.subsample_data` sets its indices, so the
likelihood is rescaled by ``N / B``), the network output is recorded as
``pyro.deterministic("f")`` and the targets are observed at ``"obs"``:

* regression: ``y_n ~ N(f(x_n), sigma^2)``; with D > 1 outputs, targets ``y_n`` (D,) and
  ``y_nd ~ N(f_d(x_n), sigma_d^2)`` independently, one noise scale per output (one event of
  D numbers per data point);
* heteroscedastic regression: the network has two outputs, a mean ``f(x_n)`` (recorded as
  ``f``) and a raw scale ``s(x_n)``, and ``y_n ~ N(f(x_n), sigma(x_n)^2)`` with
  ``sigma(x) = softplus(s(x)) + MIN_SCALE`` (recorded as ``"noise_scale"``; the Gaussian
  output of Lakshminarayanan et al. 2017, Sec. 2.2, with their variance floor on the scale);
* classification: ``y_n ~ Categorical(softmax(f(x_n)))``.
"""

from __future__ import annotations

from collections.abc import Callable

import pyro
import pyro.distributions as dist
import torch.nn.functional as F
from torch import Tensor

__all__ = ["MIN_SCALE", "heteroscedastic_scale", "observe"]

#: The floor of a heteroscedastic noise scale, in the units of the (standardised) targets.
MIN_SCALE = 1e-3


def heteroscedastic_scale(raw: Tensor) -> Tensor:
    """``sigma = softplus(raw) + MIN_SCALE``: the noise scale of a heteroscedastic output."""
    return F.softplus(raw) + MIN_SCALE


def observe(x: Tensor, y: Tensor | None, network: Callable[[Tensor], Tensor], *,
            regression: bool, noise_scale: Callable[[], Tensor] | None = None,
            heteroscedastic: bool = False, data_dim: int = 0) -> Tensor:
    """Run ``network`` on (the minibatch of) ``x`` inside the data plate and observe ``y``.

    ``network(x)`` returns the outputs (*S, N, K); ``noise_scale()`` gives ``sigma`` for
    regression (a number, or (D,) for D outputs, when ``y`` is (N, D)); with
    ``heteroscedastic=True`` instead, ``network`` returns (*S, N, 2), the
    mean and the raw scale of each point (see :func:`heteroscedastic_scale`).
    Returns the outputs ``f`` (the mean only, (*S, N, 1), when heteroscedastic).
    ``data_dim`` is the dimension of ``x`` and ``y`` that runs over the data points: 1 for
    replicas, ``x`` of shape (R, N, D) and ``y``
    (R, N) (see :mod:`bnn_zoo.core.replicas`).
    """
    with pyro.plate("data", x.shape[data_dim], device=x.device) as idx:
        if idx.shape[0] != x.shape[data_dim]:
            x = x.index_select(data_dim, idx)
            y = None if y is None else y.index_select(data_dim, idx)
        out = network(x)
        if regression and heteroscedastic:
            f = pyro.deterministic("f", out[..., :1])
            scale = pyro.deterministic("noise_scale", heteroscedastic_scale(out[..., 1]))
            pyro.sample("obs", dist.Normal(f.squeeze(-1), scale), obs=y)
            return f
        f = pyro.deterministic("f", out)
        if regression and f.shape[-1] > 1:
            pyro.sample("obs", dist.Normal(f, noise_scale().to(f.dtype)).to_event(1), obs=y)
        elif regression:
            pyro.sample("obs", dist.Normal(f.squeeze(-1), noise_scale().to(f.dtype)), obs=y)
        else:
            pyro.sample("obs", dist.Categorical(logits=f), obs=y)
    return f
