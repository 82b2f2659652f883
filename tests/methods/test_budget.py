"""The training budget reaches the runner whole: every field of :class:`Budget` is either
honoured by a method (it arrives at the runner with the budget's value) or refused by name
(a ``ValueError`` naming the field and the method), never dropped."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import pyro.infer
import pytest
import torch

from bnn_zoo import zoo
from bnn_zoo._core.replicas import REPLICA_CHECK_EVERY
from bnn_zoo.methods import _base as base
from bnn_zoo.methods import _gp as gp
from bnn_zoo.methods._base import Budget
from bnn_zoo.methods._gp import fit_evidence
from bnn_zoo.models._nngp import NNGPRegression

#: A value of each field other than the one in BASE.
VALUES = {"steps": 3, "lr": 0.02, "lr_schedule": "cosine", "batch_size": 8,
          "num_particles": 2, "kl_weighting": "graves", "jit": True, "distributed": True,
          "check_every": 2}
BASE = Budget(steps=1, lr=0.01, batch_size=None)


@dataclass(frozen=True)
class Case:
    entry: str
    call: str  # "fit" or "fit_many"
    method: str  # how the refusal names the method
    refused: tuple[str, ...]


LAPLACE_REFUSES = ("num_particles", "kl_weighting", "distributed")
CASES = [
    Case("bbb", "fit", "SVI", ()),
    Case("bbb", "fit_many", "SVI.fit_many", ("distributed",)),
    Case("laplace", "fit", "Laplace", LAPLACE_REFUSES),
    Case("laplace", "fit_many", "Laplace", LAPLACE_REFUSES),
    Case("nngp", "fit", "ExactGP",
         ("lr_schedule", "batch_size", "num_particles", "kl_weighting", "jit", "distributed")),
    Case("nuts", "fit", "NUTS", ("distributed",)),
    Case("deep_ensemble", "fit", "Ensemble", ()),
    Case("laplace_ensemble", "fit", "Laplace", LAPLACE_REFUSES),
]


class Reached(Exception):
    """Raised by the spied runners: the run was about to start."""


def test_the_cases_cover_every_budget_field():
    assert set(VALUES) == {f.name for f in fields(Budget)}
    assert all(getattr(BASE, name) != value for name, value in VALUES.items())


def _spy_runners(monkeypatch: pytest.MonkeyPatch) -> dict:
    """Replace the runners a method can reach by recorders of their keywords."""
    seen: dict = {}

    def record(*args, **kwargs):
        seen.update(kwargs, args=args)
        raise Reached

    for module, name in ((base, "fit"), (base, "fit_single_pairs"), (gp, "fit_evidence")):
        monkeypatch.setattr(module, name, record)
    return seen


def _call(case: Case, budget: Budget) -> None:
    entry = zoo.get(case.entry)
    x, y = torch.randn(12, 2), torch.randn(12)
    build_model = entry.model_factory(2, 1, "regression", {}, x)
    options = {"task": "regression", "budget": budget, "progress": False}
    if case.call == "fit":
        entry.method.fit(build_model, x, y, seed=0, **options)
    else:
        entry.method.fit_many(build_model, torch.stack([x, x]), torch.stack([y, y]),
                              seeds=[0, 1], **options)


@pytest.mark.parametrize("field", sorted(VALUES))
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.entry}.{c.call}")
def test_each_budget_field_is_honoured_or_refused_by_name(case, field, monkeypatch):
    seen = _spy_runners(monkeypatch)
    budget = replace(BASE, **{field: VALUES[field]})
    if field in case.refused:
        with pytest.raises(ValueError, match=rf"{case.method} does not support {field}="):
            _call(case, budget)
        assert not seen
        return
    with pytest.raises(Reached):
        _call(case, budget)
    assert seen[field] == VALUES[field]


def test_validation_is_the_entrys_and_no_budget_field():
    """The held-out points are the entry's (``Entry.fit(..., validation=...)``): a budget
    has no such field, so no method sees or refuses one."""
    with pytest.raises(TypeError, match="validation"):
        Budget(validation=0.25)
    with pytest.raises(ValueError, match="validation"):
        zoo.get("map").fit(torch.randn(8, 2), torch.randn(8), validation=1.5)


def test_the_entry_fits_the_method_without_the_held_out_points(monkeypatch):
    seen = _spy_runners(monkeypatch)
    x, y = torch.randn(20, 2), torch.randn(20)
    with pytest.raises(Reached):
        zoo.get("map").fit(x, y, seed=0, steps=1, batch_size=None, validation=0.25)
    _, _, x_fit, y_fit = seen["args"]  # fit(model, guide, x, y, ...)
    assert x_fit.shape == (15, 2) and y_fit.shape == (15,)  # a quarter of 20 held out


def test_svi_trains_with_the_budgets_particles():
    created = []

    class CountingELBO(pyro.infer.Trace_ELBO):
        def __init__(self, **options):
            created.append(options)
            super().__init__(**options)

    entry = zoo.get("bbb")
    x, y = torch.randn(12, 2), torch.randn(12)
    method = replace(entry.method, elbo=CountingELBO)
    method.fit(entry.model_factory(2, 1, "regression", {}, x), x, y, task="regression",
               seed=0, budget=replace(BASE, num_particles=3), progress=False)
    assert [(o["num_particles"], o["vectorize_particles"]) for o in created] == [(3, True)]


def test_check_interval_is_the_runners_default_unless_set():
    assert Budget().check_interval() == 1
    assert Budget().check_interval(replicas=True) == REPLICA_CHECK_EVERY
    assert Budget(check_every=7).check_interval() == 7
    assert Budget(check_every=7).check_interval(replicas=True) == 7


def test_check_supported_refuses_an_unknown_field():
    with pytest.raises(TypeError, match="no field 'particles'"):
        Budget().check_supported("SVI", particles=1)


def test_exact_gp_reads_back_every_check_every_steps_with_the_same_losses():
    x = torch.linspace(-1, 1, 10, dtype=torch.float64)[:, None]
    y = torch.sin(3 * x[:, 0])
    every_step = fit_evidence(NNGPRegression(1).double(), x, y, steps=6, lr=0.05, seed=0)
    batched = fit_evidence(NNGPRegression(1).double(), x, y, steps=6, lr=0.05, seed=0,
                           check_every=4)
    assert len(batched.losses) == 6
    torch.testing.assert_close(torch.tensor(batched.losses), torch.tensor(every_step.losses))
