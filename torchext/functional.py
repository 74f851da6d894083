"""torch.nn.functional's signatures, computed by torchext's ops.

Differences from torch.nn.functional, all deliberate:
- ``inplace=True`` is accepted for drop-in compatibility but the result is always a new tensor: torchext ops never
  write into their inputs. Use the return value (as ``x = F.relu(x, inplace=True)`` code already does).
- softmax/log_softmax over a dimension other than the last run on a transposed copy (the kernels reduce over the
  last dimension).
- conv2d takes ``activation`` (None or 'relu', fused into the kernel) and ``kernel`` (a version of the CUDA ladder)
  keywords; its output is channels-last when ``input`` or ``weight`` is, as torch's (in float64 too).
- Two functions torch.nn.functional does not have: ``add`` (torch.add for tensors of one shape, dtype and device) and
  ``fork`` (aliases of a tensor used several times, whose gradients ``add`` sums: torchext/fusion.py inserts it).
"""

import operator
from typing import Optional

import torch
import torch.nn.functional as F_torch
from torch import Tensor
from torch.nn import _reduction as _Reduction
from torch.overrides import handle_torch_function, has_torch_function_unary

from . import ops
from .ops._common import not_a_tensor
from .ops.conv2d import _pair as _conv2d_pair

__all__ = [
    "relu",
    "leaky_relu",
    "sigmoid",
    "tanh",
    "gelu",
    "silu",
    "add",
    "fork",
    "softmax",
    "log_softmax",
    "cross_entropy",
    "mse_loss",
    "binary_cross_entropy_with_logits",
    "multi_margin_loss",
    "linear",
    "matmul",
    "conv2d",
    "batch_norm",
    "batch_norm_relu",
    "batch_norm_add_relu",
    "max_pool2d",
    "avg_pool2d",
    "adaptive_avg_pool2d",
]


def relu(input: Tensor, inplace: bool = False) -> Tensor:
    return ops.relu(input)


def leaky_relu(input: Tensor, negative_slope: float = 0.01, inplace: bool = False) -> Tensor:
    return ops.leaky_relu(input, negative_slope)


def sigmoid(input: Tensor) -> Tensor:
    return ops.sigmoid(input)


def tanh(input: Tensor) -> Tensor:
    return ops.tanh(input)


def gelu(input: Tensor, approximate: str = "none") -> Tensor:
    return ops.gelu(input, approximate)


def silu(input: Tensor, inplace: bool = False) -> Tensor:
    return ops.silu(input)


def add(input: Tensor, other: Tensor) -> Tensor:
    """input + other for tensors of the same shape, dtype and device (torch.add without broadcasting, type promotion
    or alpha); the result takes input's layout."""
    return ops.add(input, other)


def fork(input: Tensor, n: int) -> tuple[Tensor, ...]:
    """``n`` aliases of ``input``, one for each of its ``n`` users, so that autograd hands their gradients to one node
    that adds them with ``add`` (torchext's kernel), where it would otherwise sum them itself with ATen's add (the same
    a + b: two gradients give the same bits). Where ``input`` does not require grad, or grad mode is off, there is
    nothing to sum: the aliases are ``input`` itself. The aliases are views made by the op ``torchext::fork`` (its
    autograd node is C++, csrc/autograd.cpp): writing into one in place raises, so give them only to users that do not
    (torchext's modules and ops never do). swap_modules' torch.fx pass inserts it at the tensors that feed several
    torchext modules (torchext/fusion.py)."""
    if has_torch_function_unary(input):  # an fx Proxy: a GraphModule re-traced when it is unpickled records the call
        return handle_torch_function(fork, (input,), input, n)
    if not isinstance(input, Tensor):
        raise not_a_tensor("fork", "input", input)
    if type(n) is not int or n < 1:
        raise ValueError(f"torchext fork(): `n` must be a positive int, got {n!r}")
    if not (input.requires_grad and torch.is_grad_enabled()):
        return (input,) * n
    return ops.fork(input, n)


def _softmax_like(op, name: str, input: Tensor, dim: Optional[int], dtype: Optional[torch.dtype]) -> Tensor:
    if not isinstance(input, Tensor):
        raise not_a_tensor(name, "input", input)
    ndim = input.dim()
    if dim is None:
        dim = torch.nn.functional._get_softmax_dim(name, ndim, 3)
    elif type(dim) is not int:
        dim = _index(name, "dim", dim)
    # torch's range: [-ndim, ndim - 1], and [-1, 0] for a 0-dim tensor.
    if not -max(ndim, 1) <= dim < max(ndim, 1):
        raise IndexError(
            f"torchext {name}(): `dim` out of range (expected to be in range of [{-max(ndim, 1)}, {max(ndim, 1) - 1}]"
            f", but got {dim})"
        )
    if dtype is not None:
        input = input.to(dtype)
    if ndim == 0:
        return op(input.reshape(1)).reshape(())
    if dim == ndim - 1 or dim == -1:
        return op(input)
    return op(input.movedim(dim, -1)).movedim(-1, dim)


