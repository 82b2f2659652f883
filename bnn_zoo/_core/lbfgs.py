"""Full-batch L-BFGS in compact form with a strong Wolfe line search, for the Laplace
method's MAP refits and its gradient evidence updates.

Nocedal & Wright, *Numerical Optimization* (2nd ed., 2006): algorithm 7.5 (L-BFGS),
algorithms 3.5 and 3.6 (line search and zoom for the strong Wolfe conditions), equation
3.59 (cubic interpolation); Byrd, Nocedal & Schnabel (1994), *Representations of
quasi-Newton matrices and their use in limited memory methods*, equation 3.1 (the compact
form).

With ``S`` and ``Y`` the last ``m`` steps ``s_i`` and gradient changes ``y_i`` (rows,
oldest first), ``R`` the upper triangle of ``S Y^T`` (``R_ij = s_i . y_j``, ``i <= j``),
``D`` its diagonal and ``gamma = s . y / y . y`` of the newest pair, the inverse Hessian
approximation is

    H = gamma I + [S^T  gamma Y^T] M [S; gamma Y],
    M = [[R^-T (D + gamma Y Y^T) R^-1, -R^-T], [-R^-1, 0]],

the matrix that the two-loop recursion applies, in exact arithmetic. ``torch.optim.LBFGS``
runs that recursion as ``4 m`` vector operations issued from Python, which on a small
network costs more than an evaluation of its objective; the compact form takes two
products with the ``(2m, P)`` history and two ``m x m`` triangular solves, whatever ``m``.
The ``m x m`` algebra runs in float64 whatever the parameters' dtype.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from bnn_zoo._core.checks import check_positive, check_positive_int

__all__ = ["CompactMemory", "LBFGSResult", "ObjectiveAndGradient", "cubic_minimizer",
           "minimize_lbfgs", "strong_wolfe"]

#: The zoom's trial steps keep this fraction of the bracket from either end, so the
#: bracket shrinks by at least that much per trial however the cubic lands. Where the first
#: trial overshoots the minimum ``t*`` by ``t0 / t*`` (as the steepest-descent first step of
#: a refit does, by about the Hessian's largest eigenvalue), a margin ``m`` costs about
#: ``log(t0 / t*) / log(1 / m)`` trials (bisection ``log2(t0 / t*)``), while on a quadratic
#: the cubic alone would land on ``t*`` in one.
ZOOM_MARGIN = 0.01

#: ``x -> (f(x), grad f(x))``: a 0-dim tensor and a tensor of ``x``'s shape.
ObjectiveAndGradient = Callable[[Tensor], tuple[Tensor, Tensor]]


def _host(t: Tensor) -> np.ndarray:
    """``t`` as a float64 numpy array on the host."""
    return t.detach().to("cpu", torch.float64).numpy()


class CompactMemory:
    """The last ``size`` curvature pairs ``(s_i, y_i)`` in the slots of a fixed buffer
    ``pairs`` (2 size, P) (``s`` of slot ``j`` in row ``j``, its ``y`` in row ``size + j``),
    ``slots`` listing the occupied ones oldest first, and the products of the compact form,
    ``R = sy`` with ``sy[i, j] = s_i . y_j`` for ``i <= j`` (zero below the diagonal) and
    ``yy[i, j] = y_i . y_j``, oldest first, as float64 numpy arrays on the host.

    A new pair takes the oldest one's slot (no copy of the buffer) and costs one product
    of the buffer with it; a direction costs one product of the buffer with the gradient
    each way, the ``m x m`` algebra running on the host, where a small numpy operation
    costs less than a torch one (a dozen such per step), and a fixed buffer avoids
    growing and cutting the history by concatenation.
    """

    def __init__(self, size: int, like: Tensor) -> None:
        check_positive_int("size", size)
        self.size = size
        self.pairs = like.new_zeros(2 * size, like.numel())
        self.slots = np.zeros(0, dtype=np.int64)
        self.sy = np.zeros((size, size))
        self.yy = np.zeros((size, size))
        self.gamma = 1.0

    def __len__(self) -> int:
        return len(self.slots)

    def push(self, s: Tensor, y: Tensor) -> bool:
        """Add the pair unless ``s . y <= eps |y|^2`` (the update would not keep ``H``
        positive definite), dropping the oldest beyond ``size``; whether it was added."""
        new = torch.stack([s, y])
        # every row of the buffer, then s and y, against s (column 0) and y (column 1)
        cross = _host(torch.cat([self.pairs @ new.mT, new @ new.mT]))
        ys, yy = cross[-1]
        if not ys > torch.finfo(s.dtype).eps * yy:
            return False
        k = len(self)
        if k == self.size:  # the oldest pair gives up its slot
            slot, self.slots, k = self.slots[0], self.slots[1:], k - 1
            for products in (self.sy, self.yy):
                products[:k, :k] = products[1:, 1:].copy()
        else:
            slot = k
        self.pairs[slot] = s
        self.pairs[self.size + slot] = y
        with_s, with_y = cross[self.slots], cross[self.size + self.slots]  # (k, 2) each
        self.sy[k, :k], self.sy[:k, k], self.sy[k, k] = 0.0, with_s[:, 1], ys
        self.yy[k, :k] = self.yy[:k, k] = with_y[:, 1]
        self.yy[k, k] = yy
        self.slots = np.append(self.slots, slot)
        self.gamma = ys / yy
        return True

    def clear(self) -> None:
        """Forget every pair (after a direction that does not descend)."""
        self.slots, self.gamma = self.slots[:0], 1.0

    def direction(self, g: Tensor) -> Tensor:
        """``-H g``: the quasi-Newton step for the gradient ``g``; ``-g`` with no pairs."""
        k = len(self)
        if k == 0:
            return -g
        gamma = self.gamma
        sg, yg = _host(self.pairs @ g).reshape(2, self.size)[:, self.slots]
        r = torch.from_numpy(self.sy[:k, :k])
        u = torch.linalg.solve_triangular(r, torch.from_numpy(sg[:, None]), upper=True)
        u = u.numpy()[:, 0]  # R^-1 S g
        # w = (D + gamma Y Y^T) u - gamma Y g
        w = self.sy.diagonal()[:k] * u + gamma * (self.yy[:k, :k] @ u - yg)
        p = torch.linalg.solve_triangular(r.mT, torch.from_numpy(w[:, None]), upper=False)
        coef = np.zeros((2, self.size))
        coef[0, self.slots], coef[1, self.slots] = p.numpy()[:, 0], -gamma * u
        coef = torch.from_numpy(coef.reshape(-1)).to(g)
        return torch.addmv(g, self.pairs.mT, coef, beta=gamma).neg_()


def cubic_minimizer(t1: float, f1: float, d1: float, t2: float, f2: float, d2: float,
                    low: float, high: float) -> float:
    """The minimiser in ``[low, high]`` of the cubic through ``f`` and its slope ``d`` at
    ``t1`` and ``t2`` (Nocedal & Wright 3.59); the middle of ``[low, high]`` when the cubic
    has no real minimiser."""
    e1 = d1 + d2 - 3 * (f1 - f2) / (t1 - t2)
    radicand = e1 * e1 - d1 * d2
    if not radicand >= 0 or t1 == t2:
        return (low + high) / 2
    e2 = math.copysign(math.sqrt(radicand), t2 - t1)
    denominator = d2 - d1 + 2 * e2
    if denominator == 0:
        return (low + high) / 2
    t = t2 - (t2 - t1) * (d2 + e2 - e1) / denominator
    return min(max(t, low), high) if math.isfinite(t) else (low + high) / 2


@dataclass
class _Point:
    """A trial step ``t`` along the direction: objective, slope ``g . d`` and gradient."""

    t: float
    f: float
    slope: float
    grad: Tensor


def strong_wolfe(fun: ObjectiveAndGradient, x: Tensor, d: Tensor, f0: float, g0: Tensor,
                 t0: float, *, c1: float = 1e-4, c2: float = 0.9, max_evals: int = 25,
                 tolerance_change: float = 1e-9) -> tuple[float, float, Tensor, int]:
    """A step ``t`` along the descent direction ``d`` from ``x`` that meets the strong Wolfe
    conditions ``f(x + t d) <= f0 + c1 t g0.d`` and ``|g(x + t d).d| <= c2 |g0.d|``
    (Nocedal & Wright algorithms 3.5 and 3.6, trial steps by cubic interpolation), starting
    from ``t0``. Returns ``(t, f, grad, evaluations)``.

    After ``max_evals`` evaluations, or once the bracket is narrower than
    ``tolerance_change`` in every coordinate, it returns the best step with sufficient
    decrease found so far, or ``t = 0`` (the start) if there is none. A non-finite
    objective counts as no decrease.
    """
    slope0 = float(g0 @ d)
    origin = _Point(0.0, f0, slope0, g0)
    scale = float(d.abs().max())
    evals = 0

    def at(t: float) -> _Point:
        nonlocal evals
        evals += 1
        f, g = fun(x + t * d)
        values = torch.stack([f.detach().reshape(()), g @ d]).tolist()
        return _Point(t, values[0], values[1], g)

    def decreases(p: _Point, previous: _Point) -> bool:
        return math.isfinite(p.f) and p.f <= f0 + c1 * p.t * slope0 and p.f < previous.f

    def curved(p: _Point) -> bool:
        return abs(p.slope) <= -c2 * slope0

    def zoom(lo: _Point, hi: _Point) -> _Point:
        while evals < max_evals and abs(hi.t - lo.t) * scale > tolerance_change:
            left, right = min(lo.t, hi.t), max(lo.t, hi.t)
            margin = ZOOM_MARGIN * (right - left)  # each trial shrinks the bracket
            t = (cubic_minimizer(lo.t, lo.f, lo.slope, hi.t, hi.f, hi.slope,
                                 left + margin, right - margin)
                 if math.isfinite(hi.f) else (left + right) / 2)
            p = at(t)
            if not decreases(p, lo):
                hi = p
            else:
                if curved(p):
                    return p
                if p.slope * (hi.t - lo.t) >= 0:
                    hi = lo
                lo = p
        return lo

    previous, t = origin, t0
    while True:
        p = at(t)
        if not decreases(p, previous):
            best = zoom(previous, p)
        elif curved(p) or evals >= max_evals:
            best = p
        elif p.slope >= 0:
            best = zoom(p, previous)
        else:  # still descending: extrapolate, up to ten times further
            previous, t = p, cubic_minimizer(previous.t, previous.f, previous.slope, p.t, p.f,
                                             p.slope, p.t + 0.01 * (p.t - previous.t), 10 * p.t)
            continue
        return best.t, best.f, best.grad, evals


@dataclass
class LBFGSResult:
    """Where `minimize_lbfgs` ended: the point, its objective, the iterations and
    evaluations it took, and why it stopped (``"gradient"``, ``"change"``, ``"max_iter"``,
    ``"max_evals"`` or ``"no_descent"``)."""

    x: Tensor
    f: float
    iterations: int
    evaluations: int
    reason: str


def minimize_lbfgs(fun: ObjectiveAndGradient, x0: Tensor, *, history: int = 50,
                   max_iter: int = 500, max_evals: int | None = None,
                   tolerance_grad: float = 1e-7, tolerance_change: float = 1e-9) -> LBFGSResult:
    """Minimise ``f`` from ``x0`` by L-BFGS (compact form, ``history`` pairs) with a strong
    Wolfe line search; ``fun(x)`` returns ``(f(x), grad f(x))``.

    The first trial step is ``min(1, 1 / |g|_1)`` on the first iteration and 1 after (the
    quasi-Newton scale), as in ``torch.optim.LBFGS``. It stops when the largest gradient
    component is at most ``tolerance_grad``; when an iteration changes the objective, or
    every coordinate, by less than ``tolerance_change``, or the next one would lower the
    objective by less to first order (``-t0 g . d``); after ``max_iter`` iterations or
    ``max_evals`` evaluations (default ``1.25 max_iter``); or when neither the quasi-Newton
    direction nor the steepest descent descends.
    """
    check_positive_int("history", history)
    check_positive_int("max_iter", max_iter)
    max_evals = max_iter * 5 // 4 if max_evals is None else max_evals
    check_positive_int("max_evals", max_evals)
    check_positive("tolerance_grad", tolerance_grad)
    check_positive("tolerance_change", tolerance_change)
    x = x0.detach().clone()
    f_tensor, g = fun(x)
    f, evals = float(f_tensor), 1
    if not math.isfinite(f):
        raise ValueError(f"Expected a finite objective at x0, but got {f}.")
    memory = CompactMemory(history, x)
    iterations, reason = 0, "max_iter"
    while True:
        if float(g.abs().max()) <= tolerance_grad:
            reason = "gradient"
            break
        if iterations >= max_iter:
            break
        if evals >= max_evals:
            reason = "max_evals"
            break
        d = memory.direction(g)
        slope = float(g @ d)
        if not slope < 0:  # round-off took H off positive definite: steepest descent
            if len(memory) == 0:
                reason = "no_descent"
                break
            memory.clear()
            continue
        t0 = min(1.0, 1.0 / float(g.abs().sum())) if iterations == 0 else 1.0
        if -slope * t0 < tolerance_change:  # the first trial step cannot lower f by more
            reason = "change"
            break
        t, f_new, g_new, used = strong_wolfe(fun, x, d, f, g, t0, max_evals=max_evals - evals,
                                             tolerance_change=tolerance_change)
        evals += used
        iterations += 1
        if t == 0:
            reason = "no_descent"
            break
        s = t * d
        memory.push(s, g_new - g)
        x, g, change, f = x + s, g_new, abs(f_new - f), f_new
        if change < tolerance_change or float(s.abs().max()) <= tolerance_change:
            reason = "change"
            break
    return LBFGSResult(x, f, iterations, evals, reason)
