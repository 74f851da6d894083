"""Optimizers whose step runs on torchext's kernels.

``SGD`` subclasses ``torch.optim.SGD``: the same arguments, defaults, validation, ``param_groups`` and
``state_dict`` (``momentum_buffer`` per parameter, so a state saved by either class loads into the other), and the
same update, computed by ``torch.ops.torchext.sgd_`` (cuda_ops/optim.cu): one pass over each element reading the
parameter, its gradient and momentum buffer once, in a kernel launch per 48 tensors, where torch's
default (foreach) form runs four to six multi-tensor passes.

Differences from torch.optim.SGD: ``foreach``, ``fused`` and ``differentiable=True`` are refused (the step is always
torchext's fused kernel, and it is not differentiable); sparse gradients raise; parameters must be dense
(non-overlapping), float32 or float64 (also float16 or bfloat16 on CUDA), each listed once. float16/bfloat16
parameters are updated in float32 with one rounding of the buffer and one of the parameter (torch's foreach form also
rounds the weight-decayed gradient and Nesterov's sum): not the same bits as torch's. A ``weight_decay`` given as a
tensor is read on the host each step. A learning rate given as a tensor on the
parameters' device is read by the kernel on the device, so the step can be captured in a CUDA graph
(torchext.graphs) while a scheduler updates the tensor; a tensor on another device is read on the host.

``autocast_copies=torch.bfloat16`` (or float16: the dtype of the ``torch.autocast`` the model trains under) lets the
step also write each float32 CUDA parameter, rounded to that dtype, into a copy that torchext's convolutions read under
CUDA autocast instead of casting the weight in every forward: a cast kernel and an autograd node less per
convolution and step, the same bits (docs/autocast_copies.md). It costs 2 bytes of GPU memory per parameter. A
parameter changed other than through an in-place op (``param.data.copy_(...)``, whose write the version counter does
not see) leaves its copy stale until the next step: call ``torch.autograd.graph.increment_version(param)`` after such
a write, or leave the option off.
"""

from __future__ import annotations

from collections import defaultdict

import torch
from torch import Tensor

from .ops.optim import sgd_

__all__ = ["SGD"]


class SGD(torch.optim.SGD):
    """torch.optim.SGD (momentum, dampening, Nesterov, weight decay, maximize) with its step on torchext's kernel."""

    def __init__(
        self,
        params,
        lr: float | Tensor = 1e-3,
        momentum: float = 0,
        dampening: float = 0,
        weight_decay: float = 0,
        nesterov: bool = False,
        *,
        maximize: bool = False,
        foreach: bool | None = None,
        differentiable: bool = False,
        fused: bool | None = None,
        autocast_copies: torch.dtype | None = None,
    ) -> None:
        if foreach or fused:
            raise ValueError(
                "torchext.optim.SGD: `foreach` and `fused` are not options here: the step is always "
                "torchext's fused kernel"
            )
        if differentiable:
            raise ValueError(
                "torchext.optim.SGD: `differentiable=True` is not supported (the step is not differentiable)"
            )
        if autocast_copies not in (None, torch.float16, torch.bfloat16):
            raise ValueError(
                "torchext.optim.SGD: `autocast_copies` must be None, torch.float16 or torch.bfloat16 (the autocast "
                f"dtype), got {autocast_copies!r}"
            )
        self.autocast_copies = autocast_copies
        super().__init__(
            params,
            lr=lr,
            momentum=momentum,
            dampening=dampening,
            weight_decay=weight_decay,
            nesterov=nesterov,
            maximize=maximize,
        )

    @torch.no_grad()
    def step(self, closure=None):
        """One optimization step; ``closure`` (optional) re-evaluates the model and returns the loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for option in ("differentiable", "foreach", "fused"):  # a group added later may carry them
                if group.get(option):
                    raise ValueError(f"torchext.optim.SGD: `{option}=True` is not supported (param group option)")
            momentum = float(group["momentum"])
            # One call per (device, dtype, first step or not): the op takes one dtype and one device, and a buffer is
            # either fresh (set to its first gradient) or blended.
            calls: dict[tuple, tuple[list, list, list]] = defaultdict(lambda: ([], [], []))
            # Buffers made or re-laid out for this step: stored in the state only once their call succeeded, so that
            # a step the op refuses leaves no uninitialized buffer behind for the next step to blend.
            new_buffers: dict[tuple, list] = defaultdict(list)
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("torchext.optim.SGD does not support sparse gradients")
                buf = None
                first = False
                if momentum != 0:
                    buf = self.state[p].get("momentum_buffer")
                    made = True
                    if buf is None:
                        buf = torch.empty_like(p, memory_format=torch.preserve_format)
                        first = True
                    elif buf.stride() != p.stride() and p.numel() > 1:
                        # A buffer in another layout (torch's is a clone of the first gradient, which need not share
                        # its parameter's): moved once into the parameter's, which the op updates in place.
                        buf = torch.empty_like(p, memory_format=torch.preserve_format).copy_(buf)
                    else:
                        made = False
                    if made:
                        new_buffers[(p.device, p.dtype, first)].append((p, buf))
                ps, gs, bs = calls[(p.device, p.dtype, first)]
                ps.append(p)
                gs.append(p.grad)
                if buf is not None:
                    bs.append(buf)
            lr = group["lr"]
            for call, (ps, gs, bs) in calls.items():
                device, _dtype, first = call
                lr_tensor = None
                lr_value = lr
                if isinstance(lr, Tensor):
                    if lr.device == device and lr.dtype in (torch.float32, torch.float64):
                        lr_tensor, lr_value = lr, 0.0
                    else:
                        lr_value = float(lr)
                sgd_(
                    ps,
                    gs,
                    bs,
                    float(lr_value),
                    momentum,
                    float(group["dampening"]),
                    float(group["weight_decay"]),
                    bool(group["nesterov"]),
                    bool(group["maximize"]),
                    first,
                    lr_tensor,
                    getattr(self, "autocast_copies", None),  # an optimizer pickled before the option had none
                )
                for p, buf in new_buffers.get(call, ()):
                    self.state[p]["momentum_buffer"] = buf
        return loss
