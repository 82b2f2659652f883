"""Zoo entries: an [`Entry`][] declares a model factory, an inference method
(`bnn_zoo.methods`), a budget, and the paper it implements.

[`Entry.fit`][bnn_zoo.zoo.Entry.fit] prepares the data (`bnn_zoo.zoo._preparation`: checked,
standardised with the training statistics), fits the method on it and wraps the posterior in a
[`Fitted`][bnn_zoo.zoo.Fitted], which maps predictions back to the caller's units.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from functools import partial
from types import MappingProxyType
from typing import Any

import pyro
import torch
from torch import Tensor, nn

from bnn_zoo._core.batches import first_inputs, is_loader
from bnn_zoo._core.checks import check_bool, check_fraction, check_seed
from bnn_zoo._core.scaling import Standardizer
from bnn_zoo._core.tasks import task_named
from bnn_zoo.evaluation._noise_tuning import NoiseTunedPosterior, tune_noise
from bnn_zoo.methods._base import Budget, Method, ModelFactory, UnsupportedProblem
from bnn_zoo.methods._ensemble import Ensemble
from bnn_zoo.methods._options import as_factory, check_keywords, keywords
from bnn_zoo.models._module import BayesianModule
from bnn_zoo.zoo._fitted import Fitted
from bnn_zoo.zoo._networks import (
    NET_MODEL_OPTIONS,
    Network,
    net_model_defaults,
    net_outputs,
    network_builder,
)
from bnn_zoo.zoo._preparation import (
    TrainingData,
    check_inputs,
    check_targets,
    loader_training_data,
    output_dim,
    training_data,
)
from bnn_zoo.zoo._replicas import training_sets

__all__ = ["TINY_BUDGET", "Entry", "batches_replicas"]

#: The budget overrides of a fit that takes seconds (the default of `Entry.tiny`): a
#: few full-batch steps, untraced.
TINY_BUDGET: Mapping[str, Any] = MappingProxyType({"steps": 4, "batch_size": None, "jit": False})


@dataclass(frozen=True)
class Entry:
    """A registered model and inference method.

    ``model(in_dim, out_dim, *, task, **model_options)`` builds the Pyro model (a
    `Factory` declares the ``model_options`` it takes),
    ``method`` (a dataclass of `bnn_zoo.methods`) fits it, ``budget`` is the
    training budget for every data set. ``source`` cites the paper the entry implements
    (authors, year, title) and ``notes`` the lecture or study notes it follows, if any
    (author and title). ``tiny`` holds the keywords of [`fit`][] that make a
    fit take seconds (budget overrides, and ``method_options`` shrinking the method's own
    sizes: chains, members): what the contract test fits every entry with.
    ``tunable_noise`` marks an entry whose regression predictive is a mixture
    ``1/S sum_s N(f_s(x), sigma^2)`` with one learned ``sigma``, which
    ``fit(..., validation=...)`` may replace by a held-out optimum (not so where the
    predictive variance has an epistemic part in closed form, as in Laplace's GLM predictive
    or a GP).
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
    notes: str | None = None
    tiny: Mapping[str, Any] = field(default_factory=partial(dict, TINY_BUDGET))
    tunable_noise: bool = False
    accepts_net: bool = False

    @property
    def guide(self) -> Callable[..., Callable] | None:
        """The SVI guide factory ``guide(model, **guide_options)`` of the method, or
        ``None`` where the method trains no guide of its own (NUTS, exact GP)."""
        return self.method.guide

    @property
    def model_keywords(self) -> tuple[str, ...] | None:
        """The ``model_options`` the entry's model declares (``None``: any, a plain
        callable; see `Factory`)."""
        return as_factory(self.model).options

    def configure(self, model_options: Mapping[str, Any] | None = None,
                  guide_options: Mapping[str, Any] | None = None,
                  method_options: Mapping[str, Any] | None = None, *, net: bool = False
                  ) -> tuple[dict[str, Any], Method]:
        """The checked model options and the method with ``method_options`` (fields of its
        dataclass) and ``guide_options`` in place; unknown keys raise a ``ValueError``.
        With ``net=True`` the model options are those of [`BayesianModule`][], on top
        of the entry's own defaults for them (see `net_model_defaults`)."""
        if net:
            model_options = {**net_model_defaults(self.model), **check_keywords(
                "model_options (with net=)", model_options or {}, NET_MODEL_OPTIONS)}
        else:
            model_options = check_keywords("model_options", model_options or {},
                                           self.model_keywords)
        method_options = check_keywords("method_options", method_options or {},
                                        set(keywords(self.method)))
        if method_options:
            method = replace(self.method, **{**keywords(self.method), **method_options})
        else:
            method = self.method
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
                          like: Tensor, classes: int) -> tuple[ModelFactory, tuple, int]:
        """``build_model(**overrides)`` of a fit with ``net=``: a fresh
        [`BayesianModule`][] on the network (see
        `network_builder`), the ``(name, shape)`` of the
        network's parameters and its number of outputs, read from one model built here
        and applied to the inputs ``like`` (`net_outputs`,
        at least ``classes`` for classification), so that a bad network or option is
        refused before any fit."""
        make_net = network_builder(net, like)

        def build_model(**overrides: Any) -> BayesianModule:
            return BayesianModule(make_net(), task=task, **{**model_options, **overrides})

        model = build_model()
        return build_model, tuple(model.sites), net_outputs(model.net, like, task, classes)

    def settings(self, model_options: Mapping[str, Any] | None,
                 guide_options: Mapping[str, Any] | None,
                 method_options: Mapping[str, Any] | None,
                 budget_overrides: Mapping[str, Any], *, method: Method | None = None,
                 validation: float = 0.0, net: bool = False
                 ) -> tuple[dict[str, dict[str, Any]], dict[str, Any], Method, Budget]:
        """The checked options of a fit (as [`Fitted`][] records them: a ``method``
        instance as the ``method_options`` that make it from the entry's own, see
        [`method_fields`][]), the model options, the configured method
        ([`configure`][]) and the budget with ``budget_overrides`` (fields of
        [`Budget`][]) in place; ``validation`` is checked here, applied by [`fit`][]."""
        overrides = check_keywords("budget option", budget_overrides,
                                   {f.name for f in fields(Budget)})
        options = {name: check_keywords(name, value or {}, None) for name, value in
                   (("model_options", model_options), ("guide_options", guide_options),
                    ("method_options", method_options))}
        if method is not None:
            options["method_options"] = {**self.method_fields(method),
                                         **options["method_options"]}
        model_kw, method = self.configure(**options, net=net)
        check_fraction("validation", validation)
        if validation > 0 and model_kw.get("noise") == "heteroscedastic":
            raise ValueError("validation tunes one noise scale, and a heteroscedastic model "
                             "has one per point: expected validation=0 with "
                             "noise='heteroscedastic'.")
        return options, model_kw, method, replace(self.budget, **overrides)

    def method_fields(self, method: Method) -> dict[str, Any]:
        """The fields in which ``method``, a configured instance of the entry's method
        class, differs from the entry's method: the ``method_options`` that give it (a
        ``TypeError`` for a method of another class)."""
        expected = type(self.method)
        if type(method) is not expected:
            raise TypeError(f"Expected method to be a {expected.__module__}."
                            f"{expected.__qualname__} (the method of entry {self.name!r}), "
                            f"but got {type(method).__name__}.")
        own = keywords(self.method)
        return {name: value for name, value in keywords(method).items() if value != own[name]}

    def fit(self, x: Tensor | Iterable, y: Tensor | None = None, *, task: str | None = None,
            seed: int = 0, progress: bool | None = False,
            model_options: Mapping[str, Any] | None = None,
            guide_options: Mapping[str, Any] | None = None,
            method_options: Mapping[str, Any] | None = None, method: Method | None = None,
            validation: float = 0.0, net: Network | None = None, num_data: int | None = None,
            **budget_overrides: Any) -> Fitted:
        """Standardise with the training statistics, fit the method, and wrap the result.

        ``x``, ``y``: tensors (or numpy arrays) of the training set in its own units
        (regression targets floats of shape (N,) or (N, D); class labels integers 0..C-1),
        or ``x`` a loader of ``(x, y)`` batches with ``y=None``, for data that does not fit
        in memory. Everything runs on the device and in the dtype of ``x``.

        ``method``: an instance of the entry's method class (``Laplace(curvature="kron")``)
        in place of its own; ``method_options``, ``model_options`` and ``guide_options``:
        fields of the method and options of the model and guide factories, by name;
        ``budget_overrides``: fields of [`Budget`][bnn_zoo.methods.Budget] (``steps``,
        ``lr``, ...). ``validation > 0`` (regression, entries with ``tunable_noise``) holds
        that fraction of the points out of the fit and tunes the predictive's noise scale on
        them ([`bnn_zoo.evaluation.tune_noise`][]). ``net`` (entries with ``accepts_net``):
        a ``torch.nn.Module``, or a factory of one, that the entry makes Bayesian as a
        [`BayesianModule`][bnn_zoo.models.BayesianModule]. ``distributed=True``: ``x`` and
        ``y`` are this process's shard of a data-parallel fit ([`bnn_zoo.distributed`][]).

        Every value is checked before any work; what an entry cannot honour (a loader for
        NUTS, ``net`` for an entry without ``accepts_net``) raises
        [`UnsupportedProblem`][bnn_zoo.methods.UnsupportedProblem]. The user guide's pages
        on fitting, loaders and your own network hold the details.
        """
        if net is not None and not self.accepts_net:
            raise UnsupportedProblem(
                f"Entry {self.name!r} ({self.description}) does not take a user's network "
                "(net=): its method works only on the entry's own model.")
        seed = check_seed("seed", seed)
        check_bool("progress", progress, allow_none=True)
        options, model_kw, method, budget = self.settings(
            model_options, guide_options, method_options, budget_overrides, method=method,
            validation=validation, net=net is not None)
        if is_loader(x, y):
            self._check_streams(method, budget_overrides)
            budget = replace(budget, batch_size=None)
        task, data, out_dim = self._training_data(x, y, task, budget, validation, seed,
                                                  net=net is not None, num_data=num_data)
        if isinstance(net, nn.Module) and isinstance(method, Ensemble) and method.members > 1:
            raise ValueError(f"Expected net to be a factory for entry {self.name!r}: its "
                             f"{method.members} members would all start at the one module's "
                             "weights; pass net=lambda: MyNet() so that each starts apart.")
        like = first_inputs(data.x)
        in_shape = net_sites = None
        if net is None:
            build_model = self.model_factory(like.shape[1], out_dim, task, model_kw, like)
        else:
            in_shape = tuple(like.shape[1:])
            build_model, net_sites, out_dim = self.net_model_factory(net, task, model_kw,
                                                                     like, out_dim)
        pyro.set_rng_seed(seed)
        started = time.perf_counter()
        posterior = method.fit(build_model, data.x, data.y, task=task, seed=seed,
                               budget=budget, progress=progress)
        if data.validation is not None:
            posterior = tune_noise(posterior, *data.validation, distributed=budget.distributed)
        return Fitted(self.name, task, data.x_scaler, data.y_scaler, posterior,
                      time.perf_counter() - started, like[0].numel(), out_dim, options,
                      in_shape, net_sites)

    def _training_data(self, x: object, y: object, task: str | None, budget: Budget,
                       validation: float, seed: int, *, net: bool, num_data: int | None
                       ) -> tuple[str, TrainingData, int]:
        """The task, the prepared data (`bnn_zoo.zoo._preparation`) and the number of
        outputs of a fit on ``x``, ``y``, or on the loader ``x``."""
        if is_loader(x, y):
            return loader_training_data(self.name, self.tasks, x, y, task, budget, validation,
                                        net=net, num_data=num_data)
        if num_data is not None:
            raise ValueError("num_data is the size of a loader's data set; with tensors x, y "
                             "it is len(x): expected num_data=None.")
        x, y = check_inputs(self.name, x, y, net=net)
        task, y = check_targets(self.name, self.tasks, y, task)
        data = training_data(x, y, task, budget, validation, seed, entry=self.name,
                             tunable_noise=self.tunable_noise)
        return task, data, output_dim(task, y, distributed_fit=budget.distributed)

    def _check_streams(self, method: Method, budget_overrides: Mapping[str, Any]) -> None:
        """Refuse a loader where the method needs all the data at once (it does not
        declare ``streams``), or where a batch size is asked for (the loader sets it)."""
        if not method.streams:
            raise UnsupportedProblem(
                f"Entry {self.name!r} ({self.description}) cannot fit from a loader: its "
                f"method {type(method).__name__} needs all the training data in memory at "
                "once; expected tensors x, y.")
        if budget_overrides.get("batch_size") is not None:
            raise ValueError("Expected no batch_size with a loader for x: the loader sets "
                             f"the batches, but got batch_size={budget_overrides['batch_size']!r}.")

    def fit_many(self, xs: object, ys: object, *, seeds: Sequence[int],
                 task: str | None = None, progress: bool | None = False,
                 model_options: Mapping[str, Any] | None = None,
                 guide_options: Mapping[str, Any] | None = None,
                 method_options: Mapping[str, Any] | None = None, method: Method | None = None,
                 validation: float = 0.0, net: Network | None = None,
                 **budget_overrides: Any) -> list[Fitted]:
        """R independent fits: fit ``r`` on ``xs[r]``, ``ys[r]`` (see
        `training_sets`) from ``seeds[r]``; the options are
        those of [`fit`][]. Fits of a user's network (``net``) run one by one.

        Each [`Fitted`][bnn_zoo.zoo.Fitted] behaves as one from [`fit`][]. Where the entry
        batches ([`batches_replicas`][]), fit ``r`` starts from the initial values of
        ``fit(xs[r], ys[r], seed=seeds[r])`` and follows its trajectory up to round-off
        when the fit is deterministic (MAP on full batches); in general every fit takes the
        minibatch order of ``seeds[0]`` and noise of its own, so fits agree with [`fit`][]
        in distribution. Its ``fit_seconds`` is the batch's wall time shared equally. For
        classification the number of classes is that of all the sets together.
        """
        xs, ys, seeds = training_sets(xs, ys, seeds, any_shape=net is not None)
        check_bool("progress", progress, allow_none=True)
        options, model_kw, method, budget = self.settings(
            model_options, guide_options, method_options, budget_overrides, method=method,
            validation=validation, net=net is not None)
        if not _batches(method, budget) or net is not None:
            return [self.fit(x, y, task=task, seed=seed, progress=progress, net=net,
                             validation=validation, **options, **budget_overrides)
                    for x, y, seed in zip(xs, ys, seeds)]
        task, _ = check_targets(self.name, self.tasks, ys[0], task, "ys[0]")
        ys = [check_targets(self.name, self.tasks, y, task, f"ys[{r}]")[1]
              for r, y in enumerate(ys)]
        prepared = [training_data(x, y, task, budget, validation, seed, entry=self.name,
                                  tunable_noise=self.tunable_noise)
                    for x, y, seed in zip(xs, ys, seeds)]
        x = torch.stack([p.x for p in prepared])
        y = torch.stack([p.y for p in prepared])
        out_dim = output_dim(task, y.flatten(0, 1))  # the R sets stacked: one set of R N rows
        build_model = self.model_factory(x.shape[-1], out_dim, task, model_kw, x)
        started = time.perf_counter()  # what fit times: the method and the noise tuning
        posteriors = method.fit_many(build_model, x, y, task=task, seeds=seeds, budget=budget,
                                     progress=progress)
        posteriors = [posterior if p.validation is None else tune_noise(posterior, *p.validation)
                      for posterior, p in zip(posteriors, prepared)]
        seconds = (time.perf_counter() - started) / len(seeds)
        return [Fitted(self.name, task, p.x_scaler, p.y_scaler, posterior, seconds,
                       x.shape[-1], out_dim, options) for p, posterior in zip(prepared, posteriors)]

    def restore(self, state: dict, *, source: str = "<state>",
                net: Network | None = None) -> Fitted:
        """The [`Fitted`][] of a saved ``state`` (see
        [`Fitted.save`][bnn_zoo.zoo.Fitted.save]), rebuilt through this entry's factories,
        or on ``net`` (a module or a factory of the network the fit was saved from) for a fit with
        ``net=``; ``source`` names the file
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
        y_like = task_named(state["task"]).like(like)
        net_sites = None
        if net is None:
            build_model = self.model_factory(state["in_dim"], state["out_dim"], state["task"],
                                             model_kw, like)
        else:
            build_model, net_sites, _ = self.net_model_factory(net, state["task"], model_kw,
                                                               like, state["out_dim"])
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


def _batches(method: Method, budget: Budget) -> bool:
    """Whether a fit of ``method`` under ``budget`` batches as replicas: the method declares
    ``replicas`` and the budget is not distributed."""
    return method.replicas and not budget.distributed


def batches_replicas(entry: Entry, *, model_options: Mapping[str, Any] | None = None,
                     guide_options: Mapping[str, Any] | None = None,
                     method_options: Mapping[str, Any] | None = None,
                     method: Method | None = None, validation: float = 0.0,
                     **budget_overrides: Any) -> bool:
    """Whether ``entry.fit_many`` with these options (those of
    [`Entry.fit`][bnn_zoo.zoo.Entry.fit]) trains
    its fits as replicas in one pass rather than one by one."""
    _, _, method, budget = entry.settings(model_options, guide_options, method_options,
                                          budget_overrides, method=method,
                                          validation=validation)
    return _batches(method, budget)


def _describe(sites: tuple[tuple[str, tuple[int, ...]], ...]) -> str:
    """Parameter names and shapes, e.g. ``0.weight (8, 1, 3, 3), 0.bias (8,)``."""
    return ", ".join(f"{name} {shape}" for name, shape in sites)
