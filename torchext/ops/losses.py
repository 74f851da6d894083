"""Losses: mse_loss, binary_cross_entropy_with_logits, multi_margin_loss.

Semantics are torch.nn.functional's (including mse_loss's weighted mean, sum(w (x - y)^2) / sum(w)); 'mean' and
'sum' give a 0-dim tensor of the input's dtype. Reductions are deterministic on both backends.
Layout rule (docs/compile.md): every result, reduction='none' and the backward ops included, is contiguous, whatever
the input's layout (torch's pointwise losses keep a channels-last input's layout under 'none').

Autocast rule: under torch.autocast (CUDA and CPU) every op here, backward included, runs in float32, as PyTorch
runs its own losses; the result is float32 whatever the autocast dtype (csrc/autocast.cpp).
"""

import warnings
from typing import Optional

import torch
from torch import Tensor

from ._common import not_a_tensor

__all__ = ["mse_loss", "binary_cross_entropy_with_logits", "multi_margin_loss"]

_ops = torch.ops.torchext

_REDUCTIONS = ("none", "mean", "sum")


def mse_loss(input: Tensor, target: Tensor, weight: Optional[Tensor] = None, reduction: str = "mean") -> Tensor:
    """Squared error w (input - target)^2; 'mean' divides the sum by the number of elements, or by sum(weight) when
    weight (input's shape) is given. A target of another shape is broadcast against input, with a warning, as in
    torch.nn.functional.mse_loss; weight then broadcasts too, and the weighted mean still divides by the sum of the
    weight as given (not of its broadcast copy), as torch's does."""
    if not isinstance(input, Tensor):
        raise not_a_tensor("mse_loss", "input", input)
    if not isinstance(target, Tensor):
        raise not_a_tensor("mse_loss", "target", target)
    if weight is not None and not isinstance(weight, Tensor):
        raise not_a_tensor("mse_loss", "weight", weight, optional=True)
    if target.size() != input.size():
        warnings.warn(
            f"Using a target size ({target.size()}) that is different to the input size ({input.size()}). "
            "This will likely lead to incorrect results due to broadcasting. "
            "Please ensure they have the same size.",
            stacklevel=2,
        )
        if weight is not None and weight.size() != input.size():
            raise ValueError(
                f"torchext mse_loss(): `weight` must have the input's size {tuple(input.shape)}, got "
                f"{tuple(weight.shape)}"
            )
        try:
            input, target = (t.contiguous() for t in torch.broadcast_tensors(input, target))
        except RuntimeError as e:
            raise RuntimeError(
                f"torchext mse_loss(): `target` of shape {tuple(target.shape)} does not broadcast against `input` of "
                f"shape {tuple(input.shape)}"
            ) from e
        if weight is not None:
            expanded = weight.expand(input.shape).contiguous()
            if reduction == "mean":
                return _ops.mse_loss.default(input, target, expanded, "sum") / weight.sum()
            weight = expanded
    return _ops.mse_loss.default(input, target, weight, reduction)


def binary_cross_entropy_with_logits(
    input: Tensor,
    target: Tensor,
    weight: Optional[Tensor] = None,
    pos_weight: Optional[Tensor] = None,
    reduction: str = "mean",
) -> Tensor:
    """Binary cross entropy on logits, computed stably: w ((1 - y) x + (1 + (pos_weight - 1) y) softplus(-x)).
    target has input's shape; weight broadcasts to input's shape, pos_weight too (typically one value per class,
    along the last dimension). 'mean' divides by the number of elements."""
    if not isinstance(input, Tensor):
        raise not_a_tensor("binary_cross_entropy_with_logits", "input", input)
    if not isinstance(target, Tensor):
        raise not_a_tensor("binary_cross_entropy_with_logits", "target", target)
    if weight is not None and not isinstance(weight, Tensor):
        raise not_a_tensor("binary_cross_entropy_with_logits", "weight", weight, optional=True)
    if pos_weight is not None and not isinstance(pos_weight, Tensor):
        raise not_a_tensor("binary_cross_entropy_with_logits", "pos_weight", pos_weight, optional=True)
    return _ops.binary_cross_entropy_with_logits.default(input, target, weight, pos_weight, reduction)


def multi_margin_loss(
    input: Tensor,
    target: Tensor,
    p: int = 1,
    margin: float = 1.0,
    weight: Optional[Tensor] = None,
    reduction: str = "mean",
) -> Tensor:
    """Multi-class hinge loss on input (N, C) or (C,) with int64 class indices target (N,) or 0-dim:
    per row, weight[y] / C * sum over j != y of max(0, margin - input[y] + input[j])^p, p in {1, 2}.
    'mean' divides by N. A target outside [0, C) raises IndexError; on CUDA, by default from a later call or
    ``check_targets()``, as for cross_entropy (the offending rows give NaN)."""
    if not isinstance(input, Tensor):
        raise not_a_tensor("multi_margin_loss", "input", input)
    if not isinstance(target, Tensor):
        raise not_a_tensor("multi_margin_loss", "target", target)
    if weight is not None and not isinstance(weight, Tensor):
        raise not_a_tensor("multi_margin_loss", "weight", weight, optional=True)
    return _ops.multi_margin_loss.default(input, target, p, margin, weight, reduction)


# Fake kernels: shape and dtype of the results, for torch.compile and meta tensors. Results are contiguous.
def _check_reduction(reduction: str) -> None:
    if reduction not in _REDUCTIONS:
        raise ValueError(f"`reduction` must be 'none', 'mean' or 'sum', got '{reduction}'")


def _pointwise_loss_like(self: Tensor, reduction: str) -> Tensor:
    _check_reduction(reduction)
    return self.new_empty(self.shape if reduction == "none" else ())


@torch.library.register_fake("torchext::mse_loss")
def _(self, target, weight=None, reduction="mean"):
    return _pointwise_loss_like(self, reduction)


@torch.library.register_fake("torchext::mse_loss_backward")
def _(grad_output, self, target, weight, reduction):
    _check_reduction(reduction)
    return self.new_empty(self.shape)


@torch.library.register_fake("torchext::binary_cross_entropy_with_logits")
def _(self, target, weight=None, pos_weight=None, reduction="mean"):
    return _pointwise_loss_like(self, reduction)


@torch.library.register_fake("torchext::binary_cross_entropy_with_logits_backward")
def _(grad_output, self, target, weight, pos_weight, reduction, wrt_target=False):
    _check_reduction(reduction)
    return self.new_empty(self.shape)


@torch.library.register_fake("torchext::multi_margin_loss")
def _(self, target, p=1, margin=1.0, weight=None, reduction="mean"):
    _check_reduction(reduction)
    if reduction == "none" and target.dim() > 0:
        return self.new_empty((target.numel(),))
    return self.new_empty(())


@torch.library.register_fake("torchext::multi_margin_loss_backward")
def _(grad_output, self, target, p, margin, weight, reduction):
    _check_reduction(reduction)
    return self.new_empty(self.shape)


# Autograd is C++ (csrc/autograd.cpp), for the ops and their backward ops (double backward): gradients with
# respect to input and, for mse_loss and binary_cross_entropy_with_logits, target; asking for one with respect to
# `weight` or `pos_weight` raises NotImplementedError. The autocast rule is C++ too (csrc/autocast.cpp).
