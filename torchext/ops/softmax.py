"""Softmax and log_softmax over the last dimension.

The ops reduce over the last dimension of a tensor of any shape (a 0-dim tensor is one element) and return a
contiguous result of the input's shape, whatever the input's layout (the layout rule, docs/compile.md; the backward
ops too). Backward differentiates from the saved output alone:
softmax: grad_input = y * (grad - sum(grad * y)); log_softmax: grad_input = grad - exp(y) * sum(grad).

Autocast rule: under torch.autocast (CUDA and CPU), all four ops cast their floating inputs to float32 and return
float32, as PyTorch runs softmax and log_softmax in float32 under autocast (csrc/autocast.cpp).
"""

import torch
from torch import Tensor

from ._common import not_a_tensor

__all__ = ["softmax", "log_softmax"]

_ops = torch.ops.torchext


def softmax(input: Tensor) -> Tensor:
    """exp(input) / sum(exp(input)) over the last dimension, computed stably (the row max is subtracted first)."""
    if not isinstance(input, Tensor):
        raise not_a_tensor("softmax", "input", input)
    return _ops.softmax.default(input)


def log_softmax(input: Tensor) -> Tensor:
    """input - log(sum(exp(input))) over the last dimension, computed stably (the row max is subtracted first)."""
    if not isinstance(input, Tensor):
        raise not_a_tensor("log_softmax", "input", input)
    return _ops.log_softmax.default(input)


# Fake kernels: the C++ ops return a new contiguous tensor of the input's shape and dtype.
for _name in ("softmax", "log_softmax"):
    torch.library.register_fake(f"torchext::{_name}", lambda self: self.new_empty(self.shape))
    torch.library.register_fake(
        f"torchext::{_name}_backward", lambda grad_output, output: output.new_empty(output.shape)
    )


# Autograd is C++ (csrc/autograd.cpp): both differentiate from their output. Autocast too (csrc/autocast.cpp).
