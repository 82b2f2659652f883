"""Zoo entries on a user's network: ``entry.fit(x, y, ..., net=...)``, image-shaped inputs,
save/load of a network fit and ``compare --net cnn`` (issue 19, second half)."""

from __future__ import annotations

import math

import pyro
import pytest
import torch
from sklearn.datasets import load_digits
from torch import nn

import bnn_zoo
from bnn_zoo import data, zoo
from bnn_zoo._core.step import SVIStep
from bnn_zoo._harness import cli
from bnn_zoo.guides import BayesByBackpropGuide
from bnn_zoo.models import BayesianMLP, BayesianModule
from bnn_zoo.zoo import UnsupportedProblem, _defaults

CLASSIFICATION_METRICS = {"accuracy", "nll", "brier", "ece", "fit_seconds"}
TINY = {"steps": 3, "batch_size": 32}


def images(n: int = 90) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``n`` of scikit-learn's 8x8 digits as images (n, 1, 8, 8) and labels."""
    digits = load_digits()
    x = torch.as_tensor(digits.images[:n], dtype=torch.float32).unsqueeze(1) / 16.0
    return x, torch.as_tensor(digits.target[:n])


def tiny_cnn() -> nn.Sequential:
    """Conv2d(1, 2, 3) -> ReLU -> flatten -> Linear(72, 10): images (N, 1, 8, 8) to logits."""
    return nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU(), nn.Flatten(), nn.Linear(2 * 36, 10))


def seeded_predictive_mean(fitted: zoo.Fitted, x: torch.Tensor) -> torch.Tensor:
    pyro.set_rng_seed(1)
    return fitted.predict(x, num_samples=6).mean


def test_fit_predict_and_evaluate_take_image_batches():
    """``bnn_zoo.fit``, ``predict`` and ``evaluate`` leave the input shape to the model."""
    x, y = images(40)
    model = BayesianModule(tiny_cnn(), task="classification")
    guide = BayesByBackpropGuide(model)
    result = bnn_zoo.fit(model, guide, x, y, steps=2, batch_size=16, seed=0)
    assert len(result.losses) == 2 and all(math.isfinite(v) for v in result.losses)
    assert bnn_zoo.predict(model, guide, x, num_samples=3).mean.shape == (40, 10)
    assert CLASSIFICATION_METRICS - {"fit_seconds"} <= set(
        bnn_zoo.evaluate(model, guide, x, y, num_samples=3))
    with pytest.raises(ValueError, match="first dimension"):
        bnn_zoo.predict(model, guide, torch.tensor(1.0))


@pytest.mark.parametrize("given", ["module", "factory"])
@pytest.mark.parametrize("name", ["map", "bbb", "mean_field"])
def test_net_fit_on_images_gives_metrics(name, given):
    x, y = images()
    net = tiny_cnn()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    fitted = zoo.get(name).fit(x[:60], y[:60], seed=0, net=net if given == "module" else tiny_cnn,
                               **TINY)
    out = fitted.evaluate(x[60:], y[60:], num_samples=6)
    assert CLASSIFICATION_METRICS <= set(out)
    assert all(math.isfinite(v) for v in out.values())
    assert 0.0 <= out["accuracy"] <= 1.0
    assert fitted.in_shape == (1, 8, 8) and fitted.in_dim == 64 and fitted.out_dim == 10
    assert fitted.net_sites == (("0.weight", (2, 1, 3, 3)), ("0.bias", (2,)),
                                ("3.weight", (10, 72)), ("3.bias", (10,)))
    # Standardised elementwise: one mean and one standard deviation per pixel.
    assert fitted.x_scaler.mean.shape == (1, 8, 8)
    # The module is used as given and never changed: its values only start the guide.
    for key, value in net.state_dict().items():
        torch.testing.assert_close(value, before[key])


