"""Helpers shared by the op wrappers: output metadata for fake kernels, argument errors, and autocast rules in Python.

Every op of torchext 0.1 has its autocast rules in C++ (csrc/autocast.cpp, csrc/autograd.cpp), so that LibTorch
programs get them too; autocast_to_float32 and autocast_cpu_to_float32 remain for rules that a family still writes in
Python (csrc/autocast.h does the same in one C++ line per op)."""

import torch

try:  # torch >= 2.6 names it this way; it answers False where symbolic sizes leave it unknown.
    from torch._prims_common import is_non_overlapping_and_dense_or_false as is_non_overlapping_and_dense
except ImportError:  # pragma: no cover
    from torch._prims_common import is_non_overlapping_and_dense

# Where each autocast rule applies.
AUTOCAST_DEVICES = ("cuda", "cpu")


def empty_like_dense(t: torch.Tensor) -> torch.Tensor:
    """What the C++ ops allocate for an elementwise result (csrc/checks.h, `dense`, then `at::empty_like`): `t`'s own
    strides when it is non-overlapping and dense (contiguous, channels-last, any permutation, with or without a
    storage offset), a contiguous tensor otherwise (sliced, expanded). An elementwise backward passes the tensor it
    saved from the forward: its gradient takes that layout whatever grad_output's (csrc/checks.h, in_layout_of)."""
    if is_non_overlapping_and_dense(t):
        # ATen's empty_like(preserve_format) copies a dense tensor's strides as they are; torch.empty_like under
        # FakeTensorMode recomputes them from the strides' order, which differs where a size is 0 or 1.
        return t.new_empty_strided(t.shape, t.stride())
    return t.new_empty(t.shape)


def autocast_to_float32(qualname: str) -> None:
    """Under torch.autocast (CUDA and CPU), cast the op's floating inputs to float32, as PyTorch does for softmax
    and the losses: the result is float32 whatever the autocast dtype."""
    for device in AUTOCAST_DEVICES:
        torch.library.register_autocast(qualname, device, torch.float32)


def autocast_cpu_to_float32(qualname: str) -> None:
    """Under CPU autocast only, cast to float32: the CPU kernels are float32/float64. On CUDA the op runs in
    whatever dtype it is given (it has float16 and bfloat16 kernels), as PyTorch's activations do.

    Registered as a plain AutocastCPU kernel rather than through torch.library.register_autocast: in torch 2.11
    that function files every device's rule under the AutocastCUDA key, so it fails (KeyError) on an op that
    already has its own AutocastCUDA kernel, as matmul and linear do."""
    _register_autocast_kernel(qualname, "cpu", lambda: torch.float32)


def not_a_tensor(op: str, name: str, value, optional: bool = False) -> TypeError:
    """The error for a non-tensor passed where `op` takes a tensor (or None, where `optional`): it names the argument
    and what came instead. Callers test `isinstance(value, Tensor)` inline first: the hot path pays one check."""
    expected = "a Tensor or None" if optional else "a Tensor"
    return TypeError(f"torchext {op}(): argument `{name}` must be {expected}, got {type(value).__name__}")


def _autocast_cast(arg, dtype: torch.dtype, device: str):
    # torch's autocast casts floating tensors of its device other than float64 (cached_cast's is_eligible).
    if (
        isinstance(arg, torch.Tensor)
        and arg.device.type == device
        and arg.is_floating_point()
        and arg.dtype != torch.float64
    ):
        return arg.to(dtype)
    return arg


def _register_autocast_kernel(qualname: str, device: str, dtype_fn) -> None:
    """An Autocast<device> kernel that casts the op's eligible inputs to dtype_fn() and runs it with autocast off."""
    namespace, name = qualname.split("::")
    op = getattr(getattr(torch.ops, namespace), name).default

    def autocast_kernel(*args, **kwargs):
        dtype = dtype_fn()
        with torch.autocast(device, enabled=False):
            args = tuple(_autocast_cast(a, dtype, device) for a in args)
            kwargs = {k: _autocast_cast(v, dtype, device) for k, v in kwargs.items()}
            return op(*args, **kwargs)

    torch.library.impl(qualname, "Autocast" + ("CUDA" if device == "cuda" else "CPU"), autocast_kernel)
