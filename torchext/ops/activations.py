"""Activations: relu, leaky_relu, sigmoid, tanh, gelu, silu; and add, the residual add where it is not fused.

Layout rule (docs/compile.md): a forward's result takes `self`'s memory format, as ATen's elementwise ops do: the
same strides when `self` is non-overlapping and dense (contiguous, channels-last 2-D or 3-D, transposed, any
permutation), contiguous otherwise (sliced, expanded). A backward's gradient takes the layout of the tensor it
differentiates from (`output` or `self`) by the same rule, whatever grad_output's layout; the fake kernels below
return exactly that. add's result follows `self` by the same rule, whatever `other`'s layout.

Autocast rule: on CUDA they run in the dtype they are given (float16/bfloat16 kernels compute in float32
internally), like PyTorch's own activations. Under CPU autocast their inputs are cast to float32, since the CPU
kernels are float32/float64 only. add has no rule on either device: it has all four floating dtypes on both, and
its operands must share one (torch's add under autocast promotes, which for one dtype changes nothing).
"""

import torch
from torch import Tensor

from ._common import empty_like_dense, not_a_tensor

__all__ = ["relu", "leaky_relu", "sigmoid", "tanh", "gelu", "silu", "add"]

_ops = torch.ops.torchext


def relu(input: Tensor) -> Tensor:
    """max(input, 0), elementwise."""
    if not isinstance(input, Tensor):
        raise not_a_tensor("relu", "input", input)
    return _ops.relu.default(input)


def leaky_relu(input: Tensor, negative_slope: float = 0.01) -> Tensor:
    """input where input > 0, negative_slope * input elsewhere."""
    if not isinstance(input, Tensor):
        raise not_a_tensor("leaky_relu", "input", input)
    return _ops.leaky_relu.default(input, negative_slope)


def sigmoid(input: Tensor) -> Tensor:
    """1 / (1 + exp(-input)), elementwise."""
    if not isinstance(input, Tensor):
        raise not_a_tensor("sigmoid", "input", input)
    return _ops.sigmoid.default(input)


def tanh(input: Tensor) -> Tensor:
    """Hyperbolic tangent, elementwise."""
    if not isinstance(input, Tensor):
        raise not_a_tensor("tanh", "input", input)
    return _ops.tanh.default(input)


def gelu(input: Tensor, approximate: str = "none") -> Tensor:
    """x * Phi(x) with the exact normal CDF (approximate='none') or its tanh approximation (approximate='tanh')."""
    if not isinstance(input, Tensor):
        raise not_a_tensor("gelu", "input", input)
    return _ops.gelu.default(input, approximate=approximate)


def silu(input: Tensor) -> Tensor:
    """input * sigmoid(input), elementwise."""
    if not isinstance(input, Tensor):
        raise not_a_tensor("silu", "input", input)
    return _ops.silu.default(input)


def add(input: Tensor, other: Tensor) -> Tensor:
    """input + other, elementwise, for tensors of the same shape, dtype and device (no broadcasting, no type
    promotion: torch.add for such tensors, the half types added in float32 and rounded once)."""
    if not isinstance(input, Tensor):
        raise not_a_tensor("add", "input", input)
    if not isinstance(other, Tensor):
        raise not_a_tensor("add", "other", other)
    return _ops.add.default(input, other)


def fork(input: Tensor, n: int) -> tuple:
    """n aliases (views) of input whose gradients one autograd node sums with add (torchext.functional.fork; the op
    checks n)."""
    if not isinstance(input, Tensor):
        raise not_a_tensor("fork", "input", input)
    return tuple(_ops.fork.default(input, n))


# Fake kernels: shape, dtype and layout of the results, for torch.compile and meta tensors (the layout rule above).
for _name in ("relu", "sigmoid", "tanh", "silu"):
    torch.library.register_fake(f"torchext::{_name}", lambda self: empty_like_dense(self))
    torch.library.register_fake(f"torchext::{_name}_backward", lambda grad_output, saved: empty_like_dense(saved))


@torch.library.register_fake("torchext::leaky_relu")
def _(self, negative_slope=0.01):
    return empty_like_dense(self)


@torch.library.register_fake("torchext::leaky_relu_backward")
def _(grad_output, self, negative_slope):
    return empty_like_dense(self)


@torch.library.register_fake("torchext::gelu")
def _(self, *, approximate="none"):
    return empty_like_dense(self)


@torch.library.register_fake("torchext::gelu_backward")
def _(grad_output, self, *, approximate="none"):
    return empty_like_dense(self)


@torch.library.register_fake("torchext::add")
def _(self, other):
    # The kernels' checks (csrc/checks.h: check_floating_or_half, check_like), so that a traced call fails as an
    # eager one does.
    op = "torchext::add"
    if self.dtype not in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        raise TypeError(f"{op}: `self` must be float32, float64, float16 or bfloat16, got {self.dtype}")
    if other.device != self.device:
        raise RuntimeError(f"{op}: `other` must be on the same device as `self` ({self.device}), got {other.device}")
    if other.dtype != self.dtype:
        raise TypeError(f"{op}: `other` must have the same dtype as `self` ({self.dtype}), got {other.dtype}")
    if other.shape != self.shape:
        raise ValueError(
            f"{op}: `other` must have the same shape as `self` {list(self.shape)}, got {list(other.shape)}"
        )
    return empty_like_dense(self)


# Autograd is C++ (csrc/autograd.cpp): relu, sigmoid and tanh differentiate from their output; leaky_relu, gelu
# and silu from their input; add passes grad_output to both inputs. The CPU autocast rule too (csrc/autocast.cpp).
