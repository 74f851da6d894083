"""torch.nn-compatible modules backed by torchext's ops.

Each class subclasses the torch.nn module it replaces and only changes ``forward``, so constructor arguments,
buffers (a loss's ``weight``, ``pos_weight``), ``state_dict`` keys, ``repr`` and ``isinstance`` checks are
torch.nn's own: a swapped model loads a stock checkpoint and the other way round.
"""

from typing import Optional

import torch
from torch import Tensor, nn

from . import functional as F
from . import ops
from .functional import _conv2d_same_padding
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
    "Conv2dStats",
    "BatchNorm1d",
    "BatchNorm2d",
    "BatchNormReLU2d",
    "BatchNormAddReLU2d",
    "Conv2dBatchNormReLU",
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
        return F.multi_margin_loss(
            input, target, p=self.p, margin=self.margin, weight=self.weight, reduction=self.reduction
        )


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


def _sums_if_used(module: nn.Module, training: bool, sum: Optional[Tensor], sum_sq: Optional[Tensor]) -> tuple:
    """(sum, sum_sq) for a BatchNorm's call, or (None, None) where they must not be used: in eval (the running
    statistics normalize), and where a forward pre-hook may have changed the input after the convolution summed it
    (a hook registered after swap_modules): the BatchNorm then computes its own statistics."""
    if not training or sum is None:
        return None, None
    if module._forward_pre_hooks or torch.nn.modules.module._global_forward_pre_hooks:
        return None, None
    return sum, sum_sq


class Conv2dStats(Conv2d):
    """A Conv2d (no activation) that, in training, also returns its output's per-channel sum and sum of squares over
    (N, H, W) from the convolution's epilogue (torchext's conv2d_stats): ``forward(x)`` is ``(out, sum, sum_sq)``,
    ``(out, None, None)`` in eval. The BatchNorm after it takes them as ``bn(out, sum=sum, sum_sq=sum_sq)`` and skips
    its statistics pass. ``swap_modules``' torch.fx pass puts it where a convolution feeds only a BatchNorm (issue 19);
    parameters and state_dict keys are nn.Conv2d's. A forward hook registered on it sees that tuple as the output."""

    def forward(self, input: Tensor) -> tuple:
        if self.activation != "none":
            raise ValueError(f"torchext.nn.Conv2dStats: `activation` must be 'none', got {self.activation!r}")
        if not self.training:
            return self._conv_forward(input, self.weight, self.bias), None, None
        x, padding = _conv2d_input_and_padding(self, input)
        return ops.conv2d_stats(x, self.weight, self.bias, self.stride, padding, self.dilation, self.groups)


# --- batch normalization (torchext/ops/batch_norm.py) ----------------------------------------------------------------


class _TorchextBatchNorm:
    """What torchext's BatchNorm1d and BatchNorm2d share beside their torch.nn base (which holds the parameters,
    buffers and input-dimension check): the forward through torchext's batch_norm and ``from_torch``."""

    _torch_class: type  # the stock class from_torch copies

    def _batch_norm_args(self) -> tuple:
        """(training, momentum, running_mean, running_var, count) for this call, as nn.BatchNorm2d.forward computes
        them, counting the batch in num_batches_tracked when it trains: with a momentum the op counts it on the device
        (``count`` is num_batches_tracked, passed to it), saving the separate add_ launch; with momentum=None the
        factor 1 / num_batches_tracked needs the count first, so it is added here, as torch does (``count`` None)."""
        factor = 0.0 if self.momentum is None else self.momentum
        count = None
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            if self.momentum is None:
                self.num_batches_tracked.add_(1)
                factor = 1.0 / float(self.num_batches_tracked)
            else:
                count = self.num_batches_tracked
        training = self.training or (self.running_mean is None and self.running_var is None)
        keep = not self.training or self.track_running_stats
        return training, factor, self.running_mean if keep else None, self.running_var if keep else None, count

    def forward(self, input: Tensor, sum: Optional[Tensor] = None, sum_sq: Optional[Tensor] = None) -> Tensor:
        """``sum`` / ``sum_sq``: input's per-channel sums over every dimension but 1 (e.g. from a Conv2dStats before
        it); used when the batch's statistics normalize (training) and no forward pre-hook is registered, ignored
        otherwise."""
        self._check_input_dim(input)
        training, momentum, running_mean, running_var, count = self._batch_norm_args()
        s, ss = _sums_if_used(self, training, sum, sum_sq)
        return F.batch_norm(input, running_mean, running_var, self.weight, self.bias, training, momentum, self.eps,
                            sum=s, sum_sq=ss, num_batches_tracked=count)  # fmt: skip

    @classmethod
    def from_torch(cls, bn: nn.Module):
        """A module of this class holding a copy of ``bn``'s parameters and buffers (num_batches_tracked included),
        on its device, in its dtype, in its training mode, with the same requires_grad flags."""
        if not isinstance(bn, cls._torch_class):
            raise TypeError(
                f"{cls.__name__}.from_torch: expected an nn.{cls._torch_class.__name__}, got {type(bn).__name__}"
            )
        like = bn.weight if bn.weight is not None else bn.running_mean
        where = {} if like is None else {"device": like.device, "dtype": like.dtype}
        module = cls(bn.num_features, bn.eps, bn.momentum, bn.affine, bn.track_running_stats, **where)
        module.load_state_dict(bn.state_dict())
        for name in ("weight", "bias"):
            if getattr(bn, name) is not None:
                getattr(module, name).requires_grad_(getattr(bn, name).requires_grad)
        return module.train(bn.training)


