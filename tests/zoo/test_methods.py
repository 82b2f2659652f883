"""What an entry asks of its method: the capabilities the ``Method`` protocol declares
(``guide``, ``streams``, ``replicas``, ``fit_many``), read without probing; a configured
method instance given to ``entry.fit(..., method=...)``; and the option names that models
and guides declare, which are the keywords they take."""

from __future__ import annotations

import inspect
import pickle

import pyro
import pytest
import torch

from bnn_zoo import zoo
from bnn_zoo._core.elbo import LocalReparameterizationELBO
from bnn_zoo.methods._base import Budget
from bnn_zoo.methods._ensemble import Ensemble
from bnn_zoo.methods._options import Factory
from bnn_zoo.methods._svi import SVI
from bnn_zoo.methods.laplace import Laplace
from bnn_zoo.models._module import BayesianModule
from bnn_zoo.zoo import TINY_BUDGET
from bnn_zoo.zoo._defaults import map_guide
from bnn_zoo.zoo._networks import NET_MODEL_OPTIONS


@pytest.mark.parametrize("name", zoo.names())
def test_every_method_declares_what_callers_ask_of_it(name):
    method = zoo.get(name).method
    assert isinstance(method.streams, bool) and isinstance(method.replicas, bool)
    assert method.guide is None or callable(method.guide)
    assert callable(method.fit_many)


def test_a_method_without_replicas_says_so_through_fit_many():
    x, y = torch.zeros(1, 4, 1), torch.zeros(1, 4)
    method = zoo.get("nuts").method
    assert not method.replicas and not method.streams and method.guide is None
    with pytest.raises(ValueError, match="NUTS does not train fits as replicas"):
        method.fit_many(lambda: None, x, y, task="regression", seeds=[0], budget=Budget(),
                        progress=False)
    assert zoo.get("swag").method.guide is zoo.get("map").method.guide


def _problem() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(24, 2, generator=gen, dtype=torch.float64)
    return x, torch.sin(x.sum(-1)) + 0.1 * torch.randn(24, generator=gen, dtype=torch.float64)


def _predict(fitted: zoo.Fitted, x: torch.Tensor) -> torch.Tensor:
    pyro.set_rng_seed(1)
    return fitted.predict(x, num_samples=4).mean


def test_a_method_instance_is_the_method_its_options_give(tmp_path):
    x, y = _problem()
    entry = zoo.get("laplace_kron")
    typed = entry.fit(x, y, method=Laplace(curvature="kron", evidence="fixed_point",
                                           holdout="auto", refine=False), **TINY_BUDGET)
    text = entry.fit(x, y, method_options={"refine": False}, **TINY_BUDGET)
    assert typed.options["method_options"] == text.options["method_options"] == {
        "refine": False}
    assert torch.equal(_predict(typed, x), _predict(text, x))
    typed.save(tmp_path / "kron.pt")
    assert torch.equal(_predict(zoo.load(tmp_path / "kron.pt"), x), _predict(typed, x))


def test_a_method_instance_takes_guide_options_as_the_dict_does():
    x, y = _problem()
    entry = zoo.get("bbb")
    method = SVI(entry.guide, elbo=LocalReparameterizationELBO, replicas=True,
                 guide_options={"init_scale": 0.05})
    typed = entry.fit_many([x, x], [y, y], seeds=[0, 1], method=method, **TINY_BUDGET)
    text = entry.fit_many([x, x], [y, y], seeds=[0, 1], guide_options={"init_scale": 0.05},
                          **TINY_BUDGET)
    assert typed[1].options["method_options"] == {"guide_options": {"init_scale": 0.05}}
    assert all(torch.equal(_predict(a, x), _predict(b, x)) for a, b in zip(typed, text))
    assert zoo.batches_replicas(entry, method=method)


@pytest.mark.parametrize("name,method", [("bbb", Laplace()), ("rff_logitnormal", SVI(map_guide)),
                                         ("laplace", Ensemble(Laplace()))])
def test_a_method_of_another_class_is_refused_by_name(name, method):
    x, y = _problem()
    expected = type(zoo.get(name).method).__name__
    with pytest.raises(TypeError, match=rf"Expected method to be a .*\.{expected} \(the "
                       rf"method of entry '{name}'\), but got {type(method).__name__}"):
        zoo.get(name).fit(x, y, method=method, **TINY_BUDGET)


def _keywords(build: object, inputs: set[str]) -> tuple[set[str], bool]:
    """The keyword names of ``build``'s signature but its ``inputs``, and whether it also
    takes ``**options``."""
    params = inspect.signature(build).parameters.values()
    named = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return named - inputs, any(p.kind is p.VAR_KEYWORD for p in params)


def _check_declared(factory: Factory, inputs: set[str]) -> None:
    named, more = _keywords(factory.build, inputs)
    if factory.options is None:  # any option: the factory passes on what it does not name
        assert more
    else:
        assert named == set(factory.options) and set(factory.defaults) <= named


@pytest.mark.parametrize("name", zoo.names())
def test_the_declared_options_are_those_the_factories_take(name):
    """The names a model or guide declares are its signature's: an option is refused by
    name before anything is built, and one it takes never is."""
    entry = zoo.get(name)
    _check_declared(entry.model, {"in_dim", "out_dim", "task"})
    if entry.guide is not None:
        _check_declared(entry.guide, {"model"})


def test_a_network_takes_the_options_of_bayesian_module():
    named, _ = _keywords(BayesianModule, {"net", "task"})
    assert set(NET_MODEL_OPTIONS) == named


@pytest.mark.parametrize("name", zoo.names())
def test_declared_factories_and_methods_survive_pickling(name):
    """A sweep sends options holding methods and factories to its workers by pickle."""
    entry = zoo.get(name)
    assert pickle.loads(pickle.dumps(entry.model)) == entry.model
    assert pickle.loads(pickle.dumps(entry.method)) == entry.method
