"""One SVI step per batch of a loader ([`LoaderStep`][]): the minibatches of a data
set that does not fit in memory, drawn from a [`Batches`][bnn_zoo._core.batches.Batches]
instead of indexed in tensors.

A batch of ``b`` points of a data set of ``N`` enters the model whole (its data plate
has size ``b``), and [`subsample_data`][bnn_zoo.handlers.subsample_data] scales every site in
the plate by ``N / b``, as it scales a shard in data-parallel training: the likelihood of
the batch times ``N / b``, the same unbiased estimate of the full-data ELBO as a minibatch
of in-memory tensors (Hoffman et al. 2013, "Stochastic Variational Inference"). The epoch
is one pass over the loader, in the loader's order; its ``i``-th batch takes the KL weight
``pi_i`` of [`kl_weights`][bnn_zoo._core.step.kl_weights].
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from bnn_zoo._core.batches import Batches
from bnn_zoo._core.step import SVIStep, kl_weights

__all__ = ["LoaderStep"]


class LoaderStep(SVIStep):
    """[`SVIStep`][bnn_zoo._core.step.SVIStep] on the batches of ``batches``, one per step
    (module doc). The loader sets the minibatches: ``batch_size`` is not an option, and
    training is on one process. A checkpoint resumes at the start of a fresh pass over the
    loader, whose order the step does not hold."""

    def __init__(self, model: Callable, guide: Callable, batches: Batches,
                 **options: Any) -> None:
        self.batches = batches
        self._iterator = iter(())  # the first step starts a pass
        self._weights: Tensor | None = None
        super().__init__(model, guide, *batches.first, **options)
        self.n_global = batches.num_data
        self.num_batches = batches.num_batches
        self.weights = kl_weights(self.num_batches, self.kl_weighting)

    def next_batch(self) -> tuple[int, Tensor]:
        """The next batch of the pass, or the first of a fresh pass when the loader is
        through; the data plate runs over it whole."""
        batch = next(self._iterator, None)
        if batch is None:
            self._iterator = iter(self.batches)
            self.position = 0
            batch = next(self._iterator, None)
            if batch is None:
                raise ValueError("Expected the loader to yield batches on every pass, but a "
                                 "pass yielded none.")
        self.x, self.y = batch
        b = self.x.shape[0]
        self._weights = None
        if b < self.batch:
            self._weights = self.padded_weights(b)
            rows = torch.arange(self.batch, device=self.x.device) % b
            self.x = self.x[rows]
            self.y = None if self.y is None else self.y[rows]
        self.n = self.x.shape[0]
        if self.n > self._ones.shape[0]:
            self._ones = torch.ones(self.n, dtype=self._ones.dtype, device=self._ones.device)
        i = min(self.position, self.num_batches - 1)
        self.position += 1
        return i, torch.arange(self.n, device=self.x.device)

    def padded(self, idx: Tensor) -> tuple[Tensor, Tensor | None]:
        """The batch's indices and the weights of its padding (``None`` for a full batch):
        a batch of ``b`` points shorter than the first batch's ``B`` (a pass's last) enters
        as ``B`` rows, its own points repeated, with weights ``B / b`` on its ``b`` points
        and 0 on the repeats, as [`SVIStep.padded`][bnn_zoo._core.step.SVIStep.padded]
        pads a short minibatch of tensors: the same loss, and one trace for every batch. A
        batch longer than ``B`` is traced on its own."""
        return idx, self._weights

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self._iterator = iter(())

    def run_description(self) -> dict:
        return {**super().run_description(), "data size N": self.n_global,
                "batch size": self.batch}
