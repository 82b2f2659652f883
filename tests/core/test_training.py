"""The core's contract: bad input, determinism, the NaN guard, checkpoints, guide
independence, JIT against eager, predictive summaries and metrics against hand
computations, and the data sets."""

from __future__ import annotations

import math
import shutil

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer.autoguide import AutoDelta, AutoNormal

import bnn_zoo
from bnn_zoo import data, zoo
from bnn_zoo._core import loop
from bnn_zoo._core.loop import run_steps
from bnn_zoo._core.lr_schedule import lr_factor, set_lr
from bnn_zoo._core.optim import adam, fusable, grad_norm, undo_adam_update
from bnn_zoo._core.predictive import CategoricalPredictive, GaussianMixturePredictive
from bnn_zoo._core.scaling import Standardizer
from bnn_zoo._core.step import SVIStep, TrainingDiverged
from bnn_zoo.evaluation._metrics import expected_calibration_error, metrics
from bnn_zoo.models import BayesianMLP, GaussianPrior


def small_problem(n: int = 40):
    x = torch.linspace(-2, 2, n).unsqueeze(-1)
    return x, torch.sin(x.squeeze(-1)) + 0.1 * torch.randn(n)


def parameters(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.named_parameters()}


# --- bad input ---------------------------------------------------------------------------

@pytest.mark.parametrize("x, y, match", [
    (torch.zeros(5), torch.zeros(5), "x"),
    (torch.zeros(5, 1), torch.zeros(4), "y"),
    (torch.full((5, 1), math.nan), torch.zeros(5), "x"),
    (torch.zeros(5, 1), torch.tensor([0.0, 1.0, math.inf, 0.0, 0.0]), "y"),
    (torch.zeros(0, 1), torch.zeros(0), "x"),
])
def test_fit_rejects_bad_data(x, y, match):
    with pytest.raises(ValueError, match=match):
        zoo.get("map").fit(x, y, steps=2)


def test_fit_rejects_bad_options():
    x, y = small_problem()
    model = BayesianMLP(1, 1, (4,))
    guide = AutoDelta(model)
    with pytest.raises(ValueError, match="lr"):
        bnn_zoo.fit(model, guide, x, y, steps=2, lr=-1.0)
    with pytest.raises(ValueError, match="steps"):
        bnn_zoo.fit(model, guide, x, y, steps=0)
    with pytest.raises(ValueError, match="batch_size"):
        bnn_zoo.fit(model, guide, x, y, steps=2, batch_size=0)
    with pytest.raises(ValueError, match="kl_weighting"):
        bnn_zoo.fit(model, guide, x, y, steps=2, kl_weighting="blundell")
    with pytest.raises(ValueError, match="lr_schedule 'linear'"):
        bnn_zoo.fit(model, guide, x, y, steps=2, lr_schedule="linear")
    with pytest.raises(TypeError, match="elbo"):
        bnn_zoo.fit(model, guide, x, y, steps=2, elbo="Trace_ELBO")
    with pytest.raises(ValueError, match="hiden"):
        zoo.get("bbb").fit(x, y, model_options={"hiden": (3,)})


def test_unknown_names_and_bad_hyperparameters():
    with pytest.raises(ValueError, match="zoo entry 'nope'"):
        zoo.get("nope")
    with pytest.raises(ValueError, match="data set"):
        data.load("nope")
    with pytest.raises(ValueError, match="activation"):
        BayesianMLP(1, 1, (3,), activation="swish2")
    with pytest.raises(ValueError, match="noise_scale"):
        BayesianMLP(1, 1, (3,), noise_scale=0.0)
    with pytest.raises(ValueError, match="scale"):
        GaussianPrior(-1.0)
    with pytest.raises(ValueError, match="task"):
        BayesianMLP(1, 1, (3,), task="ranking")
    x, y = small_problem()
    with pytest.raises(TypeError, match="classification"):  # float targets are not labels
        zoo.get("map").fit(x, y, task="classification", steps=2)
    with pytest.raises(ValueError, match="columns"):
        zoo.get("map").fit(x, y, steps=2).predict(torch.zeros(3, 2))


