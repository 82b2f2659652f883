"""One optimiser step of SVI for any model/guide pair: minibatches, vectorised particles,
KL weighting, a NaN guard, and the step's state as plain data.

Minibatching goes through the model's ``pyro.plate("data", N)``: the effect handler
[`subsample_data`][bnn_zoo.handlers.subsample_data] sets the plate's subsample indices, so
Pyro rescales the likelihood by ``N / B`` and the minibatch ELBO is an unbiased
estimate of the full-batch ELBO. Each epoch visits every point once (a fresh
permutation split into ``M = ceil(N / B)`` minibatches).

The KL part of the objective can be reweighted per minibatch as in Blundell et
al. (2015, section 3.4): the loss of minibatch ``i`` is
``pi_i KL(q || p) - E_q[log p(D_i | w)]`` with ``sum_i pi_i = 1``. Relative to the
standard ``N / B`` scaling (uniform ``pi_i = 1/M``) that multiplies the KL by
``M pi_i``; the handler [`scale_global_sites`][bnn_zoo.handlers.scale_global_sites] applies
that factor to every site outside the data plate.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Callable

import pyro
import pyro.infer
import pyro.util
import torch
from pyro.poutine.messenger import Messenger
from torch import Tensor, nn

from bnn_zoo._core.checks import (
    check_bool,
    check_choice,
    check_data,
    check_module_device,
    check_positive,
    check_positive_int,
    check_seed,
)
from bnn_zoo._core.distributed import GradientAverager, global_size
from bnn_zoo._core.graphs import StepGraphs, capturable
from bnn_zoo._core.handlers import (
    check_observed_shapes,
    scale_global_sites,
    subsample_data,
    weight_points,
)
from bnn_zoo._core.optim import adam, grad_norm, learning_rate, undo_adam_update
from bnn_zoo._core.rng import rng_state, set_rng_state

__all__ = ["KL_WEIGHTINGS", "SVIStep", "TrainingDiverged", "kl_weights"]

#: The per-minibatch KL weightings of [`kl_weights`][].
KL_WEIGHTINGS = ("uniform", "graves")


class TrainingDiverged(FloatingPointError):
    """The loss or a gradient became NaN/inf; the parameters are restored to the last
    values whose loss and gradient were finite."""


def kl_weights(num_batches: int, scheme: str = "uniform") -> list[float]:
    """Per-minibatch KL weights ``pi_i`` of Blundell et al. (2015), summing to one.

    ``uniform``: ``pi_i = 1 / M``. ``graves``: ``pi_i = 2^(M-i) / (2^M - 1)`` for
    ``i = 1..M``, which puts most of the KL on the first minibatches of an epoch.
    """
    check_positive_int("num_batches", num_batches)
    check_choice("kl_weighting", scheme, KL_WEIGHTINGS)
    if scheme == "uniform":
        return [1.0 / num_batches] * num_batches
    # 2^(M-i) / (2^M - 1) computed as 2^-i / (1 - 2^-M) to stay finite for large M.
    norm = -math.expm1(-num_batches * math.log(2.0))
    return [2.0 ** (-i) / norm for i in range(1, num_batches + 1)]


def _modules(model: Callable, guide: Callable) -> list[nn.Module]:
    """The distinct ``nn.Module`` objects among ``model`` and ``guide``, in that order."""
    seen: list[nn.Module] = []
    for obj in (model, guide):
        if isinstance(obj, nn.Module) and all(obj is not m for m in seen):
            seen.append(obj)
    return seen


class SVIStep:
    """One optimiser step of SVI on ``model``/``guide``, as
    [`bnn_zoo._core.training.fit`][] runs it.

    Calling the object takes the next minibatch of the epoch, computes the
    negative ELBO, checks it and the gradient norm are finite, and steps one
    fused ``torch.optim.Adam`` over every parameter of the model and the guide.
    It returns the loss. Benchmarks time exactly this.

    With ``distributed=True``, ``x`` and ``y`` are this process's shard: the data
    plate is rescaled to the global size, and the gradients (and the returned loss)
    are averaged over the processes before the step (see `bnn_zoo._core.distributed`).
    """

    #: The dimension of ``x`` and ``y`` that indexes the data points (minibatches).
    data_dim = 0

    def __init__(self, model: Callable, guide: Callable, x: Tensor, y: Tensor, *, lr: float,
                 batch_size: int | None = None, num_particles: int = 1,
                 elbo: type[pyro.infer.ELBO] = pyro.infer.Trace_ELBO,
                 kl_weighting: str = "uniform", seed: int | None = None,
                 max_plate_nesting: int = 1, jit: bool = False,
                 distributed: bool = False, cuda_graph: bool | None = None) -> None:
        for name, obj in (("model", model), ("guide", guide)):
            if not callable(obj):
                raise TypeError(f"Expected {name} to be a Pyro {name} (a callable taking x and "
                                f"y), but got {obj!r}.")
        x, y = self.check_data(x, y)
        seed = check_seed("seed", seed, allow_none=True)
        check_positive_int("max_plate_nesting", max_plate_nesting)
        check_bool("jit", jit)
        check_bool("distributed", distributed)
        check_bool("cuda_graph", cuda_graph, allow_none=True)
        graphed = capturable(x.device, cuda_graph, jit=jit, distributed=distributed)
        check_module_device("model", model, x.device)
        check_module_device("guide", guide, x.device)
        check_positive("lr", lr)
        check_positive_int("num_particles", num_particles)
        check_positive_int("batch_size", batch_size, allow_none=True)
        check_choice("kl_weighting", kl_weighting, KL_WEIGHTINGS)
        if not (isinstance(elbo, type) and issubclass(elbo, pyro.infer.ELBO)):
            raise TypeError(f"Expected elbo to be a pyro.infer.ELBO subclass, but got {elbo!r}.")
        self.model, self.guide, self.x, self.y = model, guide, x, y
        self.n = x.shape[self.data_dim]
        self.n_global = global_size(self.n, x.device) if distributed else self.n
        self.batch = self.n if batch_size is None else min(batch_size, self.n)
        self.num_batches = math.ceil(self.n / self.batch)
        self.kl_weighting = kl_weighting
        self.weights = kl_weights(self.num_batches, kl_weighting)
        self.loss_fn = elbo(num_particles=num_particles, vectorize_particles=num_particles > 1,
                            max_plate_nesting=max_plate_nesting)
        self.order = torch.Generator().manual_seed(seed if seed is not None else 0)
        self.position = self.num_batches  # start a fresh epoch on the first call
        self.perm = torch.arange(self.n, device=x.device)
        # A parameter store of its own: in Pyro's default mode a PyroModule whose parameter
        # names are already in the global store takes the stored tensors instead of its own,
        # so a second guide of the same class would silently share the first's. The step
        # always trains the modules' own parameters, in either mode, and leaves the caller's
        # store as it was.
        self.param_state: dict = {"params": {}, "constraints": {}}
        with check_observed_shapes():
            self.loss(0, self.perm[: self.batch])  # creates lazily initialised parameters
        self.modules = _modules(model, guide)
        # where the modules keep their buffers, found once: walking them costs a small step 1%
        self._buffer_slots = [(sub._buffers, name) for module in self.modules
                              for sub in module.modules() for name in sub._buffers]
        self.params = [p for m in self.modules for p in m.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError("Expected the model or the guide to have trainable parameters.")
        self.average = GradientAverager(self.params) if distributed else None
        self.lr = lr  # the base rate: a schedule (bnn_zoo._core.lr_schedule) scales it per step
        self.optimizer = adam(self.params, lr, graphed)
        self.step_count = 0
        self.jit = jit
        self.init_guard(x.device)
        self._ones = torch.ones(self.batch, dtype=self.params[0].dtype, device=x.device)
        self._padding_weights: dict[int, Tensor] = {}
        self._compiled: dict[tuple[int, float], Callable[..., Tensor]] = {}
        #: The step's CUDA graphs (`bnn_zoo._core.graphs`), or ``None``: op by op.
        self.graphs = StepGraphs(self.update, self.data_inputs, x.device) \
            if graphed else None

    def init_guard(self, device: torch.device) -> None:
        """The NaN guard's state: where a failure goes back to, and what it checks with."""
        self._param_data = [p.detach() for p in self.params]  # views of their storage
        self.last_good = [p.clone() for p in self._param_data]
        self.checked_step = 0
        #: The rates and parameters of a checked step's update, to take back on a failure
        self.last_update: tuple[list[float], list[Tensor]] | None = None
        self.finite = torch.ones((), dtype=torch.bool, device=device)
        self._found_inf = torch.zeros((), device=device)
        self._one = torch.ones((), device=device)

    def check_data(self, x: object, y: object) -> tuple[Tensor, Tensor]:
        """The checked training data (`check_data`); a subclass
        for other layouts (replicas: [`bnn_zoo._core.replicas.ReplicaSVIStep`][]) replaces
        it, with [`handlers`][] and [`trace_inputs`][]. ``x`` may have any shape (N, ...):
        the model checks its own inputs. The step runs on any device, ``meta`` included (its
        tests' stand-in for a GPU); [`fit`][bnn_zoo.fit] refuses data without
        values before it builds one."""
        return check_data(x, y, any_shape=True, values=False)

    def handlers(self) -> list[Messenger]:
        """Effect handlers installed around every loss evaluation (none here)."""
        return []

    def data_inputs(self) -> tuple[Tensor, ...]:
        """The data a step reads (a loader's batch replaces them on every step)."""
        return tuple(t for t in (self.x, self.y) if t is not None)

    def trace_inputs(self) -> tuple[Tensor, ...]:
        """Tensors besides the parameters and data that [`compiled_loss`][] takes as
        inputs of its trace: the modules' buffers, state that a step may update in place
        (batch-norm running statistics) and that a trace must not bake in as constants."""
        buffers = (slots[name] for slots, name in self._buffer_slots)
        return tuple(buffer for buffer in buffers if buffer is not None)

    def loss(self, i: int, idx: Tensor, weights: Tensor | None = None) -> Tensor:
        """Negative ELBO of minibatch ``i`` of the epoch with indices ``idx``; ``weights``
        (one per index) multiply the log densities in the data plate (see [`padded`][]).
        Pyro's calls run in the step's own parameter store (``param_state``)."""
        with contextlib.ExitStack() as stack:
            stack.enter_context(pyro.get_param_store().scope(self.param_state))
            if self.batch < self.n or self.n_global != self.n:
                stack.enter_context(subsample_data(idx, scale=self.n_global / self.n))
            if weights is not None:
                stack.enter_context(weight_points(weights))
            if self.kl_weighting != "uniform":
                stack.enter_context(scale_global_sites(self.num_batches * self.weights[i]))
            for handler in self.handlers():
                stack.enter_context(handler)
            return self.loss_fn.differentiable_loss(self.model, self.guide, self.x, self.y)

    def compiled_loss(self, i: int, idx: Tensor, weights: Tensor | None = None) -> Tensor:
        """[`loss`][] traced once per (batch size, KL weight) by ``torch.jit.trace``.

        The trace records only the tensor operations of the model and guide, so
        Pyro's per-site bookkeeping runs once instead of every step; fresh noise is
        still drawn on every call (the random ops are part of the graph). The
        parameters, data, indices and point weights (ones for a full minibatch: one trace
        serves the padded short one too, see [`padded`][]) are inputs of the trace, so
        it follows the optimiser's in-place updates.
        """
        weights = self.point_weights(idx, weights)
        key = (idx.shape[0], self.weights[i])
        fn = self._compiled.get(key)
        if fn is None:
            inputs = (*self.params, *self.trace_inputs(), self.x, self.y, idx, weights)
            devices = [self.x.device] if self.x.device.type == "cuda" else []
            # Tracing runs the loss once; forking the RNG keeps that run's noise out of the
            # random stream, so a JIT fit draws exactly the noise of an eager fit.
            with torch.random.fork_rng(devices=devices), warnings.catch_warnings():
                # torch.jit.trace is deprecated in favour of torch.compile, which cannot
                # trace through Pyro's effect handlers; its tracer warnings are expected.
                warnings.simplefilter("ignore")
                fn = torch.jit.trace(lambda *args: self.loss(i, args[-2], args[-1]), inputs,
                                     check_trace=False)
            self._compiled[key] = fn
        return fn(*self.params, *self.trace_inputs(), self.x, self.y, idx, weights)

    def next_batch(self) -> tuple[int, Tensor]:
        if self.position == self.num_batches:
            if self.batch < self.n:
                # The order is drawn on the CPU so it is the same on every device.
                self.perm = torch.randperm(self.n, generator=self.order, device="cpu").to(
                    self.x.device)
            self.position = 0
        i = self.position
        self.position += 1
        return i, self.perm[i * self.batch:(i + 1) * self.batch]

    def padded(self, idx: Tensor) -> tuple[Tensor, Tensor | None]:
        """A minibatch of ``b`` indices shorter than the batch size ``B`` (an epoch's last)
        as ``B`` indices, the ``b`` followed by the epoch's first ``B - b`` (any valid
        points would do), and per-point weights ``B / b`` on the ``b`` and 0 on the rest:
        the plate's scale ``N / B`` times the weights is ``N / b`` on the real points, so
        the loss is the short minibatch's, while every minibatch has one shape (so
        [`compiled_loss`][] traces once instead of twice). Full minibatches keep
        ``None``."""
        b = idx.shape[0]
        if b == self.batch:
            return idx, None
        return torch.cat([idx, self.perm[:self.batch - b]]), self.padded_weights(b)

    def point_weights(self, idx: Tensor, weights: Tensor | None) -> Tensor:
        """``weights``, or ones for a full minibatch (``None``, as [`padded`][] gives it)."""
        return self._ones[:idx.shape[0]] if weights is None else weights

    def padded_weights(self, b: int) -> Tensor:
        """The point weights of a short minibatch of ``b`` padded to the batch size ``B``:
        ``B / b`` on its ``b`` points, 0 on the padding (made once: every epoch ends on the
        same length)."""
        weights = self._padding_weights.get(b)
        if weights is None:
            weights = self._padding_weights[b] = torch.zeros(
                self.batch, dtype=self._ones.dtype, device=self._ones.device)
            weights[:b] = self.batch / b
        return weights

    def backward(self) -> Tensor:
        """Zero the gradients, evaluate the loss of the next minibatch (padded to the batch
        size, [`padded`][]) and backpropagate; return the loss."""
        i, idx = self.next_batch()
        return self.backpropagate(i, *self.padded(idx))

    def backpropagate(self, i: int, idx: Tensor, weights: Tensor | None) -> Tensor:
        """[`backward`][] on minibatch ``i``, given its indices and point weights."""
        for param in self.params:  # the optimiser's zero_grad, without its bookkeeping
            param.grad = None
        loss = (self.compiled_loss if self.jit else self.loss)(i, idx, weights)
        loss.backward()
        return loss

    def __call__(self) -> float:
        if self.graphs is not None:  # the graph applies the step; the check reads it back
            loss = self.advance()
            self.check()
            return loss.item()
        if self.last_update is None:  # a first checked step: where its failure goes back to
            self.mark_checked()
        loss = self.backward()
        if self.average is not None:
            loss = self.average(loss)
        value = loss.item()
        if not (math.isfinite(value) and self.gradients_finite()):
            norm = grad_norm(self.params).item()
            self.restore_parameters()
            raise TrainingDiverged(
                f"The loss became {value} (gradient norm {norm}) at step "
                f"{self.step_count}; the parameters are restored to the last step with a "
                "finite loss. Try a smaller lr or a narrower initial guide."
            )
        self.optimizer.step()
        self.last_update = ([group["lr"] for group in self.optimizer.param_groups],
                            [p for p in self.params if p.grad is not None])
        self.step_count += 1
        return value

    def gradients_finite(self) -> bool:
        """Whether every gradient is finite: one foreach check of all of them (the kernel of
        ``torch.amp.GradScaler``, unscaling by exactly 1) read back once, where the norm of
        the gradients takes a reduction per tensor; the norm is computed only for the
        message when the check fails."""
        grads = [p.grad for p in self.params if p.grad is not None]
        if not grads:
            return True
        self._found_inf.zero_()
        torch._amp_foreach_non_finite_check_and_unscale_(grads, self._found_inf, self._one)
        return not self._found_inf.item()

    def advance(self) -> Tensor:
        """One step like `__call__`, without reading anything back to the host, so a
        GPU step never waits for it: returns the loss as a 0-dim tensor on the device and
        records whether the loss and the gradient norm stayed finite; a step where they did
        not has its gradients zeroed (so the parameters stay finite) and is reported by the
        next [`check`][]. On a CUDA device the step is a replayed graph
        ([`bnn_zoo._core.graphs`][])."""
        if self.last_update is not None:  # after checked steps: the parameters a check keeps
            self.mark_checked()
        i, idx = self.next_batch()
        idx, weights = self.padded(idx)
        if self.graphs is None:
            loss = self.update(i, idx, weights)
        else:
            loss = self.graphs(i, self.weights[i], idx, self.point_weights(idx, weights))
        self.step_count += 1
        return loss

    def update(self, i: int, idx: Tensor, weights: Tensor | None) -> Tensor:
        """The device side of [`advance`][] on minibatch ``i``: the gradients, the NaN
        guard's bookkeeping and the optimiser's update; returns the loss."""
        loss = self.backpropagate(i, idx, weights)
        if self.average is not None:
            loss = self.average(loss)
        finite = torch.isfinite(loss.detach()) & torch.isfinite(grad_norm(self.params))
        self.finite &= finite
        for param in self.params:
            if param.grad is not None:
                param.grad.masked_fill_(~finite, 0.0)
        self.optimizer.step()
        return loss.detach()

    def check(self) -> None:
        """Read back whether every step since the last check was finite (see
        [`advance`][]): if so, remember the parameters as the last good ones; if not,
        restore the parameters of the last check and raise [`TrainingDiverged`][]."""
        finite = self.finite.reshape(-1).tolist()
        if all(finite):
            self.mark_checked()
            return
        self.restore_parameters()
        raise TrainingDiverged(self.divergence_message([i for i, ok in enumerate(finite)
                                                        if not ok]))

    def mark_checked(self) -> None:
        """Keep the parameters as the last good ones, those a failed [`check`][] goes back to:
        copied into ``last_good`` (one foreach op, on detached views of the parameters: no
        ``no_grad`` context to enter, which costs as much as the copy)."""
        torch._foreach_copy_(self.last_good, self._param_data)
        self.last_update = None
        self.checked_step = self.step_count

    def restore_parameters(self) -> None:
        """Put back the last good parameters: after a checked step ([`__call__`][]), those
        before its update, taken back from Adam's state ([`undo_adam_update`][]: no copy of
        the parameters every step); else ``last_good``, those of the last [`check`][].
        Restoring twice restores the same."""
        if self.last_update is not None:
            undo_adam_update(self.optimizer, *self.last_update)
            self.mark_checked()
        else:
            torch._foreach_copy_(self._param_data, self.last_good)

    def divergence_message(self, bad: list[int]) -> str:
        """The message of [`check`][] when the entries ``bad`` of ``finite`` are false."""
        return (f"The loss or a gradient became NaN/inf between steps {self.checked_step} and "
                f"{self.step_count}; the parameters are restored to step {self.checked_step}, "
                "the last check with a finite loss. Try a smaller lr or a narrower initial "
                "guide.")

    def state_dict(self) -> dict:
        return {"modules": [m.state_dict() for m in self.modules],
                "optimizer": self.optimizer.state_dict(), "step": self.step_count,
                "position": self.position, "perm": self.perm.cpu(),
                "order": self.order.get_state(), "rng": rng_state()}

    def load_state_dict(self, state: dict) -> None:
        for m, s in zip(self.modules, state["modules"]):
            m.load_state_dict(s)
        self.optimizer.load_state_dict(state["optimizer"])
        graphed = self.graphs is not None
        for group in self.optimizer.param_groups:  # as this step runs, whatever saved them
            group["capturable"] = graphed
            group["lr"] = learning_rate(float(group["lr"]), self.x.device, graphed)
        if graphed:  # the optimiser's state tensors are new: record afresh
            self.graphs.reset()
        self.step_count, self.position = state["step"], state["position"]
        self.perm = state["perm"].to(self.x.device)
        self.order.set_state(state["order"])
        set_rng_state(state["rng"])
        self.mark_checked()  # the loaded parameters: where a failed check goes back to

    def run_description(self) -> dict:
        """What a checkpoint must share with the run that resumes it: the shapes of every
        module tensor, the data size, the minibatching, the ELBO and the learning rate."""
        return {
            "tensors": {f"{i}.{name}": list(t.shape) for i, m in enumerate(self.modules)
                        for name, t in m.state_dict().items()},
            "data size N": self.n, "batch size": self.batch,
            "number of batches": self.num_batches, "ELBO": type(self.loss_fn).__name__,
            "KL weighting": self.kl_weighting, "lr": self.lr,
        }