def _index(name: str, arg: str, value) -> int:
    """An integer argument given as another integer type (numpy's, a 0-dim integer tensor), as torch accepts it."""
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"torchext {name}(): argument `{arg}` must be an int, got {type(value).__name__}") from None


def softmax(input: Tensor, dim: Optional[int] = None, _stacklevel: int = 3, dtype: Optional[torch.dtype] = None):
    return _softmax_like(ops.softmax, "softmax", input, dim, dtype)


def log_softmax(input: Tensor, dim: Optional[int] = None, _stacklevel: int = 3, dtype: Optional[torch.dtype] = None):
    return _softmax_like(ops.log_softmax, "log_softmax", input, dim, dtype)


def _reduction(size_average, reduce, reduction: str) -> str:
    if size_average is not None or reduce is not None:
        return _Reduction.legacy_get_string(size_average, reduce)
    return reduction


def cross_entropy(
    input: Tensor,
    target: Tensor,
    weight: Optional[Tensor] = None,
    size_average: Optional[bool] = None,
    ignore_index: int = -100,
    reduce: Optional[bool] = None,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
) -> Tensor:
    return ops.cross_entropy(
        input, target, weight, ignore_index, _reduction(size_average, reduce, reduction), label_smoothing
    )


def mse_loss(
    input: Tensor,
    target: Tensor,
    size_average: Optional[bool] = None,
    reduce: Optional[bool] = None,
    reduction: str = "mean",
    weight: Optional[Tensor] = None,
) -> Tensor:
    return ops.mse_loss(input, target, weight, _reduction(size_average, reduce, reduction))


def binary_cross_entropy_with_logits(
    input: Tensor,
    target: Tensor,
    weight: Optional[Tensor] = None,
    size_average: Optional[bool] = None,
    reduce: Optional[bool] = None,
    reduction: str = "mean",
    pos_weight: Optional[Tensor] = None,
) -> Tensor:
    return ops.binary_cross_entropy_with_logits(
        input, target, weight, pos_weight, _reduction(size_average, reduce, reduction)
    )


def multi_margin_loss(
    input: Tensor,
    target: Tensor,
    p: int = 1,
    margin: float = 1.0,
    weight: Optional[Tensor] = None,
    size_average: Optional[bool] = None,
    reduce: Optional[bool] = None,
    reduction: str = "mean",
) -> Tensor:
    return ops.multi_margin_loss(input, target, p, margin, weight, _reduction(size_average, reduce, reduction))


def linear(input: Tensor, weight: Tensor, bias: Optional[Tensor] = None, activation: Optional[str] = None) -> Tensor:
    """torch.nn.functional.linear, plus an activation fused into the same kernel: None / 'none', 'relu', 'gelu',
    'gelu_tanh' (gelu's tanh approximation) or 'silu'."""
    return ops.linear(input, weight, bias, activation)


def matmul(input: Tensor, other: Tensor, kernel: Optional[str] = None) -> Tensor:
    """torch.matmul for operands of at least 2 dimensions, batch dimensions broadcast. `kernel` picks a version of
    the CUDA ladder (torchext.ops.matmul.MATMUL_KERNELS); None the fastest that supports the arguments."""
    if not isinstance(input, Tensor):
        raise not_a_tensor("matmul", "input", input)
    if not isinstance(other, Tensor):
        raise not_a_tensor("matmul", "other", other)
    return ops.matmul(input, other, kernel)


