"""Optimizer steps: ``sgd_``, torch.optim.SGD's update of a list of tensors in place (csrc/optim_*.cpp,
cuda_ops/optim.cu). ``torchext.optim.SGD`` is the optimizer built on it.

Not differentiable: call it under ``torch.no_grad()``, as optimizers do. Not autocast: the tensors' own dtypes are used.
"""

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["sgd_"]

_ops = torch.ops.torchext


def sgd_(
    params: Sequence[Tensor],
    grads: Sequence[Tensor],
    momentum_buffers: Sequence[Tensor],
    lr: float,
    momentum: float = 0.0,
    dampening: float = 0.0,
    weight_decay: float = 0.0,
    nesterov: bool = False,
    maximize: bool = False,
    is_first_step: bool = False,
    lr_tensor: Tensor | None = None,
    autocast_copies: torch.dtype | None = None,
) -> None:
    """Updates every ``params[i]`` in place as torch.optim.SGD does, from ``grads[i]`` and ``momentum_buffers[i]``
    (updated in place too; empty when momentum is 0). ``is_first_step``: the buffers take their first gradient as is
    (torch's clone) instead of blending. One dtype and one device for all tensors. ``lr_tensor`` (a one-element
    float32/float64 tensor on the params' device) replaces ``lr`` and is read on the device. ``autocast_copies``
    (torch.float16 or torch.bfloat16): float32 CUDA params also get their copy in that dtype written, which
    torchext's conv2d then reads under CUDA autocast in place of casting them (docs/autocast_copies.md)."""
    if len(params) == 0 and len(grads) == 0 and len(momentum_buffers) == 0:
        return  # nothing to update (the dispatcher needs a tensor to choose a backend)
    _ops.sgd_(
        list(params),
        list(grads),
        list(momentum_buffers),
        float(lr),
        float(momentum),
        float(dampening),
        float(weight_decay),
        bool(nesterov),
        bool(maximize),
        bool(is_first_step),
        lr_tensor,
        autocast_copies,
    )


@torch.library.register_fake("torchext::sgd_")
def _sgd_fake(
    params,
    grads,
    momentum_buffers,
    lr,
    momentum=0.0,
    dampening=0.0,
    weight_decay=0.0,
    nesterov=False,
    maximize=False,
    is_first_step=False,
    lr_tensor=None,
    autocast_copies=None,
):
    return None