# --- reproducibility, NaN guard, checkpoints ------------------------------------------------

def test_same_seed_same_result_and_other_seed_differs():
    x, y = small_problem()
    runs = [zoo.get("bbb").fit(x, y, seed=s, steps=30, model_options={"hidden": (8,)})
            for s in (3, 3, 4)]
    means = []
    for fitted in runs:
        pyro.set_rng_seed(0)
        means.append(fitted.predict(x, num_samples=10).mean)
    assert runs[0].result.losses == runs[1].result.losses
    torch.testing.assert_close(means[0], means[1], rtol=0, atol=0)
    assert runs[0].result.losses != runs[2].result.losses


def nan_beyond_one(x, y=None):
    """A model whose log density is NaN once ``z > 1``; its MAP pulls ``z`` up to 5."""
    z = pyro.sample("z", dist.Normal(0.0, 10.0))
    pyro.factor("wall", torch.where(z > 1, torch.tensor(math.nan), torch.tensor(0.0)))
    with pyro.plate("data", x.shape[0]):
        pyro.sample("obs", dist.Normal(z, 1.0), obs=y)


# Pyro's ELBO warns "Encountered NaN: loss" before our guard raises: expected here.
@pytest.mark.filterwarnings("ignore:Encountered NaN:UserWarning")
def test_nan_loss_stops_with_clear_error_and_keeps_last_finite_parameters():
    x, y = torch.zeros(10, 1), torch.full((10,), 5.0)
    guide = AutoDelta(nan_beyond_one)
    # validate=False: with validation on, Pyro rejects the NaN factor itself with a ValueError;
    # the guard is what stops a run without validation, fit's default.
    with pytest.raises(TrainingDiverged, match="restored"):
        bnn_zoo.fit(nan_beyond_one, guide, x, y, steps=500, lr=0.1, validate=False)
    z = guide.median()["z"]
    assert torch.isfinite(z) and 0.5 < z <= 1.0


@pytest.mark.filterwarnings("ignore:Encountered NaN:UserWarning")
def test_deferred_nan_guard_restores_the_parameters_of_the_last_check():
    # check_every=4: losses read back every 4 steps; the NaN step is found at the next
    # check and the parameters go back to that of the check before, a multiple of 4 steps.
    x, y = torch.zeros(10, 1), torch.full((10,), 5.0)
    guide = AutoDelta(nan_beyond_one)
    with pytest.raises(TrainingDiverged, match=r"restored to step (\d+)") as info:
        bnn_zoo.fit(nan_beyond_one, guide, x, y, steps=500, lr=0.1, validate=False,
                    check_every=4)
    checked = int(info.value.args[0].split("restored to step ")[1].split(",")[0])
    assert checked % 4 == 0
    z = guide.median()["z"]
    assert torch.isfinite(z) and z <= 1.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_undo_adam_update_gives_the_parameters_before_the_update(dtype):
    """Adam's last update taken back from its state: the parameters before it, up to a few
    rounding errors of the update (the rates change per step, as under a schedule; a
    parameter without a gradient was not moved and is not moved back)."""
    params = [torch.randn(s, dtype=dtype, requires_grad=True) for s in [(30, 4), (4,), (3,)]]
    optimizer = adam(params, lr=0.1, graphed=False)
    for k in range(6):
        set_lr(optimizer, 0.1 / (k + 1))
        for p in params[:2]:
            p.grad = torch.randn_like(p) * 10 ** (k - 3)
        params[2].grad = torch.randn_like(params[2]) if k < 3 else None
        before = [p.detach().clone() for p in params]
        optimizer.step()
        moved = [p for p in params if p.grad is not None]
        assert not torch.equal(params[0], before[0])
        undo_adam_update(optimizer, [0.1 / (k + 1)], moved)
        eps = torch.finfo(dtype).eps
        for p, b in zip(params, before):
            torch.testing.assert_close(p.detach(), b, rtol=4 * eps, atol=4 * eps * 0.1)
        optimizer.step()  # the update again, for the moments of the next round
        assert torch.equal(params[2].detach(), before[2]) == (k >= 3)


