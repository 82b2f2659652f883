"""Gaussian observation noise shared by the regression models: fixed or learned."""

from __future__ import annotations

import torch
from pyro.distributions import constraints
from pyro.nn import PyroParam
from torch import Tensor

from bnn_zoo._core.checks import check_positive

__all__ = ["ObservationNoise"]


class ObservationNoise:
    """Mixin for a ``PyroModule`` with a likelihood ``N(f, sigma^2)``.

    `init_noise` fixes ``sigma`` (a buffer, so it follows ``.to(device)``) or,
    with ``noise_scale=None``, makes it a positive ``PyroParam`` learned as a point
    estimate (type-II maximum likelihood) from ``init_noise_scale``. With ``outputs`` D > 1
    (multi-output regression, ``y_nd ~ N(f_d(x_n), sigma_d^2)`` independently) ``sigma`` is
    a vector (D,), one scale per output, each starting at (or fixed to) the number given.
    """

    def init_noise(self, noise_scale: float | None, init_noise_scale: float,
                   outputs: int = 1) -> None:
        self.learn_noise = noise_scale is None
        shape = () if outputs == 1 else (outputs,)
        if self.learn_noise:
            init = check_positive("init_noise_scale", init_noise_scale)
            self.noise_scale = PyroParam(torch.full(shape, init),
                                         constraint=constraints.positive)
        else:
            self.register_buffer("fixed_noise_scale", torch.full(
                shape, check_positive("noise_scale", noise_scale)))

    def observation_scale(self) -> Tensor:
        """The noise standard deviation ``sigma``: a number, or (D,) one per output."""
        return self.noise_scale if self.learn_noise else self.fixed_noise_scale