def test_a_factory_builds_a_fresh_net_per_model_and_is_seeded():
    x, y = images(60)
    calls = []

    def factory() -> nn.Module:
        calls.append(1)
        return tiny_cnn()

    first = zoo.get("ensemble").fit(x, y, seed=3, net=factory, method_options={"members": 2},
                                    **TINY)
    # One network to check the options and the parameters before the fit, one per member.
    assert len(calls) == 3
    second = zoo.get("ensemble").fit(x, y, seed=3, net=factory, method_options={"members": 2},
                                     **TINY)
    torch.testing.assert_close(seeded_predictive_mean(first, x), seeded_predictive_mean(second, x))


def test_net_equal_to_the_mlp_fits_as_the_mlp(monkeypatch):
    """``map`` on ``nn.Sequential(Linear, ReLU, Linear)`` and on the entry's own 2-16-1 MLP,
    both started at the same weights (the MLP's in its (d_in, d_out) layout, the module's
    transposed): the same prior (fan-in), likelihood and learned noise, a deterministic
    full-batch MAP fit, so the same losses and metrics up to float64 rounding."""
    d = data.load("sine")
    x, y = d.x_train[:40].double(), d.y_train[:40].double()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(1, 16), nn.ReLU(), nn.Linear(16, 1)).double()
    # The MLP's sites layers.l.* are the Sequential's 2l.* (the ReLU sits between).
    start = {}
    for name, value in net.named_parameters():
        index, kind = name.split(".")
        value = value.detach().clone()  # the guide trains its start in place
        start[f"layers.{int(index) // 2}.{kind}"] = value.T if kind == "weight" else value

    def init_loc_fn(model):
        if isinstance(model, BayesianMLP):
            return lambda site: start[site["name"]].expand(site["fn"].mean.shape)
        return model.init_to_net

    monkeypatch.setattr(_defaults, "init_loc_fn", init_loc_fn)
    budget = {"steps": 25, "batch_size": None, "jit": False, "seed": 0}
    own = zoo.get("map").fit(x, y, model_options={"hidden": (16,)}, **budget)
    wrapped = zoo.get("map").fit(x, y, net=net, **budget)
    assert [n for n, _ in wrapped.net_sites] == ["0.weight", "0.bias", "2.weight", "2.bias"]
    torch.testing.assert_close(torch.tensor(wrapped.result.losses),
                               torch.tensor(own.result.losses), rtol=1e-9, atol=1e-9)
    timings = {"fit_seconds", "steps_per_second"}
    pyro.set_rng_seed(1)
    own_metrics = own.evaluate(d.x_test.double(), d.y_test.double(), num_samples=4)
    pyro.set_rng_seed(1)
    net_metrics = wrapped.evaluate(d.x_test.double(), d.y_test.double(), num_samples=4)
    for key in set(own_metrics) - timings:
        assert net_metrics[key] == pytest.approx(own_metrics[key], rel=1e-9, abs=1e-12), key


REFUSING = [n for n in zoo.names() if not zoo.get(n).accepts_net]


@pytest.mark.parametrize("name", REFUSING)
def test_entries_without_a_network_raise_unsupported_problem(name):
    x, y = images(20)
    task = zoo.get(name).tasks[0]
    y = y.double() if task == "regression" else y
    with pytest.raises(UnsupportedProblem, match=f"'{name}'.*does not take a user's network"):
        zoo.get(name).fit(x.flatten(1).double(), y, task=task, net=tiny_cnn, steps=1)


def test_gp_and_random_feature_entries_refuse_a_network():
    assert {"nngp", "nngp-erf", "rff_logitnormal", "nuts"} <= set(REFUSING)
    assert {"map", "mean_field", "bbb", "lowrank", "ensemble"} <= set(
        zoo.names("classification", accepts_net=True))


