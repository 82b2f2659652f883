"""Standardisation with training-split statistics."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["Standardizer"]


@dataclass(frozen=True)
class Standardizer:
    """``z = (t - mean) / std`` per column; columns with ``std == 0`` are only centred."""

    mean: Tensor
    std: Tensor

    @classmethod
    def fit(cls, t: Tensor) -> Standardizer:
        mean = t.mean(0)
        std = t.std(0, unbiased=False) if t.shape[0] > 1 else torch.ones_like(mean)
        return cls.from_mean_std(mean, std)

    @classmethod
    def from_mean_std(cls, mean: Tensor, std: Tensor) -> Standardizer:
        """The standardizer with the given column statistics (``std == 0``: only centred)."""
        return cls(mean, torch.where(std > 0, std, torch.ones_like(std)))

    @classmethod
    def identity(cls, like: Tensor) -> Standardizer:
        shape = like.shape[1:]
        return cls(like.new_zeros(shape), like.new_ones(shape))

    def transform(self, t: Tensor) -> Tensor:
        return (t - self.mean) / self.std

    def inverse(self, z: Tensor) -> Tensor:
        return z * self.std + self.mean