class BatchNorm2d(_TorchextBatchNorm, nn.BatchNorm2d):
    """torch.nn.BatchNorm2d computed by torchext's batch_norm: same constructor arguments, parameters, buffers
    (running_mean, running_var, num_batches_tracked) and state_dict keys, and the same training / eval behaviour
    (momentum=None is the cumulative average over num_batches_tracked; track_running_stats=False normalizes with the
    batch's statistics in eval too). A stock layer converts with ``BatchNorm2d.from_torch(bn)``."""

    _torch_class = nn.BatchNorm2d


class BatchNorm1d(_TorchextBatchNorm, nn.BatchNorm1d):
    """torch.nn.BatchNorm1d computed by torchext's batch_norm, on (N, C) or (N, C, L) input, as BatchNorm2d is
    nn.BatchNorm2d's (the same arguments, parameters, buffers, state_dict keys and behaviour). (N, C) runs the kernels'
    channels-last path (N rows of C channels), (N, C, L) their NCHW path. ``BatchNorm1d.from_torch(bn)`` converts a
    stock layer."""

    _torch_class = nn.BatchNorm1d


class BatchNormReLU2d(BatchNorm2d):
    """relu(BatchNorm2d(x)) in one pass (torchext's batch_norm_relu; the backward reads a 1-bit mask, not the
    output). Parameters, buffers and state_dict keys are nn.BatchNorm2d's: ``BatchNormReLU2d.from_torch(bn)`` takes a
    stock layer's."""

    def forward(self, input: Tensor, sum: Optional[Tensor] = None, sum_sq: Optional[Tensor] = None) -> Tensor:
        self._check_input_dim(input)
        training, momentum, running_mean, running_var, count = self._batch_norm_args()
        s, ss = _sums_if_used(self, training, sum, sum_sq)
        return F.batch_norm_relu(input, running_mean, running_var, self.weight, self.bias, training, momentum,
                                 self.eps, sum=s, sum_sq=ss, num_batches_tracked=count)  # fmt: skip


class BatchNormAddReLU2d(BatchNorm2d):
    """relu(BatchNorm2d(x) + residual) in one pass, a residual block's tail: ``forward(x, residual)``, residual shaped
    like x. The backward returns the residual's gradient from the same pass. Parameters, buffers and state_dict keys
    are nn.BatchNorm2d's: ``BatchNormAddReLU2d.from_torch(bn)`` takes a stock layer's."""

    def forward(
        self, input: Tensor, residual: Tensor, sum: Optional[Tensor] = None, sum_sq: Optional[Tensor] = None
    ) -> Tensor:
        self._check_input_dim(input)
        training, momentum, running_mean, running_var, count = self._batch_norm_args()
        s, ss = _sums_if_used(self, training, sum, sum_sq)
        return F.batch_norm_add_relu(input, residual, running_mean, running_var, self.weight, self.bias, training,
                                     momentum, self.eps, sum=s, sum_sq=ss, num_batches_tracked=count)  # fmt: skip