@pytest.mark.filterwarnings("ignore:Encountered NaN:UserWarning")
def test_nan_guard_goes_back_to_the_parameters_of_the_last_finite_loss():
    """A checked step whose loss is NaN puts back the parameters at which the step before
    computed its finite loss (its update taken back), and restoring again changes nothing."""
    x, y = torch.zeros(10, 1), torch.full((10,), 5.0)
    guide = AutoDelta(nan_beyond_one)
    step = SVIStep(nan_beyond_one, guide, x, y, lr=0.1)
    history = []
    # validation off, as fit trains: with it on, Pyro rejects the NaN factor itself
    with pyro.validation_enabled(False), \
            pytest.raises(TrainingDiverged, match="restored to the last step with a finite"):
        for _ in range(500):
            history.append([p.detach().clone() for p in step.params])
            step()
    assert len(history) > 2
    for p, good in zip(step.params, history[-2]):
        torch.testing.assert_close(p.detach(), good)
    assert float(guide.median()["z"]) <= 1.0 < float(history[-1][0])
    restored = [p.detach().clone() for p in step.params]
    step.restore_parameters()
    assert all(torch.equal(p, r) for p, r in zip(step.params, restored))


def test_grad_norm_is_torchs_total_norm_bit_for_bit():
    params = [torch.randn(s, requires_grad=True) for s in [(8, 1, 3, 3), (8,), (10, 288), (3,)]]
    for p in params[:3]:  # the last has no gradient and is left out, as torch leaves it out
        p.grad = torch.randn_like(p) * 1e3
    expected = torch.nn.utils.get_total_norm([p.grad for p in params[:3]])
    assert torch.equal(grad_norm(params), expected)
    assert torch.equal(grad_norm([torch.zeros(2, requires_grad=True)]), torch.zeros(()))


def sqrt_cusp(x, y=None):
    """A model whose loss is finite at ``z = 0`` but whose gradient there is not
    (``d sqrt(|z|) / dz``)."""
    z = pyro.sample("z", dist.Normal(0.0, 10.0))
    pyro.factor("cusp", -z.abs().sqrt())
    with pyro.plate("data", x.shape[0]):
        pyro.sample("obs", dist.Normal(z, 1.0), obs=y)


def test_non_finite_gradient_with_finite_loss_stops_and_keeps_the_parameters():
    x, y = torch.zeros(10, 1), torch.zeros(10)
    guide = AutoDelta(sqrt_cusp, init_loc_fn=lambda site: torch.zeros(()))
    with pytest.raises(TrainingDiverged, match=r"gradient norm nan\) at step 0"):
        bnn_zoo.fit(sqrt_cusp, guide, x, y, steps=5, lr=0.1, validate=False)
    assert guide.median()["z"] == 0.0


def test_gradient_check_finds_a_non_finite_gradient_and_changes_none():
    """``SVIStep.gradients_finite`` (one foreach check, unscaling by exactly 1) leaves every
    gradient as it was, bit for bit, and finds a single infinite or NaN entry."""
    x, y = small_problem()
    model = BayesianMLP(1, 1, (8,), noise_scale=0.1)
    step = SVIStep(model, AutoNormal(model), x, y, lr=0.01)
    step.backward()
    grads = [p.grad.clone() for p in step.params]
    assert step.gradients_finite()
    for before, p in zip(grads, step.params):
        assert torch.equal(before, p.grad)
    for bad in (math.inf, math.nan):
        step.params[-1].grad.view(-1)[0] = bad
        assert not step.gradients_finite()


