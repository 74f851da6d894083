"""torch.nn-compatible modules backed by torchext's ops.

Each class subclasses the torch.nn module it replaces and only changes ``forward``, so constructor arguments,
buffers (a loss's ``weight``, ``pos_weight``), ``state_dict`` keys, ``repr`` and ``isinstance`` checks are
torch.nn's own: a swapped model loads a stock checkpoint and the other way round.
"""

from torch import Tensor, nn

from . import functional as F

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
