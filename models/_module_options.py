"""What [`BayesianModule`][bnn_zoo.models.BayesianModule] makes of a network's tensors: which
parameters are random and under which prior, which are point estimates, and the state
(batch-norm running statistics) that the forward pass updates.

* **Selectors.** A parameter is picked by its name as ``net.named_parameters()`` gives it
  (``"0.weight"``), by the name of a submodule holding it (``"0"``, ``"features.1"``;
  ``""`` is the whole net) or by a module type (``nn.BatchNorm2d``: every parameter of a
  module of that type).
* **Deterministic parameters** (TyXe's ``hide``): point estimates, ``PyroParam``s of the
  model learned with the guide by SVI (a parameter with ``requires_grad=False`` stays a
  constant at its value). By default the parameters of batch-norm layers
  (`DEFAULT_DETERMINISTIC`) are point estimates and every other parameter is random.
* **Priors per parameter** (TyXe's layer-wise priors): one prior for all, a mapping from
  selectors to priors (the most specific selector wins: a parameter's own name, then the
  deepest module name, then a type; unmatched parameters take ``N(0, 1)``), or a function
  ``(name, tensor) -> prior``.
* **Buffers** (running statistics): copied from the net into the model at construction,
  so the model's ``state_dict`` saves them and the user's net is never changed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping

import torch
from pyro.nn import PyroModule, PyroParam
from torch import Tensor, nn

from bnn_zoo.models._priors import GaussianPrior, ScaleMixturePrior, TorchFanInPrior

__all__ = ["DEFAULT_DETERMINISTIC", "NetState", "Prior", "PriorOption", "Selector",
           "mean_buffers", "net_mode", "select_deterministic", "site_priors"]

#: Picks parameters: a parameter name, a submodule name, or a module type.
Selector = str | type
Prior = GaussianPrior | ScaleMixturePrior
#: What ``BayesianModule(prior=...)`` takes (see the module doc).
PriorOption = Prior | Mapping[Selector, Prior] | Callable[[str, Tensor], Prior] | None
#: The layers whose parameters are point estimates unless ``deterministic=`` says otherwise.
DEFAULT_DETERMINISTIC: tuple[type, ...] = (nn.modules.batchnorm._BatchNorm,)


def _specificity(selector: object, name: str, net: nn.Module) -> int | None:
    """How specifically ``selector`` picks the parameter ``name`` of ``net`` (larger is more
    specific; ``None``: it does not pick it): its own name beats any module name, a deeper
    module beats a shallower one, and any name beats a type."""
    owner = name.rpartition(".")[0]
    if isinstance(selector, str):
        if selector == name:
            return 10**6
        if selector == "" or owner == selector or owner.startswith(selector + "."):
            return 1 + selector.count(".") + (selector != "")
        return None
    if isinstance(selector, type):
        path = owner.split(".") if owner else []
        modules = [net] + [net.get_submodule(".".join(path[:i + 1])) for i in range(len(path))]
        return 0 if any(isinstance(m, selector) for m in modules) else None
    raise TypeError(f"Expected a selector to be a parameter or module name (str) or a module "
                    f"type, but got {selector!r}.")


def _check_selectors(option: str, selectors: Iterable[object], net: nn.Module) -> None:
    """Refuse a name that is neither a parameter nor a module of ``net``."""
    params = {name for name, _ in net.named_parameters()}
    modules = {name for name, _ in net.named_modules()}
    for selector in selectors:
        if isinstance(selector, str) and selector not in params | modules:
            raise ValueError(f"{option} names {selector!r}, which is neither a parameter nor a "
                             f"module of net (its parameters: {sorted(params)}).")
        if not isinstance(selector, (str, type)):
            raise TypeError(f"Expected {option} to hold parameter or module names (str) or "
                            f"module types, but got {selector!r}.")


def select_deterministic(net: nn.Module, deterministic: Iterable[Selector] | None
                         ) -> set[str]:
    """The names of the parameters of ``net`` that ``deterministic`` picks (``None``: those
    of `DEFAULT_DETERMINISTIC`; ``()``: none)."""
    if deterministic is None:
        selectors: tuple = DEFAULT_DETERMINISTIC
    elif isinstance(deterministic, (str, type)):
        selectors = (deterministic,)
    else:
        selectors = tuple(deterministic)
    _check_selectors("deterministic", selectors, net)
    return {name for name, _ in net.named_parameters()
            if any(_specificity(s, name, net) is not None for s in selectors)}


def _checked_prior(prior: object, name: str) -> Prior:
    """``prior`` if it is one the model takes, a fan-in Gaussian read in torch's layout."""
    if not isinstance(prior, (GaussianPrior, ScaleMixturePrior)):
        raise TypeError(f"Expected the prior of {name!r} to be GaussianPrior or "
                        f"ScaleMixturePrior, but got {prior!r}.")
    if isinstance(prior, GaussianPrior) and prior.fan_in and not isinstance(prior,
                                                                           TorchFanInPrior):
        return TorchFanInPrior(scale=prior.scale, fan_in=True)
    return prior