def _conv2d_same_padding(input: Tensor, weight: Tensor, stride, dilation) -> tuple[Tensor, list[int]]:
    """padding='same' as torch computes it (ATen's _convolution_mode): each dimension padded by dilation (k - 1) in
    total, half on each side; where that total is odd the extra row or column goes after the input (one F.pad)."""
    stride = _conv2d_pair("stride", stride)
    dilation = _conv2d_pair("dilation", dilation)
    if any(s != 1 for s in stride):
        raise ValueError("torchext conv2d(): padding='same' is not supported for strided convolutions")
    total = [dilation[d] * (weight.shape[2 + d] - 1) for d in range(2)]
    left = [t // 2 for t in total]
    extra = [total[d] - 2 * left[d] for d in range(2)]
    if any(extra):
        input = F_torch.pad(input, (0, extra[1], 0, extra[0]))
    return input, left


def conv2d(
    input: Tensor,
    weight: Tensor,
    bias: Optional[Tensor] = None,
    stride=1,
    padding=0,
    dilation=1,
    groups: int = 1,
    *,
    activation: Optional[str] = None,
    kernel: Optional[str] = None,
) -> Tensor:
    """torch.nn.functional.conv2d (batched (N, C, H, W) or unbatched (C, H, W) input; padding an int, a pair, 'valid'
    or 'same'), plus ``activation`` (None / 'none' or 'relu', fused into the kernel) and ``kernel`` (a version of the
    CUDA ladder, torchext.ops.conv2d.CONV2D_KERNELS, or 'cpu'; None the fastest that supports the
    arguments)."""
    if not isinstance(input, Tensor):
        raise not_a_tensor("conv2d", "input", input)
    if not isinstance(weight, Tensor):
        raise not_a_tensor("conv2d", "weight", weight)
    unbatched = input.dim() == 3
    if unbatched:
        input = input.unsqueeze(0)
    if isinstance(padding, str):
        if padding == "valid":
            padding = 0
        elif padding == "same":
            input, padding = _conv2d_same_padding(input, weight, stride, dilation)
        else:
            raise ValueError(f"torchext conv2d(): `padding` must be 'valid', 'same' or int(s), got {padding!r}")
    out = ops.conv2d(input, weight, bias, stride, padding, dilation, groups, activation, kernel)
    return out.squeeze(0) if unbatched else out


# --- batch normalization (torchext/ops/batch_norm.py) ----------------------------------------------------------------


def batch_norm(
    input: Tensor,
    running_mean: Optional[Tensor],
    running_var: Optional[Tensor],
    weight: Optional[Tensor] = None,
    bias: Optional[Tensor] = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
    *,
    sum: Optional[Tensor] = None,
    sum_sq: Optional[Tensor] = None,
    kernel: Optional[str] = None,
    num_batches_tracked: Optional[Tensor] = None,
) -> Tensor:
    """torch.nn.functional.batch_norm, plus ``sum`` / ``sum_sq`` (training: input's per-channel sum and sum of squares,
    e.g. from torchext.ops.conv2d_stats, in place of the statistics pass), ``kernel`` (a version of the CUDA ladder,
    torchext.ops.batch_norm.BATCH_NORM_KERNELS, or 'cpu'; None the fastest that supports the arguments) and
    ``num_batches_tracked`` (training: a one-element int64 tensor, such as nn.BatchNorm2d's counter, that the op adds 1
    to on the device, in the kernel that updates the running buffers)."""
    if training and isinstance(input, Tensor):
        F_torch._verify_batch_size(input.size())
    return ops.batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps, sum, sum_sq, kernel,
                          num_batches_tracked)  # fmt: skip


def batch_norm_relu(
    input: Tensor,
    running_mean: Optional[Tensor],
    running_var: Optional[Tensor],
    weight: Optional[Tensor] = None,
    bias: Optional[Tensor] = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
    *,
    sum: Optional[Tensor] = None,
    sum_sq: Optional[Tensor] = None,
    kernel: Optional[str] = None,
    num_batches_tracked: Optional[Tensor] = None,
) -> Tensor:
    """relu(batch_norm(...)) in one pass (batch_norm's arguments)."""
    if training and isinstance(input, Tensor):
        F_torch._verify_batch_size(input.size())
    return ops.batch_norm_relu(input, weight, bias, running_mean, running_var, training, momentum, eps, sum, sum_sq,
                               kernel, num_batches_tracked)  # fmt: skip


def batch_norm_add_relu(
    input: Tensor,
    residual: Tensor,
    running_mean: Optional[Tensor],
    running_var: Optional[Tensor],
    weight: Optional[Tensor] = None,
    bias: Optional[Tensor] = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
    *,
    sum: Optional[Tensor] = None,
    sum_sq: Optional[Tensor] = None,
    kernel: Optional[str] = None,
    num_batches_tracked: Optional[Tensor] = None,
) -> Tensor:
    """relu(batch_norm(input, ...) + residual) in one pass; residual is shaped like input (the block's shortcut)."""
    if training and isinstance(input, Tensor):
        F_torch._verify_batch_size(input.size())
    return ops.batch_norm_add_relu(input, residual, weight, bias, running_mean, running_var, training, momentum, eps,
                                   sum, sum_sq, kernel, num_batches_tracked)  # fmt: skip


# --- pooling (torchext/ops/pooling.py) -------------------------------------------------------------------------


def max_pool2d(
    input: Tensor,
    kernel_size,
    stride=None,
    padding=0,
    dilation=1,
    ceil_mode: bool = False,
    return_indices: bool = False,
):
    """torch.nn.functional.max_pool2d: the output, or (output, indices) with ``return_indices`` (int64 positions
    ih * W + iw within each (H, W) plane, as torch's, usable by F.max_unpool2d)."""
    out, indices = ops.max_pool2d(input, kernel_size, stride, padding, dilation, ceil_mode)
    return (out, indices) if return_indices else out


def avg_pool2d(
    input: Tensor,
    kernel_size,
    stride=None,
    padding=0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: int | None = None,
) -> Tensor:
    """torch.nn.functional.avg_pool2d."""
    return ops.avg_pool2d(input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


def adaptive_avg_pool2d(input: Tensor, output_size) -> Tensor:
    """torch.nn.functional.adaptive_avg_pool2d: output_size an int or a pair whose None entries keep the input's
    size."""
    return ops.adaptive_avg_pool2d(input, output_size)
