"""The optimiser of the SVI step ([`SVIStep`][bnn_zoo._core.step.SVIStep]): Adam, fused into
one kernel where the device has it and capturable where the step is recorded as a CUDA graph,
the norm of the gradients that the NaN guard checks, and the inverse of Adam's last update,
by which the guard goes back to the last good parameters."""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["FUSED_ADAM_DEVICES", "adam", "fusable", "grad_norm", "learning_rate",
           "undo_adam_update"]


def grad_norm(params: list[Tensor]) -> Tensor:
    """The 2-norm of the gradients of ``params`` (those that have one) taken together, as
    ``torch.nn.utils.get_total_norm`` computes it, without its grouping by device and dtype
    on every call (a step's tensors share both; the grouping costs as much as the norm)."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))


#: Devices whose tensors ``torch.optim.Adam(fused=True)`` updates in one kernel per step.
FUSED_ADAM_DEVICES = ("cpu", "cuda")


def fusable(params: list[Tensor]) -> bool | None:
    """``True`` (fused Adam: one kernel for all parameters instead of about ten ops per
    tensor, the same update up to rounding) when every parameter is a floating tensor on a
    device that has the fused kernel, else ``None`` (torch's default)."""
    ok = all(p.is_floating_point() and p.device.type in FUSED_ADAM_DEVICES for p in params)
    return True if ok else None


def learning_rate(lr: float, device: torch.device, graphed: bool) -> float | Tensor:
    """The rate as Adam holds it: a tensor on ``device`` for a step recorded as a CUDA graph
    (which reads it there, and a schedule fills it in place), else a float."""
    return torch.tensor(lr, device=device) if graphed else lr


def adam(params: list[Tensor], lr: float, graphed: bool) -> torch.optim.Adam:
    """Adam over ``params``, fused where it can be; for a step recorded as a CUDA graph,
    ``capturable`` with its [`learning_rate`][] on the device."""
    return torch.optim.Adam(params, lr=learning_rate(lr, params[0].device, graphed),
                            fused=fusable(params), capturable=graphed)


def undo_adam_update(optimizer: torch.optim.Adam, rates: list[float],
                     updated: list[Tensor]) -> None:
    """Take back the last update of an [`adam`][] from its state: Adam (Kingma & Ba 2015)
    moves ``p`` by ``-lr m_hat / (sqrt(v_hat) + eps)``, ``m_hat = m / (1 - beta1^t)``,
    ``v_hat = v / (1 - beta2^t)``, with the moments ``m``, ``v`` and count ``t`` it keeps
    after the update, so adding the same term back gives ``p`` before it, up to rounding.
    ``rates``: each parameter group's rate in that update; ``updated``: the parameters it
    moved (those that had a gradient). The NaN guard's way back to the parameters of the
    last finite loss, where a copy of them every step would cost as much again."""
    moved = {id(p) for p in updated}
    with torch.no_grad():
        for group, lr in zip(optimizer.param_groups, rates):
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if id(p) not in moved:
                    continue
                state = optimizer.state[p]
                t = float(state["step"])
                denom = state["exp_avg_sq"].sqrt().div_(math.sqrt(1 - beta2**t))
                p.addcdiv_(state["exp_avg"], denom.add_(group["eps"]),
                           value=float(lr) / (1 - beta1**t))