def test_fused_adam_where_the_parameters_allow_it():
    """The step's Adam is fused (one kernel) on the CPU; on a device without the fused
    kernel (meta) it is torch's default."""
    x, y = small_problem()
    model = BayesianMLP(1, 1, (8,), noise_scale=0.1)
    step = SVIStep(model, AutoNormal(model), x, y, lr=0.01)
    assert step.optimizer.param_groups[0]["fused"] is True
    assert fusable([torch.zeros(2, device="meta", requires_grad=True)]) is None
    assert fusable([torch.zeros(2, requires_grad=True)]) is True


def test_losses_kept_on_the_device_change_nothing_but_when_they_are_read():
    x, y = small_problem()
    fits = []
    for check_every in (1, 7):
        pyro.set_rng_seed(0)
        model = BayesianMLP(1, 1, (8,))
        guide = zoo.get("bbb").guide(model)
        result = bnn_zoo.fit(model, guide, x, y, steps=30, batch_size=16, seed=2,
                             check_every=check_every)
        fits.append((result.losses, parameters(guide)))
    assert fits[0][0] == fits[1][0] and len(fits[1][0]) == 30
    for name, value in fits[0][1].items():
        assert torch.equal(value, fits[1][1][name]), name


@pytest.mark.parametrize("check_every", [1, 3])  # 3: losses flushed before each checkpoint
def test_checkpoint_resume_equals_an_uninterrupted_run(tmp_path, check_every):
    x, y = small_problem()

    def run(steps: int, checkpoint=None):
        pyro.set_rng_seed(0)
        model = BayesianMLP(1, 1, (6,))
        guide = AutoNormal(model)
        result = bnn_zoo.fit(model, guide, x, y, steps=steps, lr=0.02, batch_size=16, seed=1,
                             checkpoint=checkpoint, checkpoint_every=5, check_every=check_every)
        return result, parameters(guide)

    straight, expected = run(20)
    path = tmp_path / "fit.pt"
    run(10, path)
    resumed, got = run(20, path)
    assert resumed.steps == 10
    assert resumed.losses == pytest.approx(straight.losses)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name])


def test_lr_schedule_factors():
    assert [lr_factor("constant", t, 4) for t in range(4)] == [1.0] * 4
    cosine = [lr_factor("cosine", t, 4) for t in range(4)]
    assert cosine == pytest.approx([1.0, (1 + math.sqrt(0.5)) / 2, 0.5,
                                    (1 - math.sqrt(0.5)) / 2])
    # Constant for the first three quarters, then the cosine over the last quarter.
    decay = [lr_factor("stable_decay", t, 8) for t in range(8)]
    assert decay == pytest.approx([1.0] * 6 + [1.0, 0.5])
    assert [lr_factor("stable_decay", t, 16) for t in range(12, 16)] == pytest.approx(cosine)
    with pytest.raises(ValueError, match="lr_schedule 'step'; expected one of: constant"):
        lr_factor("step", 0, 4)


@pytest.mark.parametrize("schedule", ["constant", "cosine", "stable_decay"])
def test_each_step_takes_the_learning_rate_of_its_schedule(schedule):
    x, y = small_problem()
    model = BayesianMLP(1, 1, (4,))
    step = SVIStep(model, AutoDelta(model), x, y, lr=0.1, seed=0)
    used: list[float] = []
    adam_step = step.optimizer.step

    def recording_step(*args, **kwargs):
        used.append(step.optimizer.param_groups[0]["lr"])
        return adam_step(*args, **kwargs)

    step.optimizer.step = recording_step
    run_steps(step, 8, [], progress=False, lr_schedule=schedule)
    assert used == pytest.approx([0.1 * lr_factor(schedule, t, 8) for t in range(8)])
    assert step.lr == 0.1  # the base rate stays; a checkpoint records it


