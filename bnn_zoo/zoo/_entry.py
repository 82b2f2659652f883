"""Zoo entries and fitted results (the contract of DESIGN.md).

An :class:`Entry` declares a model factory, an inference method (:mod:`bnn_zoo.methods`)
and a budget. :meth:`Entry.fit` alone standardises the data with the training
statistics, fits the method on standardised data and wraps the posterior in a
:class:`Fitted`, which maps predictions back to the caller's units.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import pyro
import torch
from torch import Tensor, nn

from bnn_zoo.core import distributed
from bnn_zoo.core.checks import (
    check_bool,
    check_choice,
    check_class_labels,
    check_data,
    check_device,
    check_positive_int,
    check_seed,
)
from bnn_zoo.core.files import save_atomic
from bnn_zoo.core.scaling import Standardizer
from bnn_zoo.core.training import FitResult
from bnn_zoo.evaluation.metrics import metrics
from bnn_zoo.evaluation.noise_tuning import NoiseTunedPosterior, holdout, tune_noise
from bnn_zoo.methods.base import (
    Budget,
    Method,
    ModelFactory,
    Posterior,
    Predictive,
    UnsupportedProblem,
)
from bnn_zoo.methods.ensemble import Ensemble
from bnn_zoo.methods.svi import accepted_keywords, check_keywords
from bnn_zoo.models.mlp import TASKS
from bnn_zoo.models.module import BayesianModule
from bnn_zoo.zoo._networks import NET_MODEL_OPTIONS, Network, net_model_defaults, network_builder

__all__ = ["FILE_FORMAT", "Entry", "Fitted", "Predictive"]

#: The ``format`` field of a saved :class:`Fitted`.
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
    :meth:`save` needs to rebuild the model. ``in_dim`` is the number of input features
    (``D`` of inputs (N, D)); a fit with ``net=`` also keeps ``in_shape``, the shape of one
    input (``x.shape[1:]``, e.g. ``(1, 8, 8)``), and ``net_sites``, the ``(name, shape)``
    of every parameter of the network, which :func:`bnn_zoo.zoo.load` checks against the
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
        """:attr:`diagnostics`, and those the posterior computes at inputs ``x`` (N, D) in
        original units where it has any (``nuts``: the R-hat and effective sample size of
        the network output at ``x``,
        :meth:`~bnn_zoo.methods.nuts.NUTSPosterior.predictive_diagnostics`)."""
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

    def predict(self, x: Tensor, num_samples: int = 200) -> Predictive:
        """Posterior predictive at ``x`` (N, D) (a fit with ``net=``: (N, *in_shape)) in
        original units.

        ``x`` may be a tensor or a numpy array; inputs of another floating dtype than the
        fit's (float64 inputs of a float32 fit) are cast to the fit's dtype.
        """
        check_positive_int("num_samples", num_samples)
        pred = self.posterior.predict(self.standardised_inputs(x), num_samples)
        if self.y_scaler is not None:
            pred = pred.affine(self.y_scaler.mean, self.y_scaler.std)
        return pred

    def evaluate(self, x: Tensor, y: Tensor, num_samples: int = 200) -> dict[str, float]:
        """Test metrics in original units (see :mod:`bnn_zoo.evaluation.metrics`) plus
        ``fit_seconds``. ``x``, ``y`` may be numpy arrays; regression targets must have
        shape (N,); class labels must be integers in ``0..out_dim-1`` (float labels only
        when exactly integral, then cast)."""
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
        :func:`bnn_zoo.zoo.load`. A fit with ``net=`` saves the posterior over the
        network's parameters and their names and shapes, not the network's code: read it
        back with ``zoo.load(path, net=...)`` and the same architecture."""
        path = Path(path)
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


