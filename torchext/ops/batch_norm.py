"""Batch normalization with nn.BatchNorm2d's (and nn.BatchNorm1d's) semantics, alone or fused with a ReLU or a residual
add + ReLU.

batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps, sum=None, sum_sq=None,
kernel=None) is F.batch_norm for input (N, C, ...): in training the batch's statistics normalize (biased variance) and
the running buffers, when given, are updated in place (``momentum`` is the exponential-average factor; running_var
tracks the unbiased variance); in eval the running statistics normalize. batch_norm_relu is relu(batch_norm(...)) and
batch_norm_add_relu(input, residual, ...) is relu(batch_norm(input) + residual): one pass each, which also writes the
ReLU's 1-bit mask for the backward (never the output). ``sum`` and ``sum_sq`` (training only) are input's per-channel
sum and sum of squares over (N, H, W), as conv2d_stats returns them with the convolution's output: they replace the
statistics pass, and autograd treats them as functions of ``input`` (no gradient flows into them; csrc/batch_norm_
autograd.cpp). ``kernel`` names one version of the CUDA ladder (``BATCH_NORM_KERNELS``; the schema calls it
``variant``), or 'cpu' for CPU tensors; None picks the fastest that supports the arguments.

Dtypes (csrc/batch_norm.h): input float32, float64, float16 or bfloat16 on CPU and CUDA; weight, bias and the
running buffers share one dtype, input's or float32 (for float16 / bfloat16 inputs); the statistics are float32
(float64 for float64). Under autocast the ops run in the input's dtype, as torch's batch_norm (it is on no autocast
list), so nothing is registered for autocast.

Layout rule: the output, grad_input and grad_residual take input's suggested memory format (channels-last in,
channels-last out); the mask is one bit per element in that memory order.
"""

from typing import Optional

import torch
from torch import Tensor

from ._common import not_a_tensor

try:  # torch's port of c10's suggest_memory_format
    from torch._prims_common import suggest_memory_format as _suggest_memory_format
except ImportError:  # pragma: no cover
    _suggest_memory_format = None

__all__ = ["batch_norm", "batch_norm_relu", "batch_norm_add_relu", "BATCH_NORM_KERNELS"]

_ops = torch.ops.torchext

# The CUDA ladder, slowest first (cuda_ops/batch_norm_args.h); CPU tensors run "cpu".
BATCH_NORM_KERNELS = ("simple", "vectorized", "fused")


def _check_tensors(op: str, input, residual, **optional) -> None:
    if not isinstance(input, Tensor):
        raise not_a_tensor(op, "input", input)
    if residual is not None and not isinstance(residual, Tensor):
        raise not_a_tensor(op, "residual", residual)
    for name, value in optional.items():
        if value is not None and not isinstance(value, Tensor):
            raise not_a_tensor(op, name, value, optional=True)


def batch_norm(
    input: Tensor,
    weight: Optional[Tensor],
    bias: Optional[Tensor],
    running_mean: Optional[Tensor],
    running_var: Optional[Tensor],
    training: bool,
    momentum: float = 0.1,
    eps: float = 1e-5,
    sum: Optional[Tensor] = None,
    sum_sq: Optional[Tensor] = None,
    kernel: Optional[str] = None,
    num_batches_tracked: Optional[Tensor] = None,
) -> Tensor:
    """(input - mean) / sqrt(var + eps) * weight + bias per channel (dim 1); see the module's docstring.
    ``num_batches_tracked`` (training): a one-element int64 tensor the op adds 1 to on the device (nn.BatchNorm2d's
    counter), the same for the two fused ops."""
    _check_tensors("batch_norm", input, None, weight=weight, bias=bias, running_mean=running_mean,
                   running_var=running_var, sum=sum, sum_sq=sum_sq,
                   num_batches_tracked=num_batches_tracked)  # fmt: skip
    return _ops.batch_norm.default(input, weight, bias, running_mean, running_var, training,
                                  momentum, eps, sum, sum_sq, kernel, num_batches_tracked)[0]  # fmt: skip


def batch_norm_relu(
    input: Tensor,
    weight: Optional[Tensor],
    bias: Optional[Tensor],
    running_mean: Optional[Tensor],
    running_var: Optional[Tensor],
    training: bool,
    momentum: float = 0.1,
    eps: float = 1e-5,
    sum: Optional[Tensor] = None,
    sum_sq: Optional[Tensor] = None,
    kernel: Optional[str] = None,
    num_batches_tracked: Optional[Tensor] = None,
) -> Tensor:
    """relu(batch_norm(...)) in one pass."""
    _check_tensors("batch_norm_relu", input, None, weight=weight, bias=bias, running_mean=running_mean,
                   running_var=running_var, sum=sum, sum_sq=sum_sq,
                   num_batches_tracked=num_batches_tracked)  # fmt: skip
    return _ops.batch_norm_relu.default(input, weight, bias, running_mean, running_var, training,
                                       momentum, eps, sum, sum_sq, kernel, num_batches_tracked)[0]  # fmt: skip