class Conv2dBatchNormReLU(nn.Sequential):
    """relu(bn(conv(x))) with the batch statistics taken from the convolution's epilogue: in training, torchext's
    conv2d_stats returns the output with its per-channel sum and sum of squares, and batch_norm_relu normalizes with
    them (no statistics pass over the output); in eval, conv2d then batch_norm_relu with the running statistics.

    A Sequential of (Conv2d, BatchNorm2d, ReLU), torchext's classes, with its own forward: its state_dict keys are
    those of ``nn.Sequential(nn.Conv2d(...), nn.BatchNorm2d(...), nn.ReLU())`` ('0.weight', '1.running_mean', ...),
    and ``.conv`` / ``.bn`` name the first two. Constructor: nn.Conv2d's arguments, then nn.BatchNorm2d's (eps,
    momentum, affine, track_running_stats) for its output channels. ``Conv2dBatchNormReLU.from_torch(conv, bn)`` copies
    a stock pair."""

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
        eps: float = 1e-5,
        momentum: Optional[float] = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        device=None,
        dtype=None,
    ) -> None:
        conv = Conv2d(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias, padding_mode,
                      device=device, dtype=dtype)  # fmt: skip
        bn = BatchNorm2d(out_channels, eps, momentum, affine, track_running_stats, device=device, dtype=dtype)
        super().__init__(conv, bn, ReLU())

    @property
    def conv(self) -> "Conv2d":
        return self[0]

    @property
    def bn(self) -> "BatchNorm2d":
        return self[1]

    def forward(self, input: Tensor) -> Tensor:
        conv, bn = self.conv, self.bn
        training, momentum, running_mean, running_var, count = bn._batch_norm_args()
        if not training:
            out = conv(input)
            return F.batch_norm_relu(out, running_mean, running_var, bn.weight, bn.bias, False, momentum, bn.eps,
                                     num_batches_tracked=count)  # fmt: skip
        x, padding = _conv2d_input_and_padding(conv, input)
        out, s, ss = ops.conv2d_stats(x, conv.weight, conv.bias, conv.stride, padding, conv.dilation, conv.groups)
        return F.batch_norm_relu(out, running_mean, running_var, bn.weight, bn.bias, True, momentum, bn.eps, sum=s,
                                 sum_sq=ss, num_batches_tracked=count)  # fmt: skip

    @classmethod
    def from_torch(cls, conv: nn.Conv2d, bn: nn.BatchNorm2d) -> "Conv2dBatchNormReLU":
        """The fused module holding copies of a stock (or torchext) Conv2d's and BatchNorm2d's parameters and buffers,
        in the Conv2d's training mode; ``bn`` must normalize the convolution's output channels."""
        if not isinstance(conv, nn.Conv2d):
            raise TypeError(f"Conv2dBatchNormReLU.from_torch: `conv` must be an nn.Conv2d, got {type(conv).__name__}")
        if not isinstance(bn, nn.BatchNorm2d):
            raise TypeError(f"Conv2dBatchNormReLU.from_torch: `bn` must be an nn.BatchNorm2d, got {type(bn).__name__}")
        if bn.num_features != conv.out_channels:
            raise ValueError(
                f"Conv2dBatchNormReLU.from_torch: `bn` has {bn.num_features} features, `conv` {conv.out_channels} "
                "output channels"
            )
        module = cls.__new__(cls)
        nn.Sequential.__init__(module, Conv2d.from_torch(conv), BatchNorm2d.from_torch(bn), ReLU())
        return module.train(conv.training)


def _conv2d_input_and_padding(conv: nn.Conv2d, input: Tensor) -> tuple:
    """(input, numeric padding) for torchext's conv ops, as torchext.nn.Conv2d pads: a padding_mode other than
    'zeros' pads the input with F.pad first; 'valid' is 0; 'same' pads as torch does."""
    if conv.padding_mode != "zeros":
        mode = conv.padding_mode
        return torch.nn.functional.pad(input, conv._reversed_padding_repeated_twice, mode=mode), 0
    if conv.padding == "valid":
        return input, 0
    if conv.padding == "same":
        return _conv2d_same_padding(input, conv.weight, conv.stride, conv.dilation)
    return input, conv.padding


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
