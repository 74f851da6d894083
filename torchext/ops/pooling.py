"""Pooling: max_pool2d, avg_pool2d and adaptive_avg_pool2d with torch.nn.functional's semantics.

max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False) returns (out, indices), indices
int64 positions ih * W + iw within each (H, W) plane, as F.max_pool2d(..., return_indices=True); NaN propagates (the
last NaN of a window wins, the first of equal maxima). avg_pool2d(input, kernel_size, stride=None, padding=0,
ceil_mode=False, count_include_pad=True, divisor_override=None) and adaptive_avg_pool2d(input, output_size) as
torch's. Input is (N, C, H, W) or unbatched (C, H, W); float32, float64, float16 and bfloat16 on CPU and CUDA (the
averages accumulate the half types in float32). stride None means the kernel size; padding is at most half the
kernel.

Layout rule (csrc/pooling.h): the output and indices are channels-last when a 4-D input suggests channels-last
(``suggest_memory_format``), else contiguous (3-D results are contiguous); grad_input likewise from input. The
kernels read any input layout through its strides.

Backward (csrc/pooling_autograd.cpp): the *_backward ops gather (each input element sums what the windows that cover
it received), so results are deterministic; double backward is implemented (the pools are linear in the input once
the argmax is fixed). No autocast rule: the pools run in their input's dtype, as torch's.
"""

import torch
from torch import Tensor

from ._common import not_a_tensor
from .conv2d import _memory_format

__all__ = ["max_pool2d", "avg_pool2d", "adaptive_avg_pool2d"]

_ops = torch.ops.torchext

IntPair = int | tuple[int, ...] | list[int]


def _is_int(v) -> bool:
    return (isinstance(v, int) and not isinstance(v, bool)) or isinstance(v, torch.SymInt)