class Frozen(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(64, 10)
        self.layer.bias.requires_grad_(False)

    def forward(self, x):
        return self.layer(x.flatten(1))


BAD_NET_CASES = {
    "net a number": (dict(net=3), TypeError, ["net", "torch.nn.Module", "int"]),
    "factory returning a number": (dict(net=lambda: 3), TypeError, ["net()", "int"]),
    "unknown deterministic layer": (dict(net=tiny_cnn, model_options={"deterministic": ["9"]}),
                                    ValueError, ["deterministic", "'9'", "neither"]),
    "frozen parameter": (dict(net=Frozen()), ValueError, ["'layer.bias'", "requires_grad"]),
    "MLP option": (dict(net=tiny_cnn, model_options={"hidden": (5,), "prior_scale": 2.0}),
                   ValueError, ["model_options", "'hidden'", "'prior_scale'", "noise_scale",
                                "prior"]),
    "net in float64": (dict(net=tiny_cnn().double()), ValueError,
                       ["net", "'0.weight'", "torch.float64", "torch.float32", "net.to"]),
    "net on another device": (dict(net=tiny_cnn().to("meta")), ValueError,
                              ["net", "'0.weight'", "meta", "cpu"]),
    "ensemble of one module": (dict(net=tiny_cnn(), entry="ensemble"), ValueError,
                               ["factory", "'ensemble'", "members"]),
}


@pytest.mark.parametrize("case", sorted(BAD_NET_CASES))
def test_bad_net_or_option_is_named(case):
    options, error, words = BAD_NET_CASES[case]
    options = dict(options)
    x, y = images(20)
    with pytest.raises(error) as info:
        zoo.get(options.pop("entry", "map")).fit(x, y, steps=1, **options)
    for word in words:
        assert word in str(info.value), (word, str(info.value))


@pytest.mark.parametrize("name", ["map", "laplace"])
def test_fit_many_of_a_network_on_images(name):
    """One image set (N, 1, 8, 8) with labels (N,) fitted from two seeds, or two sets: each
    fit is the entry's fit of its set with its seed."""
    x, y = images(40)
    entry = zoo.get(name)
    options = {**entry.tiny, "net": tiny_cnn}
    fits = entry.fit_many(x, y, seeds=[0, 1], **options)
    pairs = entry.fit_many([x, x.flip(-1)], [y, y], seeds=[0, 1], **options)
    for fitted, (xr, seed) in zip([*fits, *pairs], [(x, 0), (x, 1), (x, 0), (x.flip(-1), 1)]):
        assert fitted.in_shape == (1, 8, 8)
        torch.testing.assert_close(seeded_predictive_mean(fitted, x), seeded_predictive_mean(
            entry.fit(xr, y, seed=seed, **options), x))


def test_fit_many_of_a_network_takes_the_options_of_a_network_model():
    """``deterministic`` is an option of the network's model, not of the entry's MLP:
    ``fit_many`` takes it as ``fit`` does, and fits as ``fit`` does."""
    x, y = images(40)
    entry = zoo.get("map")
    options = {**entry.tiny, "net": tiny_cnn, "model_options": {"deterministic": ["0"]}}
    [fitted] = entry.fit_many(x, y, seeds=[0], **options)
    torch.testing.assert_close(seeded_predictive_mean(fitted, x),
                               seeded_predictive_mean(entry.fit(x, y, seed=0, **options), x))


def test_a_bare_module_is_a_network_for_laplace():
    """A network that is one layer (parameters ``weight`` and ``bias``, no dots in their
    names) fits under the Laplace guide, whose locations are not named as the sites."""
    x, y = images(30)
    fitted = zoo.get("laplace").fit(x.flatten(1), y, net=lambda: nn.Linear(64, 10),
                                    **zoo.get("laplace").tiny)
    assert fitted.net_sites == (("weight", (10, 64)), ("bias", (10,)))
    assert fitted.predict(x.flatten(1), num_samples=2).probs.shape == (1, 30, 10)


def test_image_inputs_need_a_network():
    x, y = images(20)
    with pytest.raises(ValueError, match=r"\(N, D\).*'bbb'.*\(20, 1, 8, 8\).*net="):
        zoo.get("bbb").fit(x, y, steps=1)
    fitted = zoo.get("bbb").fit(x, y, steps=1, net=tiny_cnn)
    with pytest.raises(ValueError, match=r"\(N, 1, 8, 8\).*got \(20, 64\)"):
        fitted.predict(x.flatten(1))
    # The flat data sets keep their (N, D) check for the entries' own models.
    with pytest.raises(ValueError, match="Expected x with 64 columns"):
        zoo.get("bbb").fit(x.flatten(1), y, steps=1).predict(x.flatten(1)[:, :10])


@pytest.mark.parametrize("name", ["map", "bbb"])
def test_save_and_load_a_network_fit(name, tmp_path):
    x, y = images(60)
    fitted = zoo.get(name).fit(x, y, seed=0, net=tiny_cnn, **TINY)
    path = tmp_path / "fit.pt"
    fitted.save(path)
    for net in (tiny_cnn, tiny_cnn()):  # a factory, or a module of the same architecture
        loaded = zoo.load(path, net=net)
        assert (loaded.in_shape, loaded.net_sites) == (fitted.in_shape, fitted.net_sites)
        torch.testing.assert_close(seeded_predictive_mean(loaded, x),
                                   seeded_predictive_mean(fitted, x))
    with pytest.raises(ValueError, match=r"zoo.load\(path, net=...\)"):
        zoo.load(path)
    wider = nn.Sequential(nn.Conv2d(1, 3, 3), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 36, 10))
    with pytest.raises(ValueError, match=r"0.weight \(2, 1, 3, 3\).*0.weight \(3, 1, 3, 3\)"):
        zoo.load(path, net=wider)
    own = tmp_path / "own.pt"
    zoo.get(name).fit(x.flatten(1), y, seed=0, **TINY).save(own)
    with pytest.raises(ValueError, match="own model.*without net="):
        zoo.load(own, net=tiny_cnn)


