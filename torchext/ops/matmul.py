"""matmul and linear: the GEMM engine with its fused epilogue (+bias, then relu / gelu / gelu_tanh / silu).

matmul(a, b, kernel=None) is torch.matmul for a (*, M, K) and b (K, N) or (*, K, N) with broadcast batch dimensions
(both at least 2-D). On CUDA, ``kernel`` names one version of the ladder in cuda_ops/ (see ``MATMUL_KERNELS``);
None picks the fastest that supports the arguments, and ``matmul_kernel`` tells which that is. Operands are read
through their strides: a transposed or sliced operand is not copied (on CUDA with kernel=None, an operand with no
unit stride in its last two dimensions is copied once so that the fast kernels can take it).

linear(input, weight, bias=None, activation=None) is act(input @ weight.T + bias), one kernel forward; backward
computes the activation's gradient and the bias gradient in one pass, then two GEMMs reading the transposes in
place.

float32 on CUDA uses tf32 tensor cores only where torch allows tf32 for matmul
(torch.backends.cuda.matmul.allow_tf32 / torch.set_float32_matmul_precision).

Autocast rule: under CUDA autocast, floating inputs other than float64 are cast to the autocast dtype (float16 or
bfloat16), as torch does for matmul and linear. Under CPU autocast they are cast to float32 (the CPU kernels are
float32/float64).
"""

from typing import Optional

import torch
from torch import Tensor

from ._common import autocast_cpu_to_float32, autocast_cuda_to_autocast_dtype, needs_grad

__all__ = ["matmul", "matmul_kernel", "linear", "ACTIVATIONS", "MATMUL_KERNELS"]

_ops = torch.ops.torchext

# The epilogue activations, by the names linear's `activation` takes (None means "none").
ACTIVATIONS = ("none", "relu", "gelu", "gelu_tanh", "silu")
# The CUDA ladder, slowest first (cuda_ops/matmul.cuh); CPU tensors run "cpu".
MATMUL_KERNELS = ("naive", "smem_tiled", "register_blocked", "vectorized", "warp_tiled", "mma_sync", "wgmma")

_SAVES_PREACTIVATION = ("gelu", "gelu_tanh", "silu")


def activation_name(activation: Optional[str]) -> str:
    """The schema's name for an activation argument: None -> 'none'; anything unknown raises ValueError."""
    if activation is None:
        return "none"
    if activation not in ACTIVATIONS:
        valid = ", ".join(repr(a) for a in ACTIVATIONS)
        raise ValueError(f"torchext: unknown activation {activation!r}; valid: None, {valid}")
    return activation


def matmul(a: Tensor, b: Tensor, kernel: Optional[str] = None) -> Tensor:
    """a @ b for a (*, M, K) and b (K, N) or (*, K, N); batch dimensions broadcast. Returns (*batch, M, N)."""
    return _ops.matmul.default(a, b, kernel)


def matmul_kernel(a: Tensor, b: Tensor, kernel: Optional[str] = None) -> str:
    """The kernel matmul(a, b, kernel) would run ('cpu' for CPU tensors); raises as matmul would if it cannot."""
    return _ops.matmul_kernel.default(a, b, kernel)


def linear(input: Tensor, weight: Tensor, bias: Optional[Tensor] = None, activation: Optional[str] = None) -> Tensor:
    """act(input @ weight.T + bias): input (*, in_features), weight (out_features, in_features), bias
    (out_features,); activation None / 'none', 'relu', 'gelu', 'gelu_tanh' or 'silu'."""
    return _ops.linear.default(input, weight, bias, activation_name(activation))[0]


# Fake kernels: shapes and dtypes of the results, for torch.compile and meta tensors. Every result is contiguous.
@torch.library.register_fake("torchext::matmul")
def _(a, b, kernel=None):
    torch._check(a.dim() >= 2 and b.dim() >= 2, lambda: "torchext::matmul: `a` and `b` must be at least 2-D")
    torch._check(
        a.shape[-1] == b.shape[-2],
        lambda: f"torchext::matmul: `b` must have {a.shape[-1]} rows to match `a`'s {a.shape[-1]} columns",
    )
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return a.new_empty((*batch, a.shape[-2], b.shape[-1]))


@torch.library.register_fake("torchext::linear")
def _(input, weight, bias=None, activation="none"):
    shape = (*input.shape[:-1], weight.shape[0])
    saved = input.new_empty(shape) if activation in _SAVES_PREACTIVATION else input.new_empty((0,))
    return input.new_empty(shape), saved


@torch.library.register_fake("torchext::linear_backward")
def _(grad_out, input, weight, out, saved, activation, has_bias, output_mask):
    grad_input = grad_out.new_empty(input.shape) if output_mask[0] else grad_out.new_empty((0,))
    grad_weight = grad_out.new_empty(weight.shape) if output_mask[1] else grad_out.new_empty((0,))
    grad_bias = grad_out.new_empty((weight.shape[0],)) if has_bias and output_mask[2] else grad_out.new_empty((0,))
    return grad_input, grad_weight, grad_bias


# Autograd.
def _matmul_setup(ctx, inputs, output):
    a, b = inputs[0], inputs[1]
    ctx.a_shape, ctx.b_shape = a.shape, b.shape
    ctx.save_for_backward(a if needs_grad(ctx, 1) else None, b if needs_grad(ctx, 0) else None)


def _matmul_backward(ctx, grad):
    a, b = ctx.saved_tensors
    grad_a = grad_b = None
    if needs_grad(ctx, 0):
        # (*batch, M, N) @ (*, N, K), b's transpose read in place; then summed over a's broadcast dimensions.
        grad_a = matmul(grad, b.mT).sum_to_size(ctx.a_shape)
    if needs_grad(ctx, 1):
        if len(ctx.b_shape) == 2:
            # One (K, M*) @ (M*, N) product over every row of every batch entry (flatten, not reshape(-1, k):
            # that is ambiguous when k or n is 0).
            grad_b = matmul(a.flatten(0, -2).mT, grad.flatten(0, -2))
        else:
            grad_b = matmul(a.mT, grad).sum_to_size(ctx.b_shape)
    return grad_a, grad_b, None


torch.library.register_autograd("torchext::matmul", _matmul_backward, setup_context=_matmul_setup)


# linear's autograd and CUDA autocast rule are C++ (csrc/autograd.cpp).

for _name in ("matmul", "matmul_kernel"):
    autocast_cuda_to_autocast_dtype(f"torchext::{_name}")
for _name in ("matmul", "matmul_kernel", "linear"):
    autocast_cpu_to_float32(f"torchext::{_name}")
autocast_cpu_to_float32("torchext::linear_backward")
