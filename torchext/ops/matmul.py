"""matmul and linear: the GEMM engine with its fused epilogue (+bias, then relu / gelu / gelu_tanh / silu).

matmul(a, b, kernel=None) is torch.matmul for a (*, M, K) and b (K, N) or (*, K, N) with broadcast batch dimensions
(both at least 2-D). On CUDA, ``kernel`` names one version of the ladder in cuda_ops/ (see ``MATMUL_KERNELS``);
None picks the fastest that supports the arguments, and ``matmul_kernel`` tells which that is (the schema names
the argument ``variant``: inductor's fallback takes a ``kernel`` argument of its own). Operands are read
through their strides: a transposed or sliced operand is not copied (on CUDA with kernel=None, an operand with no
unit stride in its last two dimensions is copied once so that the fast kernels can take it).

linear(input, weight, bias=None, activation=None) is act(input @ weight.T + bias), one kernel forward; backward
computes the activation's gradient and the bias gradient in one pass, then two GEMMs reading the transposes in
place.

Layout rule (docs/compile.md): every result is a new contiguous tensor, whatever the operands' layouts.
``matmul_kernel`` returns a str; its fake kernel returns 'cpu' for CPU tensors and raises for CUDA tensors, whose
kernel choice depends on the GPU and the operands' alignment: call it outside torch.compile.

float32 on CUDA uses tf32 tensor cores only where torch allows tf32 for matmul
(torch.backends.cuda.matmul.allow_tf32 / torch.set_float32_matmul_precision).

Autocast rule: under CUDA autocast, floating inputs other than float64 are cast to the autocast dtype (float16 or
bfloat16), as torch does for matmul and linear (csrc/matmul_autograd.cpp, csrc/autograd.cpp). Under CPU autocast
they are cast to float32 (the CPU kernels are float32/float64; csrc/autocast.cpp).

Autograd (C++: csrc/matmul_autograd.cpp for matmul, csrc/autograd.cpp for linear): matmul's backward calls matmul
(so it is differentiable), linear's the fused linear_backward op.
"""

from typing import Optional

import torch
from torch import Tensor

from ._common import not_a_tensor

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
    if not isinstance(a, Tensor):
        raise not_a_tensor("matmul", "a", a)
    if not isinstance(b, Tensor):
        raise not_a_tensor("matmul", "b", b)
    return _ops.matmul.default(a, b, kernel)


def matmul_kernel(a: Tensor, b: Tensor, kernel: Optional[str] = None) -> str:
    """The kernel matmul(a, b, kernel) would run ('cpu' for CPU tensors); raises as matmul would if it cannot."""
    if not isinstance(a, Tensor):
        raise not_a_tensor("matmul_kernel", "a", a)
    if not isinstance(b, Tensor):
        raise not_a_tensor("matmul_kernel", "b", b)
    return _ops.matmul_kernel.default(a, b, kernel)


def linear(input: Tensor, weight: Tensor, bias: Optional[Tensor] = None, activation: Optional[str] = None) -> Tensor:
    """act(input @ weight.T + bias): input (*, in_features), weight (out_features, in_features), bias
    (out_features,); activation None / 'none', 'relu', 'gelu', 'gelu_tanh' or 'silu'."""
    if not isinstance(input, Tensor):
        raise not_a_tensor("linear", "input", input)
    if not isinstance(weight, Tensor):
        raise not_a_tensor("linear", "weight", weight)
    if bias is not None and not isinstance(bias, Tensor):
        raise not_a_tensor("linear", "bias", bias, optional=True)
    return _ops.linear.default(input, weight, bias, activation_name(activation))[0]


# Fake kernels: shapes and dtypes of the results, for torch.compile and meta tensors. Layout rule (docs/compile.md):
# every result is contiguous, whatever the operands' layouts (the kernels read operands through their strides and
# write a new row-major output).
def _check_matmul_shapes(op: str, a, b) -> None:
    torch._check(a.dim() >= 2 and b.dim() >= 2, lambda: f"torchext::{op}: `a` and `b` must be at least 2-D")
    torch._check(
        a.shape[-1] == b.shape[-2],
        lambda: f"torchext::{op}: `b` must have {a.shape[-1]} rows to match `a`'s {a.shape[-1]} columns",
    )


@torch.library.register_fake("torchext::matmul")
def _(a, b, variant=None):
    _check_matmul_shapes("matmul", a, b)
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return a.new_empty((*batch, a.shape[-2], b.shape[-1]))


@torch.library.register_fake("torchext::matmul_kernel")
def _(a, b, variant=None):
    """CPU tensors run one kernel, 'cpu', which metadata alone decides. On CUDA the choice (and whether a named kernel
    can run) depends on the data pointers' alignment and the GPU, which a fake tensor does not have: tracing it
    raises instead of guessing. Call matmul_kernel outside the compiled region."""
    _check_matmul_shapes("matmul_kernel", a, b)
    if a.device.type != "cpu":
        raise NotImplementedError(
            f"torchext::matmul_kernel cannot be traced for {a.device.type} tensors (torch.compile, FakeTensorMode, "
            "meta): the kernel it names depends on the operands' data-pointer alignment and the GPU. Call it "
            "outside the compiled function."
        )
    if variant is not None and variant != "cpu":
        raise ValueError(f"torchext::matmul_kernel: CPU tensors take kernel=None or 'cpu', got {variant!r}")
    return "cpu"


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


# The autograd of matmul and linear, and their autocast rules, are C++ (csrc/matmul_autograd.cpp, csrc/autograd.cpp,
# csrc/autocast.cpp): LibTorch programs get them too.