def _pair(op: str, name: str, value, allow_none: bool = False) -> list:
    """One int (both dimensions) or a pair as the schema's int[2]; None (allow_none: stride) as [], the kernel size."""
    if value is None and allow_none:
        return []
    if _is_int(value):
        return [value, value]
    if isinstance(value, (tuple, list)) and len(value) in (1, 2) and all(_is_int(v) for v in value):
        return list(value) * (2 // len(value))
    if allow_none and isinstance(value, (tuple, list)) and len(value) == 0:
        return []
    raise TypeError(f"torchext {op}(): `{name}` must be an int or a pair of ints, got {value!r}")


def _check_input(op: str, input) -> None:
    if not isinstance(input, Tensor):
        raise not_a_tensor(op, "input", input)


def max_pool2d(
    input: Tensor,
    kernel_size: IntPair,
    stride: IntPair | None = None,
    padding: IntPair = 0,
    dilation: IntPair = 1,
    ceil_mode: bool = False,
) -> tuple[Tensor, Tensor]:
    """(out, indices) of F.max_pool2d(..., return_indices=True)."""
    _check_input("max_pool2d", input)
    op = "max_pool2d"
    return _ops.max_pool2d.default(
        input, _pair(op, "kernel_size", kernel_size), _pair(op, "stride", stride, allow_none=True),
        _pair(op, "padding", padding), _pair(op, "dilation", dilation), bool(ceil_mode),
    )  # fmt: skip


def avg_pool2d(
    input: Tensor,
    kernel_size: IntPair,
    stride: IntPair | None = None,
    padding: IntPair = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: int | None = None,
) -> Tensor:
    """F.avg_pool2d."""
    _check_input("avg_pool2d", input)
    op = "avg_pool2d"
    if divisor_override is not None and not _is_int(divisor_override):
        raise TypeError(f"torchext {op}(): `divisor_override` must be an int or None, got {divisor_override!r}")
    return _ops.avg_pool2d.default(
        input, _pair(op, "kernel_size", kernel_size), _pair(op, "stride", stride, allow_none=True),
        _pair(op, "padding", padding), bool(ceil_mode), bool(count_include_pad), divisor_override,
    )  # fmt: skip


def adaptive_output_size(input: Tensor, output_size) -> list:
    """F.adaptive_avg_pool2d's output_size as two ints: an int for both, a pair whose None entries keep the
    input's size."""
    op = "adaptive_avg_pool2d"
    if _is_int(output_size):
        return [output_size, output_size]
    if isinstance(output_size, (tuple, list)) and len(output_size) in (1, 2):
        sizes = list(output_size) * (2 // len(output_size))
        if all(v is None or _is_int(v) for v in sizes):
            if any(v is None for v in sizes) and input.dim() < 2:
                raise ValueError(f"torchext {op}(): `input` must have at least 2 dimensions to fill None sizes")
            return [input.shape[d - 2] if v is None else v for d, v in enumerate(sizes)]
    raise TypeError(
        f"torchext {op}(): `output_size` must be an int or a pair of ints (None keeps the input's size), got "
        f"{output_size!r}"
    )


def adaptive_avg_pool2d(input: Tensor, output_size) -> Tensor:
    """F.adaptive_avg_pool2d: output_size an int, or a pair of ints or None (None keeps the input's size)."""
    _check_input("adaptive_avg_pool2d", input)
    return _ops.adaptive_avg_pool2d.default(input, adaptive_output_size(input, output_size))


# Fake kernels: the real kernels' sizes and strides (csrc/pooling.h), for torch.compile and meta tensors.


def _pool_format(input: Tensor) -> torch.memory_format:
    """csrc/pooling.h's pool_memory_format: channels-last iff a 4-D input suggests it."""
    return _memory_format(input) if input.dim() == 4 else torch.contiguous_format


def _fake_check_input(op: str, input: Tensor, allow_empty_c: bool) -> None:
    torch._check(
        input.dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16),
        lambda: f"torchext::{op}: `input` must be float32, float64, float16 or bfloat16, got {input.dtype}",
    )
    torch._check(input.dim() in (3, 4), lambda: f"torchext::{op}: `input` must be 4-D or 3-D, got {input.dim()}-D")
    torch._check(
        input.shape[-1] > 0 and input.shape[-2] > 0 and (allow_empty_c or input.shape[-3] > 0),
        lambda: f"torchext::{op}: `input` must have non-empty channels, height and width",
    )


def _pool_output_size(size, kernel, pad, stride, dilation, ceil_mode):
    """csrc/pooling.h's pool_output_size."""
    out = (size + 2 * pad - dilation * (kernel - 1) - 1 + (stride - 1 if ceil_mode else 0)) // stride + 1
    if ceil_mode and (out - 1) * stride >= size + pad:
        out = out - 1
    return out


def _fake_pool_shape(op, input, kernel_size, stride, padding, dilation, ceil_mode) -> tuple:
    _fake_check_input(op, input, allow_empty_c=False)
    k = _pair(op, "kernel_size", kernel_size)
    s = _pair(op, "stride", stride, allow_none=True) or k
    p = _pair(op, "padding", padding)
    d = _pair(op, "dilation", dilation)
    for i in range(2):
        torch._check(k[i] >= 1 and s[i] >= 1 and d[i] >= 1, lambda: f"torchext::{op}: sizes must be at least 1")
        torch._check(0 <= p[i] <= k[i] // 2, lambda: f"torchext::{op}: `padding` must be in [0, kernel_size / 2]")
    out = [_pool_output_size(input.shape[-2 + i], k[i], p[i], s[i], d[i], ceil_mode) for i in range(2)]
    torch._check(out[0] >= 1 and out[1] >= 1, lambda: f"torchext::{op}: the output would be empty")
    return (*input.shape[:-2], *out)


def _empty(input: Tensor, shape, dtype=None) -> Tensor:
    """csrc/pooling.h's empty_pool_output / empty_pool_grad_input: at::empty in the layout rule's format."""
    return torch.empty(shape, dtype=dtype or input.dtype, device=input.device, memory_format=_pool_format(input))


@torch.library.register_fake("torchext::max_pool2d")
def _(input, kernel_size, stride=(), padding=(0, 0), dilation=(1, 1), ceil_mode=False):
    shape = _fake_pool_shape("max_pool2d", input, kernel_size, stride, padding, dilation, ceil_mode)
    return _empty(input, shape), _empty(input, shape, torch.int64)


@torch.library.register_fake("torchext::max_pool2d_backward")
def _(grad_output, input, kernel_size, stride, padding, dilation, ceil_mode, indices):
    shape = _fake_pool_shape("max_pool2d_backward", input, kernel_size, stride, padding, dilation, ceil_mode)
    torch._check(tuple(grad_output.shape) == shape, lambda: "torchext::max_pool2d_backward: `grad_output` shape")
    torch._check(tuple(indices.shape) == shape, lambda: "torchext::max_pool2d_backward: `indices` shape")
    return _empty(input, input.shape)


@torch.library.register_fake("torchext::avg_pool2d")
def _(input, kernel_size, stride=(), padding=(0, 0), ceil_mode=False, count_include_pad=True, divisor_override=None):
    shape = _fake_pool_shape("avg_pool2d", input, kernel_size, stride, padding, 1, ceil_mode)
    return _empty(input, shape)


@torch.library.register_fake("torchext::avg_pool2d_backward")
def _(grad_output, input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    shape = _fake_pool_shape("avg_pool2d_backward", input, kernel_size, stride, padding, 1, ceil_mode)
    torch._check(tuple(grad_output.shape) == shape, lambda: "torchext::avg_pool2d_backward: `grad_output` shape")
    return _empty(input, input.shape)


@torch.library.register_fake("torchext::adaptive_avg_pool2d")
def _(input, output_size):
    _fake_check_input("adaptive_avg_pool2d", input, allow_empty_c=True)
    out = _pair("adaptive_avg_pool2d", "output_size", output_size)
    torch._check(out[0] >= 0 and out[1] >= 0, lambda: "torchext::adaptive_avg_pool2d: `output_size` negative")
    return _empty(input, (*input.shape[:-2], *out))


@torch.library.register_fake("torchext::adaptive_avg_pool2d_backward")
def _(grad_output, input):
    _fake_check_input("adaptive_avg_pool2d_backward", input, allow_empty_c=True)
    torch._check(
        grad_output.dim() == input.dim() and grad_output.shape[:-2] == input.shape[:-2],
        lambda: "torchext::adaptive_avg_pool2d_backward: `grad_output` must have `input`'s leading sizes",
    )
    return _empty(input, input.shape)
