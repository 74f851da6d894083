"""Bad inputs as a table: (call, expected exception class, words its message must contain).

Every row is a call a user can make with a wrong type, dtype, device, shape, out-of-range target or dim, or an
invalid option; each must raise the named exception with a message that names the argument, never crash, hang or
return. The calls run in a child interpreter, so a crash (SIGSEGV, abort) fails the row instead of the test run: all
rows go to one child, which reports each outcome as a JSON line as it goes; if it dies, the row it was running is
re-run alone to confirm the crash and the rest go to a fresh child. CUDA rows are skipped without a GPU. On CUDA the
child runs with TORCHEXT_CHECK_TARGETS=sync, so a bad target raises at the call itself.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import HAS_CUDA, gpu

ROOT = Path(__file__).resolve().parents[1]

# Names every call can use. The tensors are small; "c" prefixes their CUDA copies (only defined with a GPU).
SETUP = textwrap.dedent(
    """
    import torch, torch.nn.functional as F
    import torchext, torchext.functional as TF
    ops = torchext.ops
    raw = torch.ops.torchext
    x, y = torch.randn(4, 5), torch.randn(4, 5)
    t = torch.tensor([0, 1, 2, 3])
    w5, w4 = torch.ones(5), torch.ones(4, 5)
    lin_w, lin_b = torch.randn(3, 5), torch.randn(3)
    img, cw = torch.randn(2, 4, 5, 7), torch.randn(6, 4, 3, 3)
    if torch.cuda.is_available():
        cx, cy, ct, cw5 = x.cuda(), y.cuda(), t.cuda(), w5.cuda()
    """
)

# (call, exception class name, words the message must contain); rows whose call mentions a CUDA name need a GPU.
CASES = [
    # --- activations: non-tensors, dtypes, options
    ("TF.relu(None)", "TypeError", ["`input`", "Tensor", "NoneType"]),
    ("TF.relu([1.0, 2.0])", "TypeError", ["`input`", "list"]),
    ("ops.relu(3)", "TypeError", ["`input`", "int"]),
    ("TF.leaky_relu(None)", "TypeError", ["`input`"]),
    ("TF.sigmoid('x')", "TypeError", ["`input`", "str"]),
    ("TF.tanh((1.0,))", "TypeError", ["`input`", "tuple"]),
    ("TF.gelu(None)", "TypeError", ["`input`"]),
    ("TF.silu(1.5)", "TypeError", ["`input`", "float"]),
    ("TF.relu(torch.arange(4))", "TypeError", ["`self`", "float32 or float64", "Long"]),
    ("TF.leaky_relu(torch.ones(3, dtype=torch.int32))", "TypeError", ["`self`", "Int"]),
    ("TF.sigmoid(torch.ones(3, dtype=torch.float16))", "TypeError", ["`self`", "CUDA"]),
    ("TF.tanh(torch.ones(3, dtype=torch.bfloat16))", "TypeError", ["`self`", "BFloat16"]),
    ("TF.gelu(torch.ones(3, dtype=torch.complex64))", "TypeError", ["`self`", "ComplexFloat"]),
    ("TF.silu(torch.ones(3, dtype=torch.bool))", "TypeError", ["`self`", "Bool"]),
    ("TF.gelu(x, approximate='fast')", "ValueError", ["`approximate`", "'none' or 'tanh'", "fast"]),
    ("TF.gelu(x, approximate=None)", "RuntimeError", ["approximate"]),
    ("TF.leaky_relu(x, negative_slope='a')", "RuntimeError", ["negative_slope"]),
    ("raw.relu_backward(torch.ones(3), torch.ones(4))", "ValueError", ["`grad_output`", "shape"]),
    ("raw.sigmoid_backward(torch.ones(3, dtype=torch.float64), torch.ones(3))", "TypeError", ["`grad_output`"]),
    ("raw.gelu_backward(torch.ones(3), torch.ones(3), approximate='x')", "ValueError", ["`approximate`"]),
    # --- add: same shape, dtype and device (no broadcasting, no promotion)
    ("TF.add(None, x)", "TypeError", ["`input`", "NoneType"]),
    ("ops.add(x, 2.0)", "TypeError", ["`other`", "float"]),
    ("TF.add(x, y[:1])", "ValueError", ["`other`", "shape", "[4, 5]", "[1, 5]"]),
    ("TF.add(x, y.double())", "TypeError", ["`other`", "dtype", "Double"]),
    ("TF.add(torch.arange(4), torch.arange(4))", "TypeError", ["`self`", "bfloat16", "Long"]),
    ("raw.add(x, y.to('meta'))", "RuntimeError", ["`other`", "device", "meta"]),
    # --- softmax / log_softmax: dims, types
    ("TF.softmax([1, 2])", "TypeError", ["`input`", "list"]),
    ("TF.log_softmax(None, 0)", "TypeError", ["`input`", "NoneType"]),
    ("ops.softmax({})", "TypeError", ["`input`", "dict"]),
    ("ops.log_softmax(2)", "TypeError", ["`input`"]),
    ("TF.softmax(x, dim=2)", "IndexError", ["`dim`", "[-2, 1]", "2"]),
    ("TF.softmax(x, dim=-3)", "IndexError", ["`dim`", "-3"]),
    ("TF.log_softmax(x, dim=100)", "IndexError", ["`dim`", "100"]),
    ("TF.softmax(torch.tensor(1.0), dim=1)", "IndexError", ["`dim`", "[-1, 0]"]),
    ("TF.log_softmax(torch.tensor(1.0), dim=-2)", "IndexError", ["`dim`", "[-1, 0]"]),
    ("TF.softmax(torch.ones(0, 3), dim=2)", "IndexError", ["`dim`"]),
    ("TF.softmax(x, dim=1.5)", "TypeError", ["`dim`", "int", "float"]),
    ("TF.log_softmax(x, dim='a')", "TypeError", ["`dim`", "str"]),
    ("TF.softmax(torch.arange(6).reshape(2, 3), dim=1)", "TypeError", ["`self`", "Long"]),
    ("TF.log_softmax(x.half(), dim=1)", "TypeError", ["`self`", "Half"]),
    ("TF.softmax(x, dim=1, dtype=torch.int64)", "TypeError", ["`self`", "Long"]),
    ("raw.softmax_backward(torch.ones(2, 3), torch.ones(2, 4))", "ValueError", ["`grad_output`", "`output`"]),
    ("raw.log_softmax_backward(torch.ones(3, dtype=torch.float64), torch.ones(3))", "TypeError", ["`grad_output`"]),
    # --- cross_entropy
    ("TF.cross_entropy(None, t)", "TypeError", ["`input`"]),
    ("TF.cross_entropy(x, [0, 1, 2, 3])", "TypeError", ["`target`", "list"]),
    ("TF.cross_entropy(x, t, weight=[1.0] * 5)", "TypeError", ["`weight`", "Tensor or None"]),
    ("TF.cross_entropy(x, t.float())", "TypeError", ["`target`", "int64", "probability"]),
    ("TF.cross_entropy(x, t.int())", "TypeError", ["`target`", "int64"]),
    ("TF.cross_entropy(x, torch.tensor([0, 1, 5, 3]))", "IndexError", ["`target`", "5"]),
    ("TF.cross_entropy(x, torch.tensor([0, 1, -2, 3]))", "IndexError", ["`target`", "-2"]),
    ("TF.cross_entropy(x, t[:3])", "ValueError", ["`target`", "(4,)"]),
    ("TF.cross_entropy(x, t.reshape(2, 2))", "ValueError", ["`target`"]),
    ("TF.cross_entropy(torch.tensor(1.0), torch.tensor(0))", "ValueError", ["`input`", "at least one dimension"]),
    ("TF.cross_entropy(torch.randn(5), torch.tensor([0]))", "ValueError", ["`target`", "0-dim"]),
    ("TF.cross_entropy(torch.randn(2, 3, 4), torch.zeros(2, 3, dtype=torch.long))", "ValueError", ["`target`"]),
    ("TF.cross_entropy(torch.randn(4, 0), torch.zeros(4, dtype=torch.long))", "ValueError", ["`self`", "class"]),
    ("TF.cross_entropy(x, t, weight=torch.ones(4))", "ValueError", ["`weight`", "(5)"]),
    ("TF.cross_entropy(x, t, weight=torch.ones(1, 5))", "ValueError", ["`weight`", "1-D"]),
    ("TF.cross_entropy(x, t, weight=torch.ones(5, dtype=torch.float64))", "TypeError", ["`weight`", "dtype"]),
    ("TF.cross_entropy(x, t, label_smoothing=1.5)", "ValueError", ["`label_smoothing`", "[0, 1]"]),
    ("TF.cross_entropy(x, t, label_smoothing=-0.1)", "ValueError", ["`label_smoothing`"]),
    ("TF.cross_entropy(x, t, reduction='avg')", "ValueError", ["`reduction`", "avg"]),
    ("TF.cross_entropy(x.int(), t)", "TypeError", ["`self`", "Int"]),
    ("TF.cross_entropy(x.half(), t)", "TypeError", ["`self`", "Half"]),
    ("TF.cross_entropy(x, t, ignore_index='a')", "RuntimeError", ["ignore_index"]),
    (
        "TF.cross_entropy(x.requires_grad_(), t, weight=w5.clone().requires_grad_()).backward()",
        "NotImplementedError",
        ["`weight`"],
    ),
    (
        "raw.cross_entropy_backward(torch.ones(()), x, t, None, 'mean', -100, 0.0, torch.ones(3), torch.ones(()))",
        "ValueError",
        ["`lse`"],
    ),
    (
        "raw.cross_entropy_backward(torch.ones(3), x, t, None, 'none', -100, 0.0, torch.ones(4), torch.ones(()))",
        "ValueError",
        ["`grad_output`"],
    ),
    # --- mse_loss
    ("TF.mse_loss(x, [1, 2])", "TypeError", ["`target`", "list"]),
    ("TF.mse_loss(None, y)", "TypeError", ["`input`"]),
    ("TF.mse_loss(x, y, weight='w')", "TypeError", ["`weight`", "str"]),
    ("ops.mse_loss(x, 2.0)", "TypeError", ["`target`", "float"]),
    ("TF.mse_loss(x, torch.randn(4, 6))", "RuntimeError", ["`target`", "broadcast", "(4, 6)"]),
    ("TF.mse_loss(x, y.double())", "TypeError", ["`target`", "dtype"]),
    ("TF.mse_loss(x, y, weight=w5)", "ValueError", ["`weight`", "shape"]),
    ("TF.mse_loss(x, torch.randn(5), weight=w5)", "ValueError", ["`weight`", "(4, 5)"]),
    ("TF.mse_loss(x, y, weight=w4.double())", "TypeError", ["`weight`", "dtype"]),
    ("TF.mse_loss(x, y, reduction='avg')", "ValueError", ["`reduction`", "avg"]),
    ("TF.mse_loss(x, y, reduction=None)", "RuntimeError", ["reduction"]),
    ("TF.mse_loss(x.half(), y.half())", "TypeError", ["`self`", "Half"]),
    ("TF.mse_loss(torch.arange(3), torch.arange(3))", "TypeError", ["`self`", "Long"]),
    ("TF.mse_loss(x, y, weight=w4.clone().requires_grad_()).backward()", "NotImplementedError", ["`weight`"]),
    ("raw.mse_loss_backward(torch.ones(4, 5), x, y, None, 'mean')", "ValueError", ["`grad_output`", "0-dim"]),
    ("raw.mse_loss_backward(torch.ones(3), x, y, None, 'none')", "ValueError", ["`grad_output`"]),
    # --- binary_cross_entropy_with_logits
    ("TF.binary_cross_entropy_with_logits(None, y)", "TypeError", ["`input`"]),
    ("TF.binary_cross_entropy_with_logits(x, None)", "TypeError", ["`target`"]),
    ("TF.binary_cross_entropy_with_logits(x, y, [1.0])", "TypeError", ["`weight`", "list"]),
    ("TF.binary_cross_entropy_with_logits(x, y, pos_weight='a')", "TypeError", ["`pos_weight`", "str"]),
    ("TF.binary_cross_entropy_with_logits(x, torch.rand(5))", "ValueError", ["`target`", "shape"]),
    ("TF.binary_cross_entropy_with_logits(x, y.double())", "TypeError", ["`target`", "dtype"]),
    ("TF.binary_cross_entropy_with_logits(x, y, torch.ones(3))", "ValueError", ["`weight`", "broadcast"]),
    ("TF.binary_cross_entropy_with_logits(x, y, pos_weight=torch.ones(4))", "ValueError", ["`pos_weight`"]),
    ("TF.binary_cross_entropy_with_logits(x, y, w5.double())", "TypeError", ["`weight`", "dtype"]),
    ("TF.binary_cross_entropy_with_logits(x, y, pos_weight=torch.ones(2, 4, 5))", "ValueError", ["`pos_weight`"]),
    ("TF.binary_cross_entropy_with_logits(x, y, reduction='x')", "ValueError", ["`reduction`"]),
    ("TF.binary_cross_entropy_with_logits(x.int(), y.int())", "TypeError", ["`self`", "Int"]),
    (
        "TF.binary_cross_entropy_with_logits(x, y, w5.clone().requires_grad_()).backward()",
        "NotImplementedError",
        ["`weight`"],
    ),
    (
        "TF.binary_cross_entropy_with_logits(x, y, pos_weight=w5.clone().requires_grad_()).backward()",
        "NotImplementedError",
        ["`pos_weight`"],
    ),
    (
        "raw.binary_cross_entropy_with_logits_backward(torch.ones(5), x, y, None, None, 'none', False)",
        "ValueError",
        ["`grad_output`"],
    ),
    # --- multi_margin_loss
    ("TF.multi_margin_loss(None, t)", "TypeError", ["`input`"]),
    ("TF.multi_margin_loss(x, [0])", "TypeError", ["`target`", "list"]),
    ("TF.multi_margin_loss(x, t, weight=[1.0])", "TypeError", ["`weight`"]),
    ("TF.multi_margin_loss(x, t.float())", "TypeError", ["`target`", "int64"]),
    ("TF.multi_margin_loss(x, t.int())", "TypeError", ["`target`", "int64"]),
    ("TF.multi_margin_loss(x, torch.tensor([0, 1, 5, 3]))", "IndexError", ["`target`", "row 2", "[0, 5)"]),
    ("TF.multi_margin_loss(x, torch.tensor([-1, 1, 2, 3]))", "IndexError", ["`target`", "row 0", "-1"]),
    ("TF.multi_margin_loss(x, torch.tensor([0, 1]))", "ValueError", ["`target`", "one class index per row"]),
    ("TF.multi_margin_loss(x, t, weight=torch.ones(4))", "ValueError", ["`weight`", "(5)"]),
    ("TF.multi_margin_loss(x, t, weight=w5.double())", "TypeError", ["`weight`", "dtype"]),
    ("TF.multi_margin_loss(x, t, p=3)", "ValueError", ["`p`", "1 or 2", "3"]),
    ("TF.multi_margin_loss(x, t, p=0)", "ValueError", ["`p`"]),
    ("TF.multi_margin_loss(x, t, p=1.5)", "RuntimeError", ["p"]),
    ("TF.multi_margin_loss(x, t, margin='a')", "RuntimeError", ["margin"]),
    ("TF.multi_margin_loss(torch.randn(2, 3, 4), t[:2])", "ValueError", ["`self`", "(N, C)"]),
    ("TF.multi_margin_loss(torch.randn(4, 0), t)", "ValueError", ["`self`", "C > 0"]),
    ("TF.multi_margin_loss(x, t, reduction='bad')", "ValueError", ["`reduction`"]),
    ("TF.multi_margin_loss(x.half(), t)", "TypeError", ["`self`", "Half"]),
    ("TF.multi_margin_loss(x, t, weight=w5.clone().requires_grad_()).backward()", "NotImplementedError", ["`weight`"]),
    # --- matmul
    ("TF.matmul(x, None)", "TypeError", ["`other`", "NoneType"]),
    ("TF.matmul([[1.0]], x)", "TypeError", ["`input`", "list"]),
    ("ops.matmul(x, 1)", "TypeError", ["`b`", "int"]),
    ("ops.matmul_kernel(x, None)", "TypeError", ["`b`"]),
    ("TF.matmul(x, torch.randn(4, 3))", "ValueError", ["`b`", "5"]),
    ("TF.matmul(torch.randn(5), x)", "ValueError", ["`a`", "at least 2 dimensions"]),
    ("TF.matmul(x, torch.randn(5))", "ValueError", ["`b`", "at least 2 dimensions"]),
    ("TF.matmul(torch.randn(2, 3, 4), torch.randn(3, 4, 5))", "ValueError", ["batch", "`a`", "`b`"]),
    ("TF.matmul(x, y.T.double())", "TypeError", ["`b`", "dtype"]),
    ("TF.matmul(torch.ones(2, 2, dtype=torch.long), torch.ones(2, 2, dtype=torch.long))", "TypeError", ["`a`"]),
    ("TF.matmul(x.half(), y.T.half())", "TypeError", ["`a`", "Half"]),
    # --- linear
    ("TF.linear(None, lin_w)", "TypeError", ["`input`"]),
    ("TF.linear(x, None)", "TypeError", ["`weight`", "NoneType"]),
    ("TF.linear(x, lin_w, [0.0, 0.0, 0.0])", "TypeError", ["`bias`", "Tensor or None", "list"]),
    ("TF.linear(x, torch.randn(3, 4))", "ValueError", ["`weight`"]),
    ("TF.linear(x, lin_w, torch.randn(4))", "ValueError", ["`bias`"]),
    ("TF.linear(x, lin_w, torch.randn(1, 3))", "ValueError", ["`bias`"]),
    ("TF.linear(x, lin_w, activation='tanh')", "ValueError", ["activation", "tanh"]),
    ("TF.linear(x, lin_w.double())", "TypeError", ["`weight`", "dtype"]),
    ("TF.linear(x, lin_w, lin_b.double())", "TypeError", ["`bias`", "dtype"]),
    ("TF.linear(torch.tensor(1.0), lin_w)", "ValueError", ["`input`"]),
    ("TF.linear(x.int(), lin_w.int())", "TypeError", ["`input`", "Int"]),
    # --- conv2d
    ("TF.conv2d(None, cw)", "TypeError", ["`input`", "NoneType"]),
    ("TF.conv2d(img, [1.0])", "TypeError", ["`weight`", "list"]),
    ("ops.conv2d(img, cw, 1.0)", "TypeError", ["`bias`", "float"]),
    ("ops.conv2d(img[0], cw)", "ValueError", ["`input`", "4-D", "unsqueeze"]),
    ("TF.conv2d(img[None], cw)", "ValueError", ["`input`", "4-D"]),
    ("TF.conv2d(img, cw[0])", "ValueError", ["`weight`", "4-D"]),
    ("TF.conv2d(img, torch.randn(6, 3, 3, 3))", "ValueError", ["`weight`", "4 input channels", "3"]),
    ("TF.conv2d(img, cw, groups=3)", "ValueError", ["`groups`", "divisible"]),
    ("TF.conv2d(img, torch.randn(5, 2, 3, 3), groups=2)", "ValueError", ["5 output channels", "`groups`"]),
    ("TF.conv2d(img, cw, groups=0)", "ValueError", ["`groups`", "at least 1"]),
    ("TF.conv2d(img, cw, padding=-1)", "ValueError", ["`padding`", "non-negative"]),
    ("TF.conv2d(img, cw, stride=0)", "ValueError", ["`stride`", "at least 1"]),
    ("TF.conv2d(img, cw, stride=(1, 2, 3))", "TypeError", ["`stride`"]),
    ("TF.conv2d(img, cw, dilation=0)", "ValueError", ["`dilation`", "at least 1"]),
    ("TF.conv2d(img, torch.randn(6, 4, 7, 7))", "ValueError", ["height", "output would be empty"]),
    ("TF.conv2d(img, cw, padding='full')", "ValueError", ["`padding`", "same"]),
    ("TF.conv2d(img, cw, padding='same', stride=2)", "ValueError", ["'same'", "strided"]),
    ("TF.conv2d(img, cw, torch.randn(5))", "ValueError", ["`bias`", "(6,)"]),
    ("TF.conv2d(img, cw.double())", "TypeError", ["`weight`", "dtype"]),
    ("TF.conv2d(img, cw, torch.randn(6).double())", "TypeError", ["`bias`", "dtype"]),
    ("TF.conv2d(img.half(), cw.half())", "TypeError", ["`input`", "Half"]),
    ("TF.conv2d(img.long(), cw.long())", "TypeError", ["`input`", "Long"]),
    ("TF.conv2d(img, cw, activation='gelu')", "ValueError", ["activation", "gelu"]),
    ("raw.conv2d(img, cw, None, [1, 1], [0, 0], [1, 1], 1, 'silu', None)", "ValueError", ["`activation`", "silu"]),
    ("TF.conv2d(img, cw, kernel='fastest')", "ValueError", ["unknown variant", "fastest", "implicit_mma"]),
    ("TF.conv2d(img, cw, kernel='direct')", "ValueError", ["'direct'", "CUDA tensors"]),
    (
        "raw.conv2d_backward(torch.randn(2, 6, 3, 4), img, cw, [1, 1], [0, 0], [1, 1], 1, [True, True, True])",
        "ValueError",
        ["`grad_output`", "shape"],
    ),
    (
        "raw.conv2d_backward(torch.randn(2, 6, 3, 5).double(), img, cw, [1, 1], [0, 0], [1, 1], 1, [True] * 3)",
        "TypeError",
        ["`grad_output`", "dtype"],
    ),
    (
        "raw.conv2d_backward(torch.randn(2, 6, 3, 5), img, cw, [1, 1], [0, 0], [1, 1], 1, [True] * 3, None, "
        "torch.float64)",
        "TypeError",
        ["`grad_weight_dtype`", "Double"],
    ),
    # --- batch_norm, batch_norm_relu, batch_norm_add_relu, batch_norm_backward
    ("TF.batch_norm(None, None, None, training=True)", "TypeError", ["`input`", "NoneType"]),
    ("TF.batch_norm(img, [0.0] * 4, None)", "TypeError", ["`running_mean`", "list"]),
    ("TF.batch_norm(torch.ones(4), None, None, training=True)", "ValueError", ["`input`", "at least 2 dimensions"]),
    ("TF.batch_norm(img.long(), None, None, training=True)", "TypeError", ["`input`", "Long"]),
    ("TF.batch_norm(img, None, None, torch.ones(3), training=True)", "ValueError", ["`weight`", "(4,)"]),
    ("TF.batch_norm(img, None, None)", "ValueError", ["`running_mean`", "training=False"]),
    ("TF.batch_norm(img, None, None, torch.ones(4).double(), training=True)", "TypeError", ["`weight`", "dtype"]),
    (
        "TF.batch_norm(img.half(), None, None, torch.ones(4).double(), training=True)",
        "TypeError",
        ["`weight`", "float32"],
    ),
    (
        "TF.batch_norm(img, torch.zeros(4), torch.ones(4).double(), training=True)",
        "TypeError",
        ["`running_var`", "`running_mean`"],
    ),
    ("TF.batch_norm(img, None, None, training=True, sum=torch.ones(4))", "ValueError", ["`sum`", "`sum_sq`"]),
    (
        "TF.batch_norm(img, torch.zeros(4), torch.ones(4), sum=torch.ones(4), sum_sq=torch.ones(4))",
        "ValueError",
        ["`sum`", "training=True"],
    ),
    (
        "TF.batch_norm(img.double(), None, None, training=True, sum=torch.ones(4), sum_sq=torch.ones(4))",
        "TypeError",
        ["`sum`", "Double"],
    ),
    (
        "TF.batch_norm(img, None, None, training=True, kernel='fast')",
        "ValueError",
        ["unknown variant", "fast", "vectorized"],
    ),
    (
        "TF.batch_norm(img, None, None, training=True, kernel='vectorized')",
        "ValueError",
        ["'vectorized'", "CUDA tensors"],
    ),
    (
        "TF.batch_norm_relu(img[:1, :, :1, :1], None, None, training=True)",
        "ValueError",
        ["more than 1 value per channel"],
    ),
    (
        "TF.batch_norm(img, torch.zeros(4), torch.ones(4), num_batches_tracked=torch.tensor(0))",
        "ValueError",
        ["`num_batches_tracked`", "training=True"],
    ),
    (
        "TF.batch_norm(img, None, None, training=True, num_batches_tracked=torch.tensor(0.0))",
        "TypeError",
        ["`num_batches_tracked`", "int64"],
    ),
    (
        "TF.batch_norm_relu(img, None, None, training=True, num_batches_tracked=torch.zeros(2, dtype=torch.long))",
        "ValueError",
        ["`num_batches_tracked`", "one value"],
    ),
    ("TF.batch_norm(img, None, None, training=True, num_batches_tracked=1)", "TypeError", ["`num_batches_tracked`"]),
    ("TF.batch_norm_add_relu(img, None, None, None, training=True)", "TypeError", ["`residual`", "NoneType"]),
    ("TF.fork(img, 0)", "ValueError", ["`n`", "positive int"]),
    ("TF.fork(img.requires_grad_(), 2.0)", "ValueError", ["`n`", "positive int"]),
    ("ops.fork(None, 2)", "TypeError", ["`input`", "NoneType"]),
    ("raw.fork(img, 0)", "ValueError", ["`n`", "at least 1"]),
    ("TF.batch_norm_add_relu(img, img[:1], None, None, training=True)", "ValueError", ["`residual`", "shape"]),
    ("TF.batch_norm_add_relu(img, img.double(), None, None, training=True)", "TypeError", ["`residual`", "dtype"]),
    (
        "raw.batch_norm_backward(img[:1], img, None, torch.zeros(4), torch.ones(4), None, True, 1e-5, "
        "[True] * 3 + [False])",
        "ValueError",
        ["`grad_out`", "shape"],
    ),
    (
        "raw.batch_norm_backward(img, img, None, torch.zeros(4).double(), torch.ones(4), None, True, 1e-5, "
        "[True] * 3 + [False])",
        "TypeError",
        ["`save_mean`", "Float"],
    ),
    (
        "raw.batch_norm_backward(img, img, None, torch.zeros(4), torch.ones(4), torch.zeros(3, "
        "dtype=torch.uint8), True, 1e-5, [True] * 4)",
        "ValueError",
        ["`mask`", "(35,)"],
    ),
    (
        "raw.batch_norm_backward(img, img, None, torch.zeros(4), torch.ones(4), torch.zeros(35), True, 1e-5, "
        "[True] * 4)",
        "TypeError",
        ["`mask`", "uint8"],
    ),
    (
        "raw.batch_norm_backward(img, img, None, torch.zeros(4), torch.ones(4), None, True, 1e-5, [True] * 4)",
        "ValueError",
        ["output_mask[3]", "`mask`"],
    ),
    # --- CUDA: devices and targets (skipped without a GPU)
    ("TF.mse_loss(cx, y)", "RuntimeError", ["`target`", "device"]),
    ("TF.mse_loss(cx, cy, weight=w4)", "RuntimeError", ["`weight`", "device"]),
    ("TF.binary_cross_entropy_with_logits(cx, cy, w5)", "RuntimeError", ["`weight`", "device"]),
    ("TF.binary_cross_entropy_with_logits(cx, cy, pos_weight=w5)", "RuntimeError", ["`pos_weight`", "device"]),
    ("TF.cross_entropy(cx, t)", "RuntimeError", ["`target`", "device"]),
    ("TF.cross_entropy(cx, ct, weight=w5)", "RuntimeError", ["`weight`", "device"]),
    ("TF.cross_entropy(cx, torch.tensor([0, 1, 5, 3], device='cuda'))", "IndexError", ["`target`"]),
    ("TF.multi_margin_loss(cx, t)", "RuntimeError", ["`target`", "device"]),
    ("TF.multi_margin_loss(cx, torch.tensor([0, 1, 7, 3], device='cuda'))", "IndexError", ["`target`"]),
    ("TF.matmul(cx, y.T)", "RuntimeError", ["`b`", "device"]),
    ("TF.linear(cx, lin_w)", "RuntimeError", ["`weight`", "device"]),
    ("TF.linear(cx, lin_w.cuda(), lin_b)", "RuntimeError", ["`bias`", "device"]),
    ("TF.conv2d(img.cuda(), cw)", "RuntimeError", ["`weight`", "device"]),
    ("TF.conv2d(img.cuda(), cw.cuda(), torch.randn(6))", "RuntimeError", ["`bias`", "device"]),
    ("raw.softmax_backward(torch.ones(3), torch.ones(3, device='cuda'))", "RuntimeError", ["`grad_output`", "device"]),
    ("raw.relu_backward(torch.ones(3, device='cuda'), torch.ones(3))", "RuntimeError", ["`output`", "device"]),
    ("TF.add(cx, y)", "RuntimeError", ["`other`", "device", "cuda:0"]),
    ("TF.add(x, cy)", "RuntimeError", ["`other`", "device", "cpu"]),
    ("TF.relu(torch.arange(3, device='cuda'))", "TypeError", ["`self`", "float16"]),
    (
        "TF.batch_norm(img.cuda(), torch.zeros(4), torch.ones(4), training=True)",
        "RuntimeError",
        ["`running_mean`", "device"],
    ),
    ("TF.batch_norm(img.cuda(), None, None, training=True, kernel='cpu')", "ValueError", ["'cpu'", "CPU tensors"]),
    ("TF.batch_norm_add_relu(img.cuda(), img, None, None, training=True)", "RuntimeError", ["`residual`", "device"]),
    ("TF.softmax(cx, dim=2)", "IndexError", ["`dim`"]),
    ("TF.cross_entropy(cx.to(torch.int32), ct)", "TypeError", ["`self`"]),
    # --- pooling (the CUDA rows skip without a GPU)
    ("TF.max_pool2d(None, 2)", "TypeError", ["`input`", "NoneType"]),
    ("TF.max_pool2d(img, 0)", "ValueError", ["`kernel_size`", "at least 1"]),
    ("TF.max_pool2d(img, 3, stride=0)", "ValueError", ["`stride`", "at least 1"]),
    ("TF.max_pool2d(img, 3, padding=2)", "ValueError", ["`padding`", "half of `kernel_size`"]),
    ("TF.max_pool2d(img, 3, padding=-1)", "ValueError", ["`padding`", "non-negative"]),
    ("TF.max_pool2d(img, 3, dilation=0)", "ValueError", ["`dilation`", "at least 1"]),
    ("TF.max_pool2d(img, 3, dilation=3)", "ValueError", ["output would be empty", "5 x 7"]),
    ("TF.max_pool2d(img, (2, 2, 2))", "TypeError", ["`kernel_size`", "pair"]),
    ("TF.max_pool2d(img, 2, stride='a')", "TypeError", ["`stride`"]),
    ("TF.max_pool2d(img[0, 0], 2)", "ValueError", ["`input`", "4-D", "3-D"]),
    ("TF.max_pool2d(img[:, :0], 2)", "ValueError", ["`input`", "non-empty channels"]),
    ("TF.max_pool2d(img[:, :, :0], 2)", "ValueError", ["`input`", "non-empty"]),
    ("TF.max_pool2d(img.long(), 2)", "TypeError", ["`input`", "Long"]),
    ("TF.avg_pool2d(img.to(torch.complex64), 2)", "TypeError", ["`input`", "ComplexFloat"]),
    ("TF.avg_pool2d(img, 2, divisor_override=0)", "ValueError", ["`divisor_override`", "0"]),
    ("TF.avg_pool2d(img, 2, divisor_override=1.5)", "TypeError", ["`divisor_override`"]),
    ("TF.avg_pool2d(img, 3, 1, 2)", "ValueError", ["`padding`", "half"]),
    ("TF.adaptive_avg_pool2d(img, -1)", "ValueError", ["`output_size`", "non-negative"]),
    ("TF.adaptive_avg_pool2d(img, 'a')", "TypeError", ["`output_size`"]),
    ("TF.adaptive_avg_pool2d(img, (1, 2, 3))", "TypeError", ["`output_size`"]),
    ("TF.adaptive_avg_pool2d(img[:, :, :, :0], 1)", "ValueError", ["`input`", "height and width"]),
    (
        "raw.max_pool2d_backward(torch.randn(2, 4, 3, 3), img, [2, 2], [2, 2], [0, 0], [1, 1], False, "
        "torch.zeros(2, 4, 2, 3, dtype=torch.long))",
        "ValueError",
        ["`grad_output`", "shape", "[2, 4, 2, 3]"],
    ),
    (
        "raw.max_pool2d_backward(torch.randn(2, 4, 2, 3), img, [2, 2], [2, 2], [0, 0], [1, 1], False, "
        "torch.zeros(2, 4, 2, 3, dtype=torch.int32))",
        "TypeError",
        ["`indices`", "int64"],
    ),
    (
        "raw.avg_pool2d_backward(torch.randn(2, 4, 2, 3).double(), img, [2, 2], [2, 2], [0, 0], False, True, None)",
        "TypeError",
        ["`grad_output`", "dtype"],
    ),
    ("raw.adaptive_avg_pool2d_backward(torch.randn(2, 3, 1, 1), img)", "ValueError", ["`grad_output`", "N and C"]),
    (
        "raw.max_pool2d_backward(torch.randn(2, 4, 2, 3, device='cuda'), img.cuda(), [2, 2], [2, 2], [0, 0], "
        "[1, 1], False, torch.zeros(2, 4, 2, 3, dtype=torch.long))",
        "RuntimeError",
        ["`indices`", "device"],
    ),
    (
        "raw.adaptive_avg_pool2d_backward(torch.randn(2, 4, 1, 1), img.cuda())",
        "RuntimeError",
        ["`grad_output`", "device"],
    ),
]

_CUDA_NAMES = ("cx", "cy", "ct", "cw5", "cuda")


def _needs_cuda(call: str) -> bool:
    return any(name in call for name in _CUDA_NAMES)


# The child: runs the calls given on stdin (a JSON list of [index, call]) and prints one JSON line per call.
CHILD = SETUP + textwrap.dedent(
    """
    import json, sys
    namespace = dict(globals())
    for index, call in json.loads(sys.stdin.read()):
        print(json.dumps({"index": index, "started": True}), flush=True)
        try:
            exec(call, dict(namespace))
            outcome = {"index": index, "exception": None, "message": ""}
        except BaseException as e:
            outcome = {"index": index, "exception": type(e).__name__, "message": str(e)}
        print(json.dumps(outcome), flush=True)
    """
)


def _run_child(cases):
    """Outcomes by index of the cases the child finished, and the index of the case it died in (or None)."""
    env = dict(os.environ, TORCHEXT_CHECK_TARGETS="sync", PYTHONWARNINGS="ignore")
    proc = subprocess.run(
        [sys.executable, "-c", CHILD],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=300,
    )
    outcomes, running = {}, None
    for line in proc.stdout.splitlines():
        record = json.loads(line)
        if record.get("started"):
            running = record["index"]
        else:
            outcomes[record["index"]] = record
            running = None
    if running is None and proc.returncode != 0:
        raise RuntimeError(f"bad-input child failed outside any case (exit {proc.returncode}): {proc.stderr[-2000:]}")
    if running is not None:
        outcomes[running] = {
            "index": running,
            "exception": f"<crashed: exit status {proc.returncode}>",
            "message": proc.stderr[-2000:],
        }
    return outcomes, running


@pytest.fixture(scope="module")
def outcomes():
    """Every runnable row's outcome: all rows in one child; after a crash, the crashing row is confirmed alone and
    the rows after it go to a fresh child."""
    pending = [[i, call] for i, (call, _, _) in enumerate(CASES) if HAS_CUDA or not _needs_cuda(call)]
    results = {}
    while pending:
        done, crashed = _run_child(pending)
        results.update(done)
        if crashed is None:
            break
        alone, _ = _run_child([[crashed, CASES[crashed][0]]])
        results[crashed] = alone[crashed]
        pending = [case for case in pending if case[0] not in results]
    return results


def _params():
    out = []
    for i, (call, exc, words) in enumerate(CASES):
        marks = [gpu] if _needs_cuda(call) else []
        out.append(pytest.param(i, call, exc, words, id=f"{i}-{call[:60]}", marks=marks))
    return out


def test_table_is_large_and_unique():
    calls = [call for call, _, _ in CASES]
    assert len(set(calls)) == len(calls), "[bad-input table] duplicate calls"
    assert len(calls) >= 100, f"[bad-input table] {len(calls)} rows, want at least 100"


@pytest.mark.parametrize("index,call,exception,words", _params())
def test_bad_input(outcomes, index, call, exception, words):
    outcome = outcomes[index]
    got = outcome["exception"]
    assert got == exception, f"[{call}] expected {exception}, got {got}: {outcome['message']}"
    missing = [word for word in words if word not in outcome["message"]]
    assert not missing, f"[{call}] message lacks {missing}: {outcome['message']}"
