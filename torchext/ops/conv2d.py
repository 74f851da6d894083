"""conv2d: 2-D convolution (cross-correlation, as torch.nn.functional.conv2d) with the bias and a ReLU fused.

conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, activation=None, kernel=None) is
act(F.conv2d(input, weight, bias, stride, padding, dilation, groups)) for input (N, C, H, W), weight
(K, C / groups, kH, kW) and activation None / 'none' or 'relu'. ``kernel`` names one version of the CUDA ladder
(``CONV2D_KERNELS``, cuda_ops/conv2d.cuh; the schema calls the argument ``variant``: inductor reserves ``kernel``),
or 'cpu' for CPU tensors; None picks the fastest that supports the arguments. padding is numeric here (see
``torchext.functional.conv2d`` for 'same' and 'valid').

conv2d_stats(...) returns (out, sum, sum_sq): the output and its per-output-channel sum and sum of squares over N,
H and W (float32 for float16 / bfloat16 / float32 inputs, float64 for float64), what batch norm's statistics need.

Layout rule (csrc/conv2d.h, docs/compile.md): the output and grad_input are channels-last when input or weight
suggests channels-last (``suggest_memory_format``; torch's rule), else contiguous; grad_weight is channels-last when
weight suggests it, else contiguous; grad_bias and the statistics are contiguous. The kernels read any input layout
through its strides.

Autocast: under CUDA autocast, input, weight and bias are cast to the autocast dtype (float16 or bfloat16), as
torch's conv2d (csrc/autograd.cpp); under CPU autocast to float32 (the CPU kernels are float32/float64;
csrc/autocast.cpp).
"""

from typing import Optional, Union

import torch
from torch import Tensor

from ._common import not_a_tensor

try:  # torch's port of c10's is_channels_last_strides_2d, what suggest_memory_format decides with
    from torch._prims_common import suggest_memory_format as _suggest_memory_format
except ImportError:  # pragma: no cover
    _suggest_memory_format = None

__all__ = ["conv2d", "conv2d_stats", "CONV2D_ACTIVATIONS", "CONV2D_KERNELS"]

_ops = torch.ops.torchext

CONV2D_ACTIVATIONS = ("none", "relu")
# The CUDA ladder, slowest first (cuda_ops/conv2d_args.h); CPU tensors run "cpu".
CONV2D_KERNELS = ("direct", "im2col", "implicit_simt", "implicit_mma", "implicit_wgmma", "implicit_tma")

IntPair = Union[int, tuple[int, int], list[int]]


def conv2d_activation_name(activation: Optional[str]) -> str:
    """The schema's name for conv2d's activation: None -> 'none'; anything but 'none' / 'relu' raises ValueError."""
    if activation is None:
        return "none"
    if activation not in CONV2D_ACTIVATIONS:
        raise ValueError(f"torchext conv2d(): unknown activation {activation!r}; valid: None, 'none', 'relu'")
    return activation


