"""torch.nn-compatible modules backed by torchext's ops.

Each class subclasses the torch.nn module it replaces and only changes ``forward``, so constructor arguments,
buffers (a loss's ``weight``, ``pos_weight``), ``state_dict`` keys, ``repr`` and ``isinstance`` checks are
torch.nn's own: a swapped model loads a stock checkpoint and the other way round.
"""

from typing import Optional

import torch
from torch import Tensor, nn

from . import functional as F
from .ops.conv2d import conv2d_activation_name
from .ops.matmul import activation_name

__all__ = [
    "ReLU",
    "LeakyReLU",
    "Sigmoid",
    "Tanh",
    "GELU",
    "SiLU",
    "Softmax",
    "LogSoftmax",
    "CrossEntropyLoss",
    "MSELoss",
    "BCEWithLogitsLoss",
    "MultiMarginLoss",
    "Linear",
    "Conv2d",
    "MaxPool2d",
    "AvgPool2d",
    "AdaptiveAvgPool2d",
]


class ReLU(nn.ReLU):
    """``inplace`` is accepted but ignored: the result is always a new tensor."""

    def forward(self, input: Tensor) -> Tensor:
        return F.relu(input)


class LeakyReLU(nn.LeakyReLU):
    """``inplace`` is accepted but ignored: the result is always a new tensor."""

    def forward(self, input: Tensor) -> Tensor:
        return F.leaky_relu(input, self.negative_slope)


class Sigmoid(nn.Sigmoid):
    def forward(self, input: Tensor) -> Tensor:
        return F.sigmoid(input)


class Tanh(nn.Tanh):
    def forward(self, input: Tensor) -> Tensor:
        return F.tanh(input)


class GELU(nn.GELU):
    def forward(self, input: Tensor) -> Tensor:
        return F.gelu(input, self.approximate)


class SiLU(nn.SiLU):
    """``inplace`` is accepted but ignored: the result is always a new tensor."""

    def forward(self, input: Tensor) -> Tensor:
        return F.silu(input)


class Softmax(nn.Softmax):
    def forward(self, input: Tensor) -> Tensor:
        return F.softmax(input, self.dim)


class LogSoftmax(nn.LogSoftmax):
    def forward(self, input: Tensor) -> Tensor:
        return F.log_softmax(input, self.dim)


class CrossEntropyLoss(nn.CrossEntropyLoss):
    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.cross_entropy(
            input,
            target,
            weight=self.weight,
            ignore_index=self.ignore_index,
            reduction=self.reduction,
            label_smoothing=self.label_smoothing,
        )


class MSELoss(nn.MSELoss):
    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.mse_loss(input, target, reduction=self.reduction)


class BCEWithLogitsLoss(nn.BCEWithLogitsLoss):
    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.binary_cross_entropy_with_logits(
            input, target, self.weight, pos_weight=self.pos_weight, reduction=self.reduction
        )


class MultiMarginLoss(nn.MultiMarginLoss):
    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.multi_margin_loss(input, target, p=self.p, margin=self.margin, weight=self.weight, reduction=self.reduction)


def _copy_parameters(module: nn.Module, source: nn.Module) -> nn.Module:
    """``module`` (built by ``from_torch`` with skip_init) given a copy of ``source``'s weight and bias, their
    requires_grad flags and its training mode."""
    with torch.no_grad():
        module.weight.copy_(source.weight)
        if source.bias is not None:
            module.bias.copy_(source.bias)
    module.weight.requires_grad_(source.weight.requires_grad)
    if source.bias is not None:
        module.bias.requires_grad_(source.bias.requires_grad)
    return module.train(source.training)