def test_a_resumed_cosine_run_goes_on_with_the_uninterrupted_runs_rates(tmp_path, monkeypatch):
    # The run is cut at step 10 of 20 (a copy of its checkpoint then) and resumed to 20:
    # the rate is a function of the step count and the total, so the two runs agree.
    x, y = small_problem()
    middle = tmp_path / "middle.pt"
    save = loop.save_checkpoint

    def save_and_keep_the_middle(step, losses, path):
        save(step, losses, path)
        if step.step_count == 10:
            shutil.copy(path, middle)

    def run(path, schedule="cosine"):
        pyro.set_rng_seed(0)
        model = BayesianMLP(1, 1, (6,))
        guide = AutoNormal(model)
        result = bnn_zoo.fit(model, guide, x, y, steps=20, lr=0.05, lr_schedule=schedule,
                             batch_size=16, seed=1, checkpoint=path, checkpoint_every=5)
        return result, parameters(guide)

    monkeypatch.setattr(loop, "save_checkpoint", save_and_keep_the_middle)
    straight, expected = run(tmp_path / "straight.pt")
    monkeypatch.setattr(loop, "save_checkpoint", save)
    resumed, got = run(middle)
    assert resumed.steps == 10
    assert resumed.losses == pytest.approx(straight.losses)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name])
    constant, _ = run(None, schedule="constant")
    # The loss of step t is taken before step t's update: the first two agree only if the
    # first step takes the full rate.
    assert constant.losses[:2] == straight.losses[:2]
    assert constant.losses[10:] != pytest.approx(straight.losses[10:])  # then the rates part


def test_guides_fitted_one_after_another_stay_independent():
    x, y = small_problem()
    first, second = BayesianMLP(1, 1, (4,)), BayesianMLP(1, 1, (4,))
    guide_a, guide_b = AutoNormal(first), AutoNormal(second)
    bnn_zoo.fit(first, guide_a, x, y, steps=20, lr=0.05)
    before = parameters(guide_a)
    bnn_zoo.fit(second, guide_b, x, -y, steps=20, lr=0.05)
    after = parameters(guide_a)
    assert before.keys() == after.keys() == parameters(guide_b).keys()
    for name in before:
        torch.testing.assert_close(after[name], before[name], rtol=0, atol=0)
        assert not torch.equal(after[name], parameters(guide_b)[name])


def test_jit_loss_equals_eager_loss_under_the_same_seed():
    x, y = small_problem()
    losses = []
    for jit in (False, True):
        pyro.set_rng_seed(0)
        model = BayesianMLP(1, 1, (5,))
        guide = zoo.get("bbb").guide(model)
        step = SVIStep(model, guide, x, y, lr=0.01, batch_size=16, num_particles=3, seed=0,
                       jit=jit)
        pyro.set_rng_seed(1)
        losses.append([step() for _ in range(6)])
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)


def test_minibatch_sizes_are_respected_by_the_data_plate():
    x, y = small_problem(50)
    model = BayesianMLP(1, 1, (3,))
    step = SVIStep(model, AutoDelta(model), x, y, lr=0.01, batch_size=16)
    sizes = [step.next_batch()[1].shape[0] for _ in range(4)]
    assert sizes == [16, 16, 16, 2]
    seen = torch.cat([step.next_batch()[1] for _ in range(4)])
    assert sorted(seen.tolist()) == list(range(50))