def test_compare_with_the_cnn_writes_its_tables(tmp_path, capsys):
    # The default entries all take a network; the run itself takes cheap ones (the dense
    # Laplace evidence loop of `laplace` costs minutes on the CNN's 2970 weights) and one
    # that takes no network, which the table lists as skipped with the reason.
    assert all(zoo.get(name).accepts_net for name in cli.NET_ENTRIES)
    entries = ["map", "bbb", "laplace_kron", "nngp"]
    code = cli.main(["compare", "--data", "digits", "--net", "cnn", "--steps", "1",
                     "--num-samples", "2", "--entries", *entries, "--out", str(tmp_path)])
    assert code == 1  # nngp was asked for by name and could not run
    for name in ("compare.md", "compare.csv", "compare.json"):
        assert (tmp_path / name).is_file()
    table = (tmp_path / "compare.md").read_text()
    assert "network `cnn`" in table
    rows = {line.split("|")[1].strip(): line for line in table.splitlines()
            if line.startswith("| ") and not line.startswith("| entry")}
    assert set(rows) == set(entries)
    for name in entries:
        assert ("skipped" in rows[name]) != zoo.get(name).accepts_net, rows[name]
    assert "| accuracy | nll | ece | brier | mi | fit_seconds |" in table


@pytest.mark.parametrize("argv, words", [
    (["--net", "resnet"], ["--net", "invalid choice", "'resnet'"]),
    (["--net", "cnn", "--data", "sine"], ["'cnn'", "digits", "'sine'"]),
], ids=["unknown_net", "net_for_other_data"])
def test_bad_net_flag_exits_2_with_one_line(argv, words, tmp_path, capsys):
    assert cli.main(["compare", *argv, "--steps", "1", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "Traceback" not in "\n".join(err)
    for word in words:
        assert word in err[-1], (word, err[-1])


def test_minibatches_of_image_batches_index_the_images():
    """The runner minibatches along the first dimension of (N, C, H, W) inputs."""
    x, y = images(40)
    model = BayesianModule(tiny_cnn(), task="classification")
    step = SVIStep(model, BayesByBackpropGuide(model), x, y, lr=0.01, batch_size=16)
    assert (step.n, step.batch, step.num_batches) == (40, 16, 3)
