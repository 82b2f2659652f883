"""The compact L-BFGS of the Laplace refits (``bnn_zoo._core.lbfgs``): its direction is the
two-loop recursion's, its line search meets the strong Wolfe conditions, and it reaches
closed-form and known minima, in float64."""

from __future__ import annotations

import math

import pytest
import torch

from bnn_zoo._core.lbfgs import CompactMemory, cubic_minimizer, minimize_lbfgs, strong_wolfe

D = torch.float64


def two_loop(pairs: list[tuple[torch.Tensor, torch.Tensor]], g: torch.Tensor) -> torch.Tensor:
    """``-H g`` by the two-loop recursion (Nocedal & Wright algorithm 7.4), pairs oldest
    first, ``H0 = (s.y / y.y) I`` of the newest pair."""
    q, coefficients = g.clone(), []
    for s, y in reversed(pairs):
        a = (s @ q) / (y @ s)
        coefficients.append(a)
        q -= a * y
    s, y = pairs[-1]
    r = q * (s @ y) / (y @ y)
    for (s, y), a in zip(pairs, reversed(coefficients)):
        r += (a - (y @ r) / (y @ s)) * s
    return -r


def spd(p: int, generator: torch.Generator) -> torch.Tensor:
    a = torch.randn(p, p, generator=generator, dtype=D)
    return a @ a.T / p + 0.1 * torch.eye(p, dtype=D)


def quadratic(a: torch.Tensor, b: torch.Tensor):
    """``f(x) = x^T A x / 2 - b^T x`` and its gradient; minimiser ``A^-1 b``."""

    def fun(x):
        g = a @ x - b
        return 0.5 * x @ (g - b), g

    return fun


def rosenbrock_value(x: torch.Tensor) -> torch.Tensor:
    return (100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2).sum()


def rosenbrock(x: torch.Tensor):
    x = x.detach().requires_grad_()
    f = rosenbrock_value(x)
    return f.detach(), torch.autograd.grad(f, x)[0]


@pytest.mark.parametrize("pushed", [1, 4, 9])
def test_compact_direction_is_the_two_loop_recursion(pushed):
    """With fewer pairs than the memory holds, as many, and more (the oldest dropped)."""
    g = torch.Generator().manual_seed(pushed)
    p, size = 7, 4
    a = spd(p, g)
    memory, pairs = CompactMemory(size, torch.zeros(p, dtype=D)), []
    for _ in range(pushed):
        s = torch.randn(p, generator=g, dtype=D)
        assert memory.push(s, a @ s)
        pairs.append((s, a @ s))
    grad = torch.randn(p, generator=g, dtype=D)
    assert len(memory) == min(pushed, size)
    torch.testing.assert_close(memory.direction(grad), two_loop(pairs[-size:], grad),
                               rtol=1e-12, atol=1e-12)


def test_memory_refuses_a_pair_without_positive_curvature_and_clears():
    memory = CompactMemory(3, torch.zeros(2, dtype=D))
    s = torch.tensor([1.0, 0.0], dtype=D)
    assert not memory.push(s, -s)  # s . y < 0: H would not stay positive definite
    assert len(memory) == 0
    assert memory.push(s, 2 * s) and len(memory) == 1
    grad = torch.tensor([1.0, 1.0], dtype=D)
    torch.testing.assert_close(memory.direction(grad), -0.5 * grad)  # gamma = s.y / y.y
    memory.clear()
    assert len(memory) == 0 and torch.equal(memory.direction(grad), -grad)
    t = torch.tensor([0.0, 1.0], dtype=D)  # a pair after clearing forgets the old one
    assert memory.push(t, 4 * t) and len(memory) == 1
    torch.testing.assert_close(memory.direction(grad), two_loop([(t, 4 * t)], grad))


def test_cubic_minimizer_is_exact_on_a_quadratic_and_safe_without_a_minimum():
    f = lambda t: (t - 0.3) ** 2  # noqa: E731
    df = lambda t: 2 * (t - 0.3)  # noqa: E731
    assert cubic_minimizer(0.0, f(0.0), df(0.0), 1.0, f(1.0), df(1.0), 0.0, 1.0) == \
        pytest.approx(0.3, abs=1e-12)
    # the cubic's minimiser clipped to the interval
    assert cubic_minimizer(0.0, f(0.0), df(0.0), 1.0, f(1.0), df(1.0), 0.5, 1.0) == 0.5
    # -t^2 on [0, 1] (slopes 0 and -2) has no interior minimiser: the middle
    assert cubic_minimizer(0.0, 0.0, 0.0, 1.0, -1.0, -2.0, 0.0, 1.0) == 0.5


@pytest.mark.parametrize("t0", [1e-7, 1.0, 50.0])
def test_line_search_meets_the_strong_wolfe_conditions(t0):
    """Along steepest descent of Rosenbrock from (-1.2, 1): too short a first step
    (extrapolation), too long ones (zoom)."""
    x = torch.tensor([-1.2, 1.0], dtype=D)
    f0, g0 = rosenbrock(x)
    d = -g0
    c1, c2 = 1e-4, 0.9
    t, f, grad, evals = strong_wolfe(rosenbrock, x, d, float(f0), g0, t0, c1=c1, c2=c2)
    slope0 = float(g0 @ d)
    assert t > 0 and evals <= 25
    assert f <= float(f0) + c1 * t * slope0
    assert abs(float(grad @ d)) <= -c2 * slope0
    f_check, g_check = rosenbrock(x + t * d)
    assert f == float(f_check) and torch.equal(grad, g_check)