@pytest.mark.parametrize("dim", [-1, -2])
def test_a_padded_short_minibatch_has_the_loss_and_gradient_of_the_short_one(dim):
    # 50 points in minibatches of 16: the last 2 are padded to 16 with weight-zero points
    x, y = small_problem(50)
    x, y = x.double(), y.double()
    column = (-1,) + (1,) * (-dim - 1)  # the data along the plate's dimension

    class Line(pyro.nn.PyroModule):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.tensor(0.3, dtype=torch.float64))

        def forward(self, x, y):
            with pyro.plate("data", x.shape[0], dim=dim) as idx:
                pyro.sample("obs", dist.Normal((self.weight * x[idx, 0]).reshape(column), 0.5),
                            obs=y[idx].reshape(column))

    model = Line()
    weight = model.weight
    step = SVIStep(model, lambda x, y: None, x, y, lr=0.01, batch_size=16,
                   max_plate_nesting=-dim)
    for _ in range(3):
        step.next_batch()
    i, idx = step.next_batch()
    padded, weights = step.padded(idx)
    assert idx.shape[0] == 2 and padded.shape[0] == 16
    assert weights.tolist() == [8.0, 8.0] + [0.0] * 14
    short = step.loss(i, idx)
    short_grad, = torch.autograd.grad(short, weight)
    full = step.loss(i, padded, weights)
    torch.testing.assert_close(full, short)
    torch.testing.assert_close(torch.autograd.grad(full, weight)[0], short_grad)
    # by hand: N / b times the two points' log densities
    hand = -50 / 2 * dist.Normal(weight * x[idx, 0], 0.5).log_prob(y[idx]).sum()
    torch.testing.assert_close(short, hand)


def test_a_traced_fit_traces_one_loss_for_full_and_padded_minibatches():
    x, y = small_problem(50)
    model = BayesianMLP(1, 1, (3,))
    step = SVIStep(model, AutoDelta(model), x, y, lr=0.01, batch_size=16, jit=True)
    for _ in range(8):  # two epochs, each with a short last minibatch
        step()
    assert list(step._compiled) == [(16, 0.25)]


# --- prediction and metrics against hand computations --------------------------------------

def test_gaussian_predictive_metrics_match_hand_computation():
    mu, sigma = torch.tensor([0.0, 1.0, -2.0]), torch.tensor([1.0, 2.0, 0.5])
    y = torch.tensor([0.5, 4.0, -2.1])
    pred = GaussianMixturePredictive(mu.unsqueeze(0), sigma.unsqueeze(0))
    out = metrics(pred, y)
    hand_ll = (-0.5 * torch.log(2 * math.pi * sigma**2) - 0.5 * ((y - mu) / sigma) ** 2).mean()
    assert out["ll"] == pytest.approx(float(hand_ll))
    assert out["rmse"] == pytest.approx(float(((y - mu) ** 2).mean().sqrt()))
    # |z| = 0.5, 1.5, 0.2: the 50% interval (|z| < 0.674) holds points 1 and 3
    assert out["coverage_50"] == pytest.approx(2 / 3)
    assert out["coverage_90"] == pytest.approx(1.0)


def test_mixture_predictive_moments_and_quantiles():
    loc = torch.tensor([[-1.0], [1.0]])
    scale = torch.tensor([[0.5], [0.5]])
    pred = GaussianMixturePredictive(loc, scale)
    assert pred.mean.item() == pytest.approx(0.0)
    assert pred.variance.item() == pytest.approx(0.25 + 1.0)
    q = pred.quantile(0.9)
    cdf = 0.5 * (dist.Normal(-1.0, 0.5).cdf(q) + dist.Normal(1.0, 0.5).cdf(q))
    assert cdf.item() == pytest.approx(0.9, abs=1e-6)
    lo, hi = pred.interval(0.5)
    assert lo.item() == pytest.approx(-hi.item(), abs=1e-6)
    shifted = pred.affine(3.0, 2.0)
    assert shifted.mean.item() == pytest.approx(3.0)
    assert shifted.variance.item() == pytest.approx(4 * 1.25)
    # One component: its own quantile, mu + sigma Phi^-1(q), where the bracket closes at once.
    one = GaussianMixturePredictive(torch.tensor([[0.3]], dtype=torch.float64),
                                    torch.tensor([[2.0]], dtype=torch.float64))
    assert one.quantile(0.975).item() == pytest.approx(0.3 + 2.0 * 1.959963984540054, abs=1e-12)
    # Components far apart and of unequal scales: the CDF at the quantile is q to float64's
    # resolution, at every level, tails included.
    far = GaussianMixturePredictive(torch.tensor([[-30.0], [0.0], [45.0]], dtype=torch.float64),
                                    torch.tensor([[0.1], [3.0], [0.01]], dtype=torch.float64))
    for level in (1e-4, 0.2, 1 / 3, 0.5, 2 / 3, 0.9, 1 - 1e-4):
        assert far.cdf(far.quantile(level)).item() == pytest.approx(level, abs=1e-12)
    # The equal mixture of two one-component predictives is the two-component one.
    halves = [GaussianMixturePredictive(loc[i:i + 1], scale[i:i + 1]) for i in range(2)]
    both = GaussianMixturePredictive.mixture(halves)
    assert torch.equal(both.loc, loc) and torch.equal(both.scale, scale)


