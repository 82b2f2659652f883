"""A fitted zoo entry ([`Fitted`][]): the posterior of a fit with the training
statistics that map the caller's units to the standardised ones it was fitted in, and its
file format ([`Fitted.save`][bnn_zoo.zoo.Fitted.save]; read back by
[`bnn_zoo.zoo.load`][])."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from torch import Tensor

from bnn_zoo._core.batches import is_loader
from bnn_zoo._core.checks import check_data, check_device, check_positive_int
from bnn_zoo._core.files import save_atomic
from bnn_zoo._core.predictive import predict_batches
from bnn_zoo._core.scaling import Standardizer
from bnn_zoo._core.training import FitResult
from bnn_zoo.evaluation._metrics import evaluate_batches, metrics
from bnn_zoo.evaluation._noise_tuning import NoiseTunedPosterior
from bnn_zoo.methods._base import Posterior, Predictive

__all__ = ["FILE_FORMAT", "Fitted"]

#: The ``format`` field of a saved [`Fitted`][].
FILE_FORMAT = "bnn_zoo.fitted/1"
_PLAIN = (bool, int, float, str, type(None), Tensor)


def _check_plain(name: str, value: Any) -> None:
    """A ``ValueError`` naming ``name`` unless ``value`` is tensors and plain data."""
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_plain(f"{name}[{i}]", item)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError(f"Cannot save {name}: expected string keys, got {key!r}.")
            _check_plain(f"{name}[{key!r}]", item)
    elif not isinstance(value, _PLAIN):
        raise ValueError(f"Cannot save {name} = {value!r}: only tensors and plain Python data "
                         "(numbers, strings, lists, tuples, dicts) can be saved.")


@dataclass
class Fitted:
    """A fitted entry, working in the caller's units.

    ``predict(x)`` standardises ``x`` with the training statistics, predicts with the
    posterior, and maps regression predictives back to the units of ``y``; ``x`` must be
    on the device the entry was fitted on. ``in_dim``, ``out_dim`` and ``options`` (the
    ``model_options``, ``guide_options`` and ``method_options`` of the fit) are what
    [`save`][] needs to rebuild the model. ``in_dim`` is the number of input features
    (``D`` of inputs (N, D)); a fit with ``net=`` also keeps ``in_shape``, the shape of one
    input (``x.shape[1:]``, e.g. ``(1, 8, 8)``), and ``net_sites``, the ``(name, shape)``
    of every parameter of the network, which [`bnn_zoo.zoo.load`][] checks against the
    network it is given.
    """

    entry: str
    task: str
    x_scaler: Standardizer
    y_scaler: Standardizer | None
    posterior: Posterior
    fit_seconds: float
    in_dim: int
    out_dim: int
    options: dict[str, dict[str, Any]]
    in_shape: tuple[int, ...] | None = None
    net_sites: tuple[tuple[str, tuple[int, ...]], ...] | None = None

    @property
    def model(self) -> Callable:
        """The Pyro model, in standardised units."""
        return self.posterior.model

    @property
    def guide(self) -> Callable | None:
        """The guide: ``pyro.infer.Predictive(model, guide=guide)`` samples the posterior
        predictive in standardised units."""
        return self.posterior.guide

    @property
    def result(self) -> FitResult | None:
        return self.posterior.result

    @property
    def diagnostics(self) -> dict[str, float]:
        return self.posterior.diagnostics

    def diagnostics_at(self, x: Tensor) -> dict[str, float]:
        """`diagnostics`, and those the posterior computes at inputs ``x`` (N, D) in
        original units where it has any (``nuts``: the R-hat and effective sample size of
        the network output at ``x``,
        `predictive_diagnostics`)."""
        at_inputs = getattr(self.posterior, "predictive_diagnostics", None)
        if at_inputs is None:
            return dict(self.diagnostics)
        return {**self.diagnostics, **at_inputs(self.standardised_inputs(x))}

    def standardised_inputs(self, x: Tensor) -> Tensor:
        """``x`` (N, D) (a fit with ``net=``: (N, *in_shape)) in original units, checked
        against the fit's inputs and device, cast to the fit's dtype and standardised with
        its training statistics: what the posterior takes."""
        x, _ = check_data(x, any_shape=self.in_shape is not None)
        check_device("x", x.device, expected=self.x_scaler.mean.device)
        if self.in_shape is not None and tuple(x.shape[1:]) != self.in_shape:
            raise ValueError(f"Expected x of shape (N, {', '.join(map(str, self.in_shape))}) "
                             f"as in the fit, got {tuple(x.shape)}.")
        if self.in_shape is None and x.shape[1] != self.in_dim:
            raise ValueError(f"Expected x with {self.in_dim} columns, got {x.shape[1]}.")
        return self.x_scaler.transform(x.to(self.x_scaler.mean.dtype))

    def predict(self, x: Tensor | Iterable, num_samples: int = 200) -> Predictive:
        """Posterior predictive at ``x`` (N, D) (a fit with ``net=``: (N, *in_shape)) in
        original units.

        ``x`` may be a tensor or a numpy array; inputs of another floating dtype than the
        fit's (float64 inputs of a float32 fit) are cast to the fit's dtype. Or a loader
        (a ``DataLoader``, any re-iterable of ``x`` or ``(x, y)`` batches): the posterior
        then predicts batch by batch and the predictives of the batches are joined
        (`predict_batches`).
        """
        check_positive_int("num_samples", num_samples)
        if is_loader(x):
            return predict_batches(partial(self.predict, num_samples=num_samples), x)
        pred = self.posterior.predict(self.standardised_inputs(x), num_samples)
        if self.y_scaler is not None:
            pred = pred.affine(self.y_scaler.mean, self.y_scaler.std)
        return pred

    def evaluate(self, x: Tensor | Iterable, y: Tensor | None = None,
                 num_samples: int = 200) -> dict[str, float]:
        """Test metrics in original units (see [`bnn_zoo.evaluation`][]) plus
        ``fit_seconds``. ``x``, ``y`` may be numpy arrays; regression targets must have
        shape (N,); class labels must be integers in ``0..out_dim-1`` (float labels only
        when exactly integral, then cast). Or ``x`` a loader of ``(x, y)`` batches (``y``
        ``None``): the metrics are accumulated batch by batch, so memory stays that of one
        batch (`evaluate_batches`)."""
        if is_loader(x, y):
            if y is not None:
                raise ValueError("Expected y=None with a loader for x: the loader yields the "
                                 "targets with the inputs.")
            out = evaluate_batches(partial(self.predict, num_samples=num_samples), x)
        else:
            x, y = check_data(x, y, any_shape=self.in_shape is not None)
            out = metrics(self.predict(x, num_samples), y)
        out["fit_seconds"] = self.fit_seconds
        if self.result is not None:
            out["steps_per_second"] = self.result.steps_per_second
        return out

    def save(self, path: str | os.PathLike) -> None:
        """Write this fit to ``path`` as tensors and plain data only (state dicts, scalers,
        entry name, task, dimensions, options, the method's state), atomically: a
        temporary file in the same folder renamed over ``path``. Read it back with
        [`bnn_zoo.zoo.load`][]. A fit with ``net=`` saves the posterior over the
        network's parameters and their names and shapes, not the network's code: read it
        back with ``zoo.load(path, net=...)`` and the same architecture."""
        posterior = self.posterior
        noise = None
        if isinstance(posterior, NoiseTunedPosterior):
            posterior, noise = posterior.inner, posterior.noise_scale
        _check_plain("options", self.options)
        state = {
            "format": FILE_FORMAT, "entry": self.entry, "task": self.task,
            "in_dim": self.in_dim, "out_dim": self.out_dim,
            "dtype": str(self.x_scaler.mean.dtype).removeprefix("torch."),
            "x_scaler": {"mean": self.x_scaler.mean, "std": self.x_scaler.std},
            "y_scaler": None if self.y_scaler is None else
            {"mean": self.y_scaler.mean, "std": self.y_scaler.std},
            "options": self.options, "fit_seconds": self.fit_seconds,
            "validated_noise_scale": noise, "posterior": posterior.state_dict(),
            "in_shape": None if self.in_shape is None else list(self.in_shape),
            "net_sites": None if self.net_sites is None else
            [[name, list(shape)] for name, shape in self.net_sites],
        }
        _check_plain("the posterior's state", state["posterior"])
        save_atomic(state, path)
