"""The input patches of a convolution at its output pixels: the ``a_{n,l}`` of the
Kronecker factors of a ``Conv1d`` or ``Conv2d`` layer (Grosse & Martens 2016, "A
Kronecker-factored Approximate Fisher Matrix for Convolution Layers"), as
[`bnn_zoo.methods.laplace._layouts`][] uses them."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["conv_patches"]


def conv_patches(module: nn.Conv1d | nn.Conv2d, inputs: Tensor) -> Tensor:
    """(N, L, C_in k_h k_w) the input patches of ``module`` at its ``L`` output pixels (a
    ``Conv1d``: positions, ``k_w = 1``), in the order of its weight's ``(C_in, *kernel)``."""
    padding = module.padding
    if isinstance(padding, str):  # "valid", or "same": torch's split, the extra pixel last
        pads = []
        for k, d in zip(reversed(module.kernel_size), reversed(module.dilation)):
            total = d * (k - 1) if padding == "same" else 0
            pads += [total // 2, total - total // 2]
        inputs, padding = F.pad(inputs, pads), (0,) * len(module.kernel_size)
    if isinstance(module, nn.Conv1d):  # a one-pixel-wide image: (N, C, L, 1), kernel (k, 1)
        inputs = inputs.unsqueeze(-1)
        sizes = [(*module.kernel_size, 1), (*module.dilation, 1), (*padding, 0),
                 (*module.stride, 1)]
    else:
        sizes = [module.kernel_size, module.dilation, padding, module.stride]
    return F.unfold(inputs, *sizes).transpose(1, 2)