def test_classification_metrics_match_hand_computation():
    probs = torch.tensor([[[0.9, 0.1], [0.4, 0.6], [0.7, 0.3]]])
    y = torch.tensor([0, 0, 1])
    out = metrics(CategoricalPredictive(probs), y)
    assert out["accuracy"] == pytest.approx(1 / 3)
    assert out["nll"] == pytest.approx(-(math.log(0.9) + math.log(0.4) + math.log(0.3)) / 3)
    assert out["brier"] == pytest.approx((2 * 0.1**2 + 2 * 0.6**2 + 2 * 0.7**2) / 3)
    # confidences 0.9, 0.6, 0.7 in separate bins with accuracies 1, 0, 0
    assert expected_calibration_error(probs[0], y) == pytest.approx((0.1 + 0.6 + 0.7) / 3)


def test_classification_predictive_averages_probabilities_not_weights():
    probs = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]], [[0.0, 1.0]]])
    pred = CategoricalPredictive(probs)
    torch.testing.assert_close(pred.mean, torch.tensor([[1 / 3, 2 / 3]]))


def test_classification_log_prob_stays_finite_where_float32_probabilities_underflow():
    """Two samples give the observed class log-probabilities -120 and -130: its float32
    probabilities underflow to zero, and the log of their average is -inf; in log space it
    is ``log((e^-120 + e^-130) / 2)``. Where nothing underflows both ways agree."""
    logits = torch.tensor([[[0.0, -120.0], [0.0, -1.0]], [[0.0, -130.0], [0.0, -2.0]]])
    log_probs = torch.log_softmax(logits, -1)
    y = torch.tensor([1, 1])
    assert torch.isinf(CategoricalPredictive(log_probs.exp()).log_prob(y)[0])
    got = CategoricalPredictive(log_probs.exp(), log_probs).log_prob(y)
    exact = (torch.logsumexp(log_probs.double()[:, :, 1], 0) - math.log(2)).float()
    torch.testing.assert_close(got, exact)
    assert got[0].item() == pytest.approx(-120 - math.log(2) + math.log1p(math.exp(-10)))
    torch.testing.assert_close(got[1], CategoricalPredictive(log_probs.exp()).log_prob(y)[1])


def test_categorical_predictive_refuses_log_probs_of_another_shape():
    with pytest.raises(ValueError, match="log_probs of the shape of probs"):
        CategoricalPredictive(torch.full((2, 3, 4), 0.25), torch.zeros(2, 3, 3))