class Linear(nn.Linear):
    """torch.nn.Linear with an optional activation fused into the same kernel: y = act(x W^T + b).

    Same constructor arguments (plus ``activation``: None / 'none', 'relu', 'gelu', 'gelu_tanh', 'silu'),
    parameters, initialisation and state_dict keys as torch.nn.Linear, so checkpoints load both ways; a stock
    model's layer converts with ``Linear.from_torch(layer, activation=...)``.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        device=None,
        dtype=None,
        activation: Optional[str] = None,
    ) -> None:
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self.activation = activation_name(activation)

    def forward(self, input: Tensor) -> Tensor:
        return F.linear(input, self.weight, self.bias, self.activation)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, activation={self.activation!r}"

    @classmethod
    def from_torch(cls, linear: nn.Linear, activation: Optional[str] = None) -> "Linear":
        """A torchext Linear holding a copy of ``linear``'s parameters, on its device, in its dtype, in its
        training mode, with the same requires_grad flags."""
        weight = linear.weight
        module = torch.nn.utils.skip_init(
            cls,
            linear.in_features,
            linear.out_features,
            bias=linear.bias is not None,
            device=weight.device,
            dtype=weight.dtype,
            activation=activation,
        )
        return _copy_parameters(module, linear)


class Conv2d(nn.Conv2d):
    """torch.nn.Conv2d computed by torchext's conv2d, with an optional ReLU fused into the same kernel.

    Same constructor arguments (plus ``activation``: None / 'none' or 'relu'), parameters, initialisation and
    state_dict keys as torch.nn.Conv2d, so checkpoints load both ways. ``padding`` may be an int, a pair, 'valid' or
    'same'; a ``padding_mode`` other than 'zeros' pads the input with F.pad first, as torch.nn.Conv2d does. A stock
    layer converts with ``Conv2d.from_torch(conv, activation=...)``.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size,
        stride=1,
        padding=0,
        dilation=1,
        groups: int = 1,
        bias: bool = True,
        padding_mode: str = "zeros",
        device=None,
        dtype=None,
        activation: Optional[str] = None,
    ) -> None:
        super().__init__(
            in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias, padding_mode,
            device=device, dtype=dtype,
        )  # fmt: skip
        self.activation = conv2d_activation_name(activation)

    def _conv_forward(self, input: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
        if self.padding_mode != "zeros":
            padded = torch.nn.functional.pad(input, self._reversed_padding_repeated_twice, mode=self.padding_mode)
            return F.conv2d(padded, weight, bias, self.stride, 0, self.dilation, self.groups,
                            activation=self.activation)  # fmt: skip
        return F.conv2d(input, weight, bias, self.stride, self.padding, self.dilation, self.groups,
                        activation=self.activation)  # fmt: skip

    def forward(self, input: Tensor) -> Tensor:
        return self._conv_forward(input, self.weight, self.bias)

    def extra_repr(self) -> str:
        extra = super().extra_repr()
        return extra if self.activation == "none" else f"{extra}, activation={self.activation!r}"

    @classmethod
    def from_torch(cls, conv: nn.Conv2d, activation: Optional[str] = None) -> "Conv2d":
        """A torchext Conv2d holding a copy of ``conv``'s parameters, on its device, in its dtype, in its training
        mode, with the same requires_grad flags."""
        weight = conv.weight
        module = torch.nn.utils.skip_init(
            cls, conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding, conv.dilation,
            conv.groups, conv.bias is not None, conv.padding_mode, device=weight.device, dtype=weight.dtype,
            activation=activation,
        )  # fmt: skip
        return _copy_parameters(module, conv)


# --- pooling: no parameters, so from_torch builds the same module with torchext's forward -----------------------


def _same_pool(cls: type, module: nn.Module, **kwargs) -> nn.Module:
    return cls(**kwargs).train(module.training)


class MaxPool2d(nn.MaxPool2d):
    """torch.nn.MaxPool2d computed by torchext's max_pool2d (``return_indices`` gives torch's int64 indices)."""

    def forward(self, input: Tensor):
        return F.max_pool2d(input, self.kernel_size, self.stride, self.padding, self.dilation,
                            ceil_mode=self.ceil_mode, return_indices=self.return_indices)  # fmt: skip

    @classmethod
    def from_torch(cls, pool: nn.MaxPool2d) -> "MaxPool2d":
        return _same_pool(cls, pool, kernel_size=pool.kernel_size, stride=pool.stride, padding=pool.padding,
                          dilation=pool.dilation, return_indices=pool.return_indices,
                          ceil_mode=pool.ceil_mode)  # fmt: skip


class AvgPool2d(nn.AvgPool2d):
    """torch.nn.AvgPool2d computed by torchext's avg_pool2d."""

    def forward(self, input: Tensor) -> Tensor:
        return F.avg_pool2d(input, self.kernel_size, self.stride, self.padding, self.ceil_mode, self.count_include_pad,
                            self.divisor_override)  # fmt: skip

    @classmethod
    def from_torch(cls, pool: nn.AvgPool2d) -> "AvgPool2d":
        return _same_pool(cls, pool, kernel_size=pool.kernel_size, stride=pool.stride, padding=pool.padding,
                          ceil_mode=pool.ceil_mode, count_include_pad=pool.count_include_pad,
                          divisor_override=pool.divisor_override)  # fmt: skip


class AdaptiveAvgPool2d(nn.AdaptiveAvgPool2d):
    """torch.nn.AdaptiveAvgPool2d computed by torchext's adaptive_avg_pool2d (output 1 x 1: the global pool's fast
    path on channels-last CUDA tensors)."""

    def forward(self, input: Tensor) -> Tensor:
        return F.adaptive_avg_pool2d(input, self.output_size)

    @classmethod
    def from_torch(cls, pool: nn.AdaptiveAvgPool2d) -> "AdaptiveAvgPool2d":
        return _same_pool(cls, pool, output_size=pool.output_size)