def batch_norm_add_relu(
    input: Tensor,
    residual: Tensor,
    weight: Optional[Tensor],
    bias: Optional[Tensor],
    running_mean: Optional[Tensor],
    running_var: Optional[Tensor],
    training: bool,
    momentum: float = 0.1,
    eps: float = 1e-5,
    sum: Optional[Tensor] = None,
    sum_sq: Optional[Tensor] = None,
    kernel: Optional[str] = None,
    num_batches_tracked: Optional[Tensor] = None,
) -> Tensor:
    """relu(batch_norm(input, ...) + residual) in one pass; residual is shaped like input."""
    if residual is None:
        raise not_a_tensor("batch_norm_add_relu", "residual", residual)
    _check_tensors("batch_norm_add_relu", input, residual, weight=weight, bias=bias, running_mean=running_mean,
                   running_var=running_var, sum=sum, sum_sq=sum_sq,
                   num_batches_tracked=num_batches_tracked)  # fmt: skip
    return _ops.batch_norm_add_relu.default(input, residual, weight, bias, running_mean, running_var, training,
                                           momentum, eps, sum, sum_sq, kernel, num_batches_tracked)[0]  # fmt: skip


# Fake kernels: the real kernels' sizes, strides and dtypes (csrc/batch_norm.h), for torch.compile and meta tensors.
# The running buffers and num_batches_tracked are declared mutated by the schema (Tensor(a!)?); a fake kernel leaves
# them alone.
def memory_format(t: Tensor) -> torch.memory_format:
    """csrc/batch_norm.h's rule: input's suggested memory format (channels-last, channels-last-3d or contiguous)."""
    if _suggest_memory_format is not None:
        return _suggest_memory_format(t)
    return torch.contiguous_format  # pragma: no cover


def _stats_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _check_fake(op: str, input: Tensor, *params) -> None:
    torch._check(input.dim() >= 2, lambda: f"torchext::{op}: `input` must have at least 2 dimensions (N, C, ...)")
    for t in params:
        if t is not None:
            torch._check(
                tuple(t.shape) == (input.shape[1],), lambda: f"torchext::{op}: per-channel tensors must be (C,)"
            )


def _forward_fake(op, input, weight, bias, running_mean, running_var, relu):
    _check_fake(op, input, weight, bias, running_mean, running_var)
    out = torch.empty(input.shape, dtype=input.dtype, device=input.device, memory_format=memory_format(input))
    stats = input.new_empty((input.shape[1],), dtype=_stats_dtype(input.dtype))
    if not relu:
        return out, stats, torch.empty_like(stats)
    mask = input.new_empty(((input.numel() + 7) // 8,), dtype=torch.uint8)
    return out, mask, stats, torch.empty_like(stats)


@torch.library.register_fake("torchext::batch_norm")
def _(input, weight, bias, running_mean, running_var, training, momentum, eps, sum=None, sum_sq=None, variant=None,
      num_batches_tracked=None):  # fmt: skip
    return _forward_fake("batch_norm", input, weight, bias, running_mean, running_var, relu=False)


@torch.library.register_fake("torchext::batch_norm_relu")
def _(input, weight, bias, running_mean, running_var, training, momentum, eps, sum=None, sum_sq=None, variant=None,
      num_batches_tracked=None):  # fmt: skip
    return _forward_fake("batch_norm_relu", input, weight, bias, running_mean, running_var, relu=True)


@torch.library.register_fake("torchext::batch_norm_add_relu")
def _(input, residual, weight, bias, running_mean, running_var, training, momentum, eps, sum=None, sum_sq=None,
      variant=None, num_batches_tracked=None):  # fmt: skip
    torch._check(residual.shape == input.shape, lambda: "torchext::batch_norm_add_relu: `residual` must match `input`")
    return _forward_fake("batch_norm_add_relu", input, weight, bias, running_mean, running_var, relu=True)


@torch.library.register_fake("torchext::batch_norm_backward")
def _(grad_out, input, weight, save_mean, save_invstd, mask, training, eps, output_mask, variant=None):
    _check_fake("batch_norm_backward", input, weight, save_mean, save_invstd)
    fmt = memory_format(input)
    grad_dtype = weight.dtype if weight is not None else _stats_dtype(input.dtype)
    c = (input.shape[1],)

    def full(flag):
        return torch.empty(input.shape, dtype=input.dtype, device=input.device, memory_format=fmt) if flag else (
            input.new_empty((0,)))  # fmt: skip

    return (
        full(output_mask[0]),
        input.new_empty(c if output_mask[1] else (0,), dtype=grad_dtype),
        input.new_empty(c if output_mask[2] else (0,), dtype=grad_dtype),
        full(output_mask[3]),
    )
