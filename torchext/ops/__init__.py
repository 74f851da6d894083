"""Typed wrappers over torch.ops.torchext.*, one module per op family. Importing this package registers every op's
fake kernel and the autograd and autocast rules written in Python (the rest are C++: csrc/autograd.cpp)."""

from .activations import add, fork, gelu, leaky_relu, relu, sigmoid, silu, tanh
from .batch_norm import batch_norm, batch_norm_add_relu, batch_norm_relu
from .conv2d import conv2d, conv2d_stats
from .cross_entropy import check_targets, cross_entropy
from .losses import binary_cross_entropy_with_logits, mse_loss, multi_margin_loss
from .matmul import linear, matmul, matmul_kernel
from .optim import sgd_
from .pooling import adaptive_avg_pool2d, avg_pool2d, max_pool2d
from .softmax import log_softmax, softmax

__all__ = [
    "relu",
    "leaky_relu",
    "sigmoid",
    "tanh",
    "gelu",
    "silu",
    "add",
    "fork",
    "softmax",
    "log_softmax",
    "cross_entropy",
    "check_targets",
    "mse_loss",
    "binary_cross_entropy_with_logits",
    "multi_margin_loss",
    "matmul",
    "matmul_kernel",
    "linear",
    "conv2d",
    "conv2d_stats",
    "batch_norm",
    "batch_norm_relu",
    "batch_norm_add_relu",
    "max_pool2d",
    "avg_pool2d",
    "adaptive_avg_pool2d",
    "sgd_",
]