def _pair(name: str, value) -> list[int]:
    if isinstance(value, int) and not isinstance(value, bool):
        return [value, value]
    if isinstance(value, (tuple, list)) and len(value) in (1, 2) and all(isinstance(v, int) for v in value):
        return [int(v) for v in value] * (2 // len(value))
    if isinstance(value, torch.SymInt):
        return [value, value]
    raise TypeError(f"torchext conv2d(): `{name}` must be an int or a pair of ints, got {value!r}")


def _check_tensors(op: str, input, weight, bias) -> None:
    if not isinstance(input, Tensor):
        raise not_a_tensor(op, "input", input)
    if not isinstance(weight, Tensor):
        raise not_a_tensor(op, "weight", weight)
    if bias is not None and not isinstance(bias, Tensor):
        raise not_a_tensor(op, "bias", bias, optional=True)


def conv2d(
    input: Tensor,
    weight: Tensor,
    bias: Optional[Tensor] = None,
    stride: IntPair = 1,
    padding: IntPair = 0,
    dilation: IntPair = 1,
    groups: int = 1,
    activation: Optional[str] = None,
    kernel: Optional[str] = None,
) -> Tensor:
    """act(conv2d(input, weight) + bias): input (N, C, H, W), weight (K, C / groups, kH, kW), bias (K,)."""
    _check_tensors("conv2d", input, weight, bias)
    return _ops.conv2d.default(
        input,
        weight,
        bias,
        _pair("stride", stride),
        _pair("padding", padding),
        _pair("dilation", dilation),
        groups,
        conv2d_activation_name(activation),
        kernel,
    )


def conv2d_stats(
    input: Tensor,
    weight: Tensor,
    bias: Optional[Tensor] = None,
    stride: IntPair = 1,
    padding: IntPair = 0,
    dilation: IntPair = 1,
    groups: int = 1,
    kernel: Optional[str] = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """(out, sum, sum_sq): conv2d's output and its per-output-channel sum and sum of squares over N, H, W."""
    _check_tensors("conv2d_stats", input, weight, bias)
    return _ops.conv2d_stats.default(
        input, weight, bias, _pair("stride", stride), _pair("padding", padding), _pair("dilation", dilation), groups,
        kernel,
    )  # fmt: skip


# Fake kernels: the real kernels' sizes and strides (csrc/conv2d.h's layout rule), for torch.compile and meta tensors.
def _memory_format(t: Tensor) -> torch.memory_format:
    """csrc/conv2d.h's conv2d_memory_format: channels-last iff t suggests it (4-D)."""
    if _suggest_memory_format is not None:
        fmt = _suggest_memory_format(t)
    else:  # pragma: no cover
        fmt = torch.channels_last if t.is_contiguous(memory_format=torch.channels_last) else torch.contiguous_format
    return torch.channels_last if fmt == torch.channels_last else torch.contiguous_format


def _output_format(input: Tensor, weight: Tensor) -> torch.memory_format:
    """csrc/conv2d.h's conv2d_memory_format(input, weight): the output's and grad_input's layout, channels-last iff
    input or weight suggests it."""
    fmt = _memory_format(input)
    return fmt if fmt == torch.channels_last else _memory_format(weight)


def _out_shape(input: Tensor, weight: Tensor, stride, padding, dilation) -> tuple:
    stride, padding, dilation = (_pair(n, v) for n, v in (("stride", stride), ("padding", padding),
                                                           ("dilation", dilation)))  # fmt: skip
    sizes = [
        (input.shape[2 + d] + 2 * padding[d] - dilation[d] * (weight.shape[2 + d] - 1) - 1) // stride[d] + 1
        for d in range(2)
    ]
    return (input.shape[0], weight.shape[0], *sizes)


def _check_fake(op: str, input, weight, bias, stride, padding, dilation, groups) -> None:
    torch._check(input.dim() == 4, lambda: f"torchext::{op}: `input` must be 4-D (N, C, H, W), got {input.dim()}-D")
    torch._check(weight.dim() == 4, lambda: f"torchext::{op}: `weight` must be 4-D, got {weight.dim()}-D")
    torch._check(input.dtype == weight.dtype, lambda: f"torchext::{op}: `weight` must have the same dtype as `input`")
    torch._check(
        weight.shape[1] * groups == input.shape[1],
        lambda: f"torchext::{op}: `weight` must have {input.shape[1] // groups} input channels (dim 1)",
    )
    for name, values, low in (("stride", stride, 1), ("padding", padding, 0), ("dilation", dilation, 1)):
        for v in _pair(name, values):
            torch._check(v >= low, lambda name=name: f"torchext::{op}: `{name}` out of range")
    if bias is not None:
        torch._check(tuple(bias.shape) == (weight.shape[0],), lambda: f"torchext::{op}: `bias` must be (K,)")


def _empty(like: Tensor, shape, fmt: torch.memory_format, dtype: torch.dtype | None = None) -> Tensor:
    """at::empty(shape, like.options().memory_format(fmt)): the strides that format gives every shape (a
    .contiguous(memory_format=...) call would keep other strides where sizes of 1 make both formats match)."""
    return torch.empty(shape, dtype=dtype or like.dtype, device=like.device, memory_format=fmt)


def _stats_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


@torch.library.register_fake("torchext::conv2d")
def _(input, weight, bias=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1, activation="none",
      variant=None):  # fmt: skip
    _check_fake("conv2d", input, weight, bias, stride, padding, dilation, groups)
    shape = _out_shape(input, weight, stride, padding, dilation)
    return _empty(input, shape, _output_format(input, weight))


@torch.library.register_fake("torchext::conv2d_stats")
def _(input, weight, bias=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1, variant=None):
    _check_fake("conv2d_stats", input, weight, bias, stride, padding, dilation, groups)
    shape = _out_shape(input, weight, stride, padding, dilation)
    out = _empty(input, shape, _output_format(input, weight))
    stats = input.new_empty((weight.shape[0],), dtype=_stats_dtype(input.dtype))
    return out, stats, torch.empty_like(stats)


@torch.library.register_fake("torchext::conv2d_backward")
def _(grad_output, input, weight, stride, padding, dilation, groups, output_mask, variant=None, grad_weight_dtype=None):
    _check_fake("conv2d_backward", input, weight, None, stride, padding, dilation, groups)
    # A result left out is a fresh empty tensor of its own (the real kernel's do not alias one another).
    grad_input = _empty(grad_output, input.shape if output_mask[0] else (0,),
                        _output_format(input, weight) if output_mask[0] else torch.contiguous_format)  # fmt: skip
    # grad_weight_dtype: float32 for a half weight (csrc/conv2d.h).
    grad_weight = _empty(grad_output, weight.shape if output_mask[1] else (0,),
                         _memory_format(weight) if output_mask[1] else torch.contiguous_format,
                         grad_weight_dtype if output_mask[1] else None)  # fmt: skip
    grad_bias = grad_output.new_empty((weight.shape[0],) if output_mask[2] else (0,))
    return grad_input, grad_weight, grad_bias


# Autograd and the autocast rules are C++ (csrc/autograd.cpp, csrc/autocast.cpp).
