"""The data plate and the likelihood shared by the zoo's network models.

Every network model ends the same way: the inputs go into ``pyro.plate("data", N)``
(subsampled when :class:`~bnn_zoo.core.handlers.subsample_data` sets its indices, so the
likelihood is rescaled by ``N / B``), the network output is recorded as
``pyro.deterministic("f")`` and the targets are observed at ``"obs"``:

* regression: ``y_n ~ N(f(x_n), sigma^2)``;
* classification: ``y_n ~ Categorical(softmax(f(x_n)))``.
"""

from __future__ import annotations

from collections.abc import Callable

import pyro
import pyro.distributions as dist
from torch import Tensor

__all__ = ["observe"]


def observe(x: Tensor, y: Tensor | None, network: Callable[[Tensor], Tensor], *,
            regression: bool, noise_scale: Callable[[], Tensor] | None = None,
            data_dim: int = 0) -> Tensor:
    """Run ``network`` on (the minibatch of) ``x`` inside the data plate and observe ``y``.

    ``network(x)`` returns the outputs (*S, N, K); ``noise_scale()`` gives ``sigma`` for
    regression. Returns the outputs ``f``. ``data_dim`` is the dimension of ``x`` and ``y``
    that runs over the data points: 1 for replicas, ``x`` of shape (R, N, D) and ``y``
    (R, N) (see :mod:`bnn_zoo.core.replicas`).
    """
    with pyro.plate("data", x.shape[data_dim], device=x.device) as idx:
        if idx.shape[0] != x.shape[data_dim]:
            x = x.index_select(data_dim, idx)
            y = None if y is None else y.index_select(data_dim, idx)
        f = pyro.deterministic("f", network(x))
        if regression:
            pyro.sample("obs", dist.Normal(f.squeeze(-1), noise_scale().to(f.dtype)), obs=y)
        else:
            pyro.sample("obs", dist.Categorical(logits=f), obs=y)
    return f
