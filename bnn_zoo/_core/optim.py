"""The optimiser of the SVI step ([`SVIStep`][bnn_zoo._core.step.SVIStep]): Adam, fused into
one kernel where the device has it and capturable where the step is recorded as a CUDA graph,
and the norm of the gradients that the NaN guard checks."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["FUSED_ADAM_DEVICES", "adam", "fusable", "grad_norm", "learning_rate"]


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