@dataclass(frozen=True)
class Entry:
    """A registered model and inference method.

    ``model(in_dim, out_dim, *, task, **model_options)`` builds the Pyro model,
    ``method`` (a dataclass of :mod:`bnn_zoo.methods`) fits it, ``budget`` is the
    training budget for every data set, ``source`` the seed document it implements.
    ``tunable_noise`` marks an entry whose regression predictive is a mixture
    ``1/S sum_s N(f_s(x), sigma^2)`` with one learned ``sigma``, which
    ``Budget.validation`` may replace by a held-out optimum (not so where the predictive
    variance has an epistemic part in closed form, as in Laplace's GLM predictive or a GP).
    ``accepts_net`` marks an entry whose method works on any network of weights, so that
    ``fit(..., net=...)`` replaces its model by the user's network (not so where the model
    is not a network of weights: a GP, random features; or where the method needs the
    entry's own model).
    """

    name: str
    description: str
    tasks: tuple[str, ...]
    model: Callable[..., Callable]
    method: Method
    budget: Budget = Budget()
    source: str | None = None
    tunable_noise: bool = False
    accepts_net: bool = False

    @property
    def guide(self) -> Callable[..., Callable] | None:
        """The SVI guide factory ``guide(model, **guide_options)`` of the method, or
        ``None`` where the method trains no guide of its own (NUTS, exact GP)."""
        return getattr(self.method, "guide", None)

    @property
    def model_keywords(self) -> set[str] | None:
        """The ``model_options`` the entry's model takes (``None``: any, it takes
        ``**options``)."""
        return accepted_keywords(self.model, skip=("in_dim", "out_dim", "task"))

    def configure(self, model_options: Mapping[str, Any] | None = None,
                  guide_options: Mapping[str, Any] | None = None,
                  method_options: Mapping[str, Any] | None = None, *, net: bool = False
                  ) -> tuple[dict[str, Any], Method]:
        """The checked model options and the method with ``method_options`` (fields of its
        dataclass) and ``guide_options`` in place; unknown keys raise a ``ValueError``.
        With ``net=True`` the model options are those of :class:`BayesianModule`, on top
        of the entry's own defaults for them (see :func:`net_model_defaults`)."""
        if net:
            model_options = {**net_model_defaults(self.model), **check_keywords(
                "model_options (with net=)", model_options or {}, NET_MODEL_OPTIONS)}
        else:
            model_options = check_keywords("model_options", model_options or {},
                                           self.model_keywords)
        method_options = check_keywords("method_options", method_options or {},
                                        {f.name for f in fields(self.method)})
        method = replace(self.method, **method_options) if method_options else self.method
        if guide_options:
            method = method.with_guide_options(guide_options)
        return model_options, method

    def model_factory(self, in_dim: int, out_dim: int, task: str,
                      model_options: Mapping[str, Any], like: Tensor) -> ModelFactory:
        """``build_model(**overrides)``: a fresh model on the device and in the dtype of
        ``like``, ``overrides`` replacing ``model_options``."""

        def build_model(**overrides: Any) -> Callable:
            model = self.model(in_dim, out_dim, task=task, **{**model_options, **overrides})
            if isinstance(model, nn.Module):
                model = model.to(device=like.device, dtype=like.dtype)
            return model

        return build_model

    def net_model_factory(self, net: Network, task: str, model_options: Mapping[str, Any],
                          like: Tensor) -> tuple[ModelFactory, tuple]:
        """``build_model(**overrides)`` of a fit with ``net=``: a fresh
        :class:`BayesianModule` on the network (see
        :func:`~bnn_zoo.zoo._networks.network_builder`), and the ``(name, shape)`` of the
        network's parameters, read from one model built here so that a bad network or
        option is refused before any fit."""
        make_net = network_builder(net, like)

        def build_model(**overrides: Any) -> BayesianModule:
            return BayesianModule(make_net(), task=task, **{**model_options, **overrides})

        return build_model, tuple(build_model().sites)

    def check_targets(self, y: Tensor, task: str | None, name: str = "y"
                      ) -> tuple[str, Tensor]:
        """The task (``task``, or inferred from ``y``'s dtype) and the checked targets
        ``y`` (named ``name`` in errors): float vectors (N,) for regression, labels
        0..C-1 of shape (N,) for classification; a task the entry does not support raises
        :class:`UnsupportedProblem`."""
        if task is not None:
            check_choice("task", task, TASKS)
        task = task or ("classification" if not y.is_floating_point() else "regression")
        if task not in self.tasks:
            raise UnsupportedProblem(
                f"Entry {self.name!r} supports {', '.join(self.tasks)}, not {task!r}.")
        if task == "regression" and (y.dim() != 1 or not y.is_floating_point()):
            raise ValueError(f"Expected {name} to be a float vector (N,) for regression, got "
                             f"{y.dtype} of shape {tuple(y.shape)}.")
        if task == "classification":
            if y.dim() != 1:
                raise ValueError(f"Expected {name} to be class labels 0..C-1 of shape (N,) for "
                                 f"classification, got shape {tuple(y.shape)}.")
            y = check_class_labels(name, y)
        return task, y

    def settings(self, model_options: Mapping[str, Any] | None,
                 guide_options: Mapping[str, Any] | None,
                 method_options: Mapping[str, Any] | None,
                 budget_overrides: Mapping[str, Any], *, net: bool = False
                 ) -> tuple[dict[str, dict[str, Any]], dict[str, Any], Method, Budget]:
        """The checked options of a fit (as :class:`Fitted` records them), the model
        options, the configured method (:meth:`configure`) and the budget with
        ``budget_overrides`` (fields of :class:`Budget`) in place."""
        overrides = check_keywords("budget option", budget_overrides,
                                   {f.name for f in fields(Budget)})
        options = {name: check_keywords(name, value or {}, None) for name, value in
                   (("model_options", model_options), ("guide_options", guide_options),
                    ("method_options", method_options))}
        model_kw, method = self.configure(**options, net=net)
        budget = replace(self.budget, **overrides)
        if budget.validation > 0 and model_kw.get("noise") == "heteroscedastic":
            raise ValueError("validation tunes one noise scale, and a heteroscedastic model "
                             "has one per point: expected validation=0 with "
                             "noise='heteroscedastic'.")
        return options, model_kw, method, budget

    def training_data(self, x: Tensor, y: Tensor, task: str, budget: Budget, seed: int
                      ) -> tuple[Standardizer, Standardizer | None, Tensor, Tensor,
                                 tuple[Tensor, Tensor] | None]:
        """The scalers of ``x`` and (regression) ``y``, fitted on the training data (on all
        shards with ``budget.distributed``), the standardised data the method fits, and the
        held-out ``(x, y)`` on which the noise is tuned (``budget.validation > 0``, regression
        only; ``None`` otherwise), split off with ``seed``."""
        fit_scaler = distributed.fit_standardizer if budget.distributed else Standardizer.fit
        x_scaler = fit_scaler(x)
        y_scaler = fit_scaler(y) if task == "regression" else None
        xs = x_scaler.transform(x)
        ys = y_scaler.transform(y) if y_scaler is not None else y
        if budget.validation == 0 or task != "regression":
            return x_scaler, y_scaler, xs, ys, None
        if not self.tunable_noise:
            raise ValueError(f"Entry {self.name!r} has no single noise scale to tune: "
                             "expected validation=0.")
        xs, ys, x_val, y_val = holdout(xs, ys, budget.validation, seed=seed)
        return x_scaler, y_scaler, xs, ys, (x_val, y_val)

    def fit(self, x: Tensor, y: Tensor, *, task: str | None = None, seed: int = 0,
            progress: bool | None = False, model_options: Mapping[str, Any] | None = None,
            guide_options: Mapping[str, Any] | None = None,
            method_options: Mapping[str, Any] | None = None, net: Network | None = None,
            **budget_overrides: Any) -> Fitted:
        """Standardise with the training statistics, fit the method, and wrap the result.

        ``model_options`` go to the model factory, ``guide_options`` to the guide factory,
        ``method_options`` replace fields of the method (e.g. ``members=3``), and
        ``budget_overrides`` replace :class:`Budget` fields (``steps``, ``lr``, ...).
        Everything runs on the device and in the dtype of ``x``. With
        ``distributed=True`` (see :mod:`bnn_zoo.core.distributed`) ``x`` and ``y`` are
        this process's shard, and the standardisation statistics and the number of
        classes are those of all the shards together.

        ``x`` and ``y`` may be numpy arrays. Regression targets must be floats of shape
        (N,); classification labels integers 0..C-1 of shape (N,) (float labels only when
        exactly integral, then cast). ``seed`` is an int >= 0, ``progress`` a bool or
        ``None``; every budget override is checked by :class:`Budget`.

        ``net`` (entries with ``accepts_net``; others raise :class:`UnsupportedProblem`):
        a ``torch.nn.Module`` mapping inputs (N, ...) to outputs (N, 1) (regression) or
        (N, C) class logits, or a zero-argument factory returning one. The model is then
        :class:`~bnn_zoo.models.BayesianModule` ``(net, task=task, **model_options)``
        (options ``prior``, ``noise_scale``, ``init_noise_scale``; the entry's own prior by
        default), ``x`` may have any shape (N, ...) and is standardised elementwise (each
        pixel of an image with its own training mean and standard deviation). A module is
        used as given, not copied, and never changed: its parameter values are where the
        guides start. It must be on ``x``'s device and
        dtype. A factory is called for every model built (each fit, each ensemble member,
        each restore) and its network moved to ``x``'s device and dtype; an ensemble needs
        one, so that its members start apart.
        """
        if net is not None and not self.accepts_net:
            raise UnsupportedProblem(
                f"Entry {self.name!r} ({self.description}) does not take a user's network "
                "(net=): its method works only on the entry's own model.")
        x, _ = check_data(x, any_shape=True)
        if net is None and x.dim() != 2:
            raise ValueError(f"Expected x of shape (N, D) (2 dimensions) for entry "
                             f"{self.name!r}'s own model, but got shape {tuple(x.shape)}; "
                             "inputs of other shapes need a network that takes them "
                             "(entry.fit(..., net=...)).")
        x, y = check_data(x, y, any_shape=True)
        seed = check_seed("seed", seed)
        check_bool("progress", progress, allow_none=True)
        task, y = self.check_targets(y, task)
        options, model_kw, method, budget = self.settings(
            model_options, guide_options, method_options, budget_overrides, net=net is not None)
        if isinstance(net, nn.Module) and isinstance(method, Ensemble) and method.members > 1:
            raise ValueError(f"Expected net to be a factory for entry {self.name!r}: its "
                             f"{method.members} members would all start at the one module's "
                             "weights; pass net=lambda: MyNet() so that each starts apart.")
        x_scaler, y_scaler, xs, ys, validation = self.training_data(x, y, task, budget, seed)
        out_dim = 1 if task == "regression" else int(y.max()) + 1
        if budget.distributed and task == "classification":
            out_dim = distributed.global_max(out_dim, y.device)
        in_shape = net_sites = None
        if net is None:
            build_model = self.model_factory(x.shape[1], out_dim, task, model_kw, xs)
        else:
            in_shape = tuple(x.shape[1:])
            build_model, net_sites = self.net_model_factory(net, task, model_kw, xs)
        pyro.set_rng_seed(seed)
        started = time.perf_counter()
        posterior = method.fit(build_model, xs, ys, task=task, seed=seed, budget=budget,
                               progress=progress)
        if validation is not None:
            posterior = tune_noise(posterior, *validation, distributed=budget.distributed)
        return Fitted(self.name, task, x_scaler, y_scaler, posterior,
                      time.perf_counter() - started, x[0].numel(), out_dim, options,
                      in_shape, net_sites)

    def fit_many(self, xs: object, ys: object, *, seeds: list[int] | tuple[int, ...],
                 **options: Any) -> list[Fitted]:
        """R independent fits (R training sets of equal size, or one set with R seeds) in
        one vectorised pass where the method can batch them, one by one where not; each
        :class:`Fitted` as from :meth:`fit` (see :func:`bnn_zoo.zoo._replicas.fit_many`,
        which takes the options of :meth:`fit`)."""
        from bnn_zoo.zoo._replicas import fit_many  # it builds Fitted: imported when called

        return fit_many(self, xs, ys, seeds=seeds, **options)

    def restore(self, state: dict, *, source: str = "<state>",
                net: Network | None = None) -> Fitted:
        """The :class:`Fitted` of a saved ``state`` (see :meth:`Fitted.save`), rebuilt
        through this entry's factories, or on ``net`` (a module or a factory of the
        network the fit was saved from) for a fit with ``net=``; ``source`` names the file
        in errors."""
        if state.get("entry") != self.name:
            raise ValueError(f"{source} holds entry {state.get('entry')!r}, not {self.name!r}.")
        saved_sites = state.get("net_sites")
        if (saved_sites is None) != (net is None):
            raise ValueError(
                f"{source} holds a fit of a user's network: load it with "
                "zoo.load(path, net=...) and the same network." if net is None else
                f"{source} holds a fit of entry {self.name!r}'s own model, not of a "
                "network: load it without net=.")
        options = state["options"]
        model_kw, method = self.configure(**options, net=net is not None)
        x_scaler = Standardizer(**state["x_scaler"])
        y_scaler = None if state["y_scaler"] is None else Standardizer(**state["y_scaler"])
        dtype = getattr(torch, state["dtype"])
        in_shape = None if state.get("in_shape") is None else tuple(state["in_shape"])
        like = torch.zeros(2, *(in_shape or (state["in_dim"],)), dtype=dtype,
                           device=x_scaler.mean.device)
        y_like = like.new_zeros(2) if state["task"] == "regression" else like.new_zeros(
            2, dtype=torch.long)
        net_sites = None
        if net is None:
            build_model = self.model_factory(state["in_dim"], state["out_dim"], state["task"],
                                             model_kw, like)
        else:
            build_model, net_sites = self.net_model_factory(net, state["task"], model_kw, like)
            expected = tuple((name, tuple(shape)) for name, shape in saved_sites)
            if net_sites != expected:
                raise ValueError(f"Expected net to have the parameters saved in {source}, "
                                 f"{_describe(expected)}, but it has {_describe(net_sites)}.")
        posterior = method.restore(build_model, state["posterior"], x=like, y=y_like)
        if state["validated_noise_scale"] is not None:
            posterior = NoiseTunedPosterior(posterior, state["validated_noise_scale"])
        return Fitted(self.name, state["task"], x_scaler, y_scaler, posterior,
                      state["fit_seconds"], state["in_dim"], state["out_dim"], options,
                      in_shape, net_sites)


def _describe(sites: tuple[tuple[str, tuple[int, ...]], ...]) -> str:
    """Parameter names and shapes, e.g. ``0.weight (8, 1, 3, 3), 0.bias (8,)``."""
    return ", ".join(f"{name} {shape}" for name, shape in sites)