def test_zoom_reaches_an_overshot_minimum_in_few_trials():
    """A first step 1000 times too long on a quadratic (a refit's first, steepest-descent
    step, where the Hessian's largest eigenvalue is 1000): the cubic finds the minimum
    exactly and the margin (``ZOOM_MARGIN = 0.01``) lets it get there in two more trials,
    where a tenth would take three and bisection ten."""
    curvature = 1000.0

    def fun(x):
        return 0.5 * curvature * x @ x, curvature * x

    x = torch.tensor([1.0], dtype=D)
    f0, g0 = fun(x)
    t, _, _, evals = strong_wolfe(fun, x, -g0, float(f0), g0, 1.0)
    assert t == pytest.approx(1 / curvature) and evals == 3


def test_line_search_treats_a_non_finite_objective_as_no_decrease():
    """f = x^2 for |x| < 1, infinite beyond: a first step into the infinite region is
    shortened, never accepted."""

    def fun(x):
        inside = bool(x.abs().max() < 1)
        return (x @ x if inside else torch.tensor(math.inf, dtype=D)), 2 * x

    x = torch.tensor([0.5], dtype=D)
    f0, g0 = fun(x)
    t, f, _, _ = strong_wolfe(fun, x, -g0, float(f0), g0, 10.0)
    assert math.isfinite(f) and f < float(f0) and float((x - t * g0).abs()) < 1


def test_minimize_reaches_a_quadratics_closed_form_minimiser():
    """To ``sqrt(eps)``: a line search on objective values cannot tell apart points whose
    objectives differ by less than round-off, ``eps |f|``, i.e. within about
    ``sqrt(eps |f| / lambda)`` of the minimiser (1e-7 here). In under ``2 p`` iterations
    (full-memory BFGS with exact line searches ends in ``p``), nearly all taking the unit
    quasi-Newton step at the first trial: at most one line search, the last, may spend
    its 25 evaluations on differences below round-off."""
    g = torch.Generator().manual_seed(0)
    p = 30
    a, b = spd(p, g), torch.randn(p, generator=g, dtype=D)
    result = minimize_lbfgs(quadratic(a, b), torch.zeros(p, dtype=D), history=10,
                            tolerance_grad=1e-12, tolerance_change=1e-14)
    torch.testing.assert_close(result.x, torch.linalg.solve(a, b), rtol=0, atol=1e-6)
    assert result.iterations < 2 * p and result.evaluations <= result.iterations + 25


def test_minimize_finds_rosenbrocks_minimum_as_torch_lbfgs_does():
    x0 = torch.full((10,), -1.2, dtype=D)
    result = minimize_lbfgs(rosenbrock, x0, max_iter=1000, tolerance_grad=1e-10,
                            tolerance_change=1e-15)
    torch.testing.assert_close(result.x, torch.ones(10, dtype=D), rtol=0, atol=1e-7)
    x = x0.clone().requires_grad_()
    reference = torch.optim.LBFGS([x], lr=1, max_iter=1000, tolerance_grad=1e-10,
                                  tolerance_change=1e-15, history_size=50,
                                  line_search_fn="strong_wolfe")

    def closure():
        reference.zero_grad()
        f = rosenbrock_value(x)
        f.backward()
        return f

    reference.step(closure)
    assert reference.state[x]["n_iter"] == pytest.approx(result.iterations, rel=0.25)


def test_minimize_stops_at_its_limits():
    g = torch.Generator().manual_seed(1)
    a, b = spd(20, g), torch.randn(20, generator=g, dtype=D)
    fun = quadratic(a, b)
    capped = minimize_lbfgs(fun, torch.zeros(20, dtype=D), max_iter=3, max_evals=100,
                            tolerance_grad=1e-12,
                            tolerance_change=1e-20)
    assert capped.reason == "max_iter" and capped.iterations == 3
    at_optimum = minimize_lbfgs(fun, torch.linalg.solve(a, b), tolerance_grad=1e-8)
    assert at_optimum.reason == "gradient" and at_optimum.iterations == 0
    assert at_optimum.evaluations == 1
    loose = minimize_lbfgs(fun, torch.zeros(20, dtype=D), tolerance_grad=1e-12,
                           tolerance_change=1e-3)
    assert loose.reason == "change" and loose.iterations < capped.iterations + 20


@pytest.mark.parametrize("kwargs, match", [
    ({"history": 0}, "history"),
    ({"max_iter": 0}, "max_iter"),
    ({"max_evals": 0}, "max_evals"),
    ({"tolerance_grad": 0.0}, "tolerance_grad"),
    ({"tolerance_change": -1.0}, "tolerance_change"),
])
def test_minimize_rejects_bad_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        minimize_lbfgs(rosenbrock, torch.zeros(2, dtype=D), **kwargs)


def test_minimize_rejects_a_non_finite_start():
    def fun(x):
        return torch.tensor(math.nan, dtype=D), x

    with pytest.raises(ValueError, match="finite objective at x0"):
        minimize_lbfgs(fun, torch.zeros(2, dtype=D))