def test_predict_gives_log_probabilities_with_the_probabilities():
    """``predict`` keeps the likelihood's normalised logits, so the mixture of an
    ensemble and one replica of a batch keep them too."""
    x = torch.randn(5, 2)
    model = BayesianMLP(2, 3, (4,), task="classification")
    guide = AutoDelta(model)
    guide(x, torch.tensor([0, 1, 2, 0, 1]))
    pred = bnn_zoo.predict(model, guide, x, num_samples=3)
    torch.testing.assert_close(pred.log_probs.exp(), pred.probs)
    both = CategoricalPredictive.mixture([pred, pred])
    assert both.log_probs.shape == (6, 5, 3)
    without = CategoricalPredictive(pred.probs)
    assert CategoricalPredictive.mixture([pred, without]).log_probs is None
    batch = CategoricalPredictive(torch.stack([pred.probs] * 2, 1),
                                  torch.stack([pred.log_probs] * 2, 1))  # (S, R, N, C)
    torch.testing.assert_close(batch.replica(1).log_probs, pred.log_probs)


def test_predict_is_the_network_under_point_weights():
    x = torch.randn(7, 2)
    model = BayesianMLP(2, 1, (3,), noise_scale=0.2)
    guide = AutoDelta(model)
    guide(x)
    weights = guide.median()
    pred = bnn_zoo.predict(model, guide, x, num_samples=4)
    hidden = torch.relu(x @ weights["layers.0.weight"] + weights["layers.0.bias"])
    f = (hidden @ weights["layers.1.weight"] + weights["layers.1.bias"]).squeeze(-1)
    torch.testing.assert_close(pred.loc, f.expand(4, -1))
    torch.testing.assert_close(pred.scale, torch.full((4, 7), 0.2))


def test_entry_metrics_are_in_the_callers_units():
    """Fitting ``a + b y`` instead of ``y`` shifts the RMSE by the factor ``b`` and the LL
    by ``-log b``: standardisation happens inside ``entry.fit`` only."""
    x, y = small_problem()
    scores = []
    for a, b in ((0.0, 1.0), (100.0, 10.0)):
        fitted = zoo.get("map").fit(x, a + b * y, steps=200, seed=0)
        pyro.set_rng_seed(0)
        scores.append(fitted.evaluate(x, a + b * y, num_samples=2))
    assert scores[1]["rmse"] == pytest.approx(10 * scores[0]["rmse"], rel=1e-3)
    assert scores[1]["ll"] == pytest.approx(scores[0]["ll"] - math.log(10), abs=1e-3)


def test_standardizer_leaves_constant_columns_unscaled():
    x = torch.tensor([[1.0, 5.0], [3.0, 5.0]])
    s = Standardizer.fit(x)
    z = s.transform(x)
    torch.testing.assert_close(z, torch.tensor([[-1.0, 0.0], [1.0, 0.0]]))
    torch.testing.assert_close(s.inverse(z), x)


# --- data ----------------------------------------------------------------------------------

def test_toy_data_sets():
    sine = data.load("sine")
    assert sine.task == "regression" and sine.x_train.shape == (500, 1)
    assert sine.y_train.shape == (500,) and sine.x_test.shape[1] == 1
    resid = sine.y_train - torch.sin(2 * sine.x_train.squeeze(-1))
    assert resid.std().item() == pytest.approx(sine.noise_scale, rel=0.15)
    gap = data.load("gap")
    assert (gap.x_train.abs() >= 1).all() and (gap.x_test.abs() < 1).any()
    moons = data.load("two_moons", split=1)
    assert moons.task == "classification" and moons.y_train.dtype == torch.long
    assert not torch.equal(data.load("two_moons", 0).x_train, moons.x_train)


@pytest.mark.parametrize("name", ["diabetes", "breast_cancer"])
def test_bundled_sklearn_sets(name):
    d = data.load(name)
    assert d.x_train.shape[0] > d.x_test.shape[0] > 0
    assert torch.isfinite(d.x_train).all()


def test_uci_split_is_the_standard_one(uci_data):
    d = data.load("uci/concrete", split=3)
    assert d.x_train.shape[1] == 8
    assert d.x_train.shape[0] + d.x_test.shape[0] == 1030
    assert data.num_splits("uci/concrete") == 20