def site_priors(prior: object, net: nn.Module, names: Iterable[str]) -> dict[str, Prior]:
    """The prior of each parameter ``names`` of ``net``: ``prior`` is one prior (``None``:
    ``N(0, 1)``), a mapping from selectors to priors, or a function ``(name, tensor) ->
    prior`` (see the module doc)."""
    names = list(names)
    if prior is None or isinstance(prior, (GaussianPrior, ScaleMixturePrior)):
        one = _checked_prior(GaussianPrior() if prior is None else prior, "every parameter")
        return dict.fromkeys(names, one)
    if isinstance(prior, Mapping):
        _check_selectors("prior", prior, net)
        out = {}
        for name in names:
            ranked = [(rank, value) for key, value in prior.items()
                      if (rank := _specificity(key, name, net)) is not None]
            best = max(ranked, key=lambda pair: pair[0])[1] if ranked else GaussianPrior()
            out[name] = _checked_prior(best, name)
        return out
    if callable(prior):
        return {name: _checked_prior(prior(name, net.get_parameter(name)), name)
                for name in names}
    raise TypeError("Expected prior to be a GaussianPrior, a ScaleMixturePrior, a mapping "
                    f"from parameter or module names (or types) to priors, or a function "
                    f"(name, tensor) -> prior, but got {prior!r}.")


def _key(name: str) -> str:
    """A net's tensor name as an attribute of [`NetState`][] (no dots allowed there)."""
    return name.replace(".", "/")


class NetState(PyroModule):
    """The tensors of a net that are not sampled: its deterministic parameters (learned
    ``PyroParam``s, or constant buffers where ``requires_grad=False``) and its buffers
    (running statistics), copied from the net, stored under the net's names with ``/`` for
    ``.`` (``"1/running_mean"``) so that the model's ``state_dict`` saves them."""

    def __init__(self, net: nn.Module, deterministic: set[str]) -> None:
        super().__init__()
        self.learned, self.constant = [], []
        for name, param in net.named_parameters():
            if name in deterministic:
                value = param.detach().clone()
                if param.requires_grad:
                    setattr(self, _key(name), PyroParam(value))
                    self.learned.append(name)
                else:
                    self.register_buffer(_key(name), value)
                    self.constant.append(name)
        self.buffer_names = [name for name, _ in net.named_buffers()]
        for name, buffer in net.named_buffers():
            self.register_buffer(_key(name), buffer.detach().clone())

    def parameter_values(self) -> dict[str, Tensor]:
        """The deterministic parameters by the net's names (inside a Pyro context the
        learned ones are ``pyro.param`` sites)."""
        return {name: getattr(self, _key(name)) for name in self.learned + self.constant}

    def buffers_by_name(self) -> dict[str, Tensor]:
        """The running statistics by the net's names."""
        return {name: self._buffers[_key(name)] for name in self.buffer_names}

    @torch.no_grad()
    def set_buffers(self, values: Mapping[str, Tensor]) -> None:
        """Overwrite the running statistics with ``values`` (by the net's names)."""
        for name, value in values.items():
            self._buffers[_key(name)].copy_(value)


@contextlib.contextmanager
def net_mode(net: nn.Module, train: bool) -> Iterator[None]:
    """``net`` (and every submodule) in train (``True``) or eval mode while the context
    runs; each module's own mode restored afterwards."""
    saved = [(module, module.training) for module in net.modules()]
    net.train(train)
    try:
        yield
    finally:
        for module, mode in saved:
            module.training = mode


def mean_buffers(batched: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """One value per running statistic from per-sample values (S, ...): the mean over the
    samples for floating tensors, the first sample's for counters (``num_batches_tracked``,
    the same in every sample)."""
    return {name: value.mean(0) if value.is_floating_point() else value[0]
            for name, value in batched.items()}

