"""Every torchext op under torch.compile with inductor and fullgraph=True, forward and backward: results and input
gradients equal eager torchext's and torch's, for contiguous and channels-last inputs (both layouts go through the
same compiled function, as separate inputs); the modules of torchext.nn in a small model swapped with
torchext.swap_modules; and no schema argument is named like one of inductor's own.

Inductor compiles C++ on the CPU, which is slow (tens of seconds a graph here): each group of ops is one compiled
function with one input per (op, layout), so the file compiles a handful of graphs. The CUDA variants skip without a
GPU."""

import inspect

import pytest
import torch
import torch.nn.functional as F
from conftest import device_params, make_tensor
from torch import nn

import torchext
import torchext.functional as tf
import torchext.nn as tnn

pytestmark = pytest.mark.slow

SHAPE = (2, 3, 4, 5)
TOL = {"cpu": {"rtol": 1e-5, "atol": 1e-5}, "cuda": {"rtol": 1e-4, "atol": 1e-4}}

# One-input ops: (name, torchext, torch). Each gets a contiguous and a channels-last input.
UNARY = (
    ("relu", tf.relu, F.relu),
    ("leaky_relu", lambda x: tf.leaky_relu(x, 0.2), lambda x: F.leaky_relu(x, 0.2)),
    ("sigmoid", tf.sigmoid, torch.sigmoid),
    ("tanh", tf.tanh, torch.tanh),
    ("gelu", tf.gelu, F.gelu),
    ("gelu_tanh", lambda x: tf.gelu(x, approximate="tanh"), lambda x: F.gelu(x, approximate="tanh")),
    ("silu", tf.silu, F.silu),
    ("softmax", lambda x: tf.softmax(x, dim=-1), lambda x: F.softmax(x, dim=-1)),
    ("log_softmax", lambda x: tf.log_softmax(x, dim=-1), lambda x: F.log_softmax(x, dim=-1)),
)
UNARY_LAYOUTS = ("contiguous", "channels_last")


def unary_group(lib):
    fns = [entry[1 if lib == "torchext" else 2] for entry in UNARY]

    def run(*xs):
        return tuple(fn(x) for fn, pair in zip(fns, zip(xs[::2], xs[1::2])) for x in pair)

    names = [f"{name} {layout}" for name, _, _ in UNARY for layout in UNARY_LAYOUTS]
    return (
        run,
        names,
        lambda device, dtype: [make_tensor(SHAPE, dtype, device, layout) for _ in UNARY for layout in UNARY_LAYOUTS],
    )


def add_group(lib):
    """add on contiguous and channels-last operands, and on one of each (the result takes self's layout)."""
    f = tf.add if lib == "torchext" else torch.add

    def run(a, b, a_cl, b_cl):
        return f(a, b), f(a_cl, b_cl), f(a_cl, b), f(a, b_cl)

    names = ["add", "add channels_last", "add channels_last + contiguous", "add contiguous + channels_last"]
    layouts = ("contiguous", "contiguous", "channels_last", "channels_last")
    return run, names, lambda device, dtype: [make_tensor(SHAPE, dtype, device, layout) for layout in layouts]


def losses_group(lib):
    """Each loss on 4-D inputs contiguous and channels-last (cross_entropy's 4-D path moves the classes last and
    flattens) and on 2-D ones contiguous and transposed."""
    f = tf if lib == "torchext" else F

    def run(x4, y4, x4_cl, y4_cl, x2, t2, x2_t, t2_t, t3, t3_cl, pos_weight):
        return (
            f.mse_loss(x4, y4),
            f.mse_loss(x4_cl, y4_cl, reduction="none"),
            f.binary_cross_entropy_with_logits(x4, y4.sigmoid(), pos_weight=pos_weight.detach()),  # no grad for it
            f.binary_cross_entropy_with_logits(x4_cl, y4_cl.sigmoid(), reduction="none"),
            f.multi_margin_loss(x2, t2),
            f.multi_margin_loss(x2_t, t2_t, p=2, reduction="none"),
            f.cross_entropy(x2, t2, label_smoothing=0.1),
            f.cross_entropy(x2_t, t2_t, reduction="none"),
            f.cross_entropy(x4, t3),
            f.cross_entropy(x4_cl, t3_cl, reduction="sum"),
        )

    names = ["mse_loss", "mse_loss channels_last", "bce_with_logits", "bce_with_logits channels_last",
             "multi_margin_loss", "multi_margin_loss transposed", "cross_entropy", "cross_entropy transposed",
             "cross_entropy 4-D", "cross_entropy 4-D channels_last"]  # fmt: skip

    def inputs(device, dtype):
        def x(shape, layout="contiguous"):
            return make_tensor(shape, dtype, device, layout)

        def t(shape, classes):
            return torch.randint(0, classes, shape, device=device)

        return [
            x(SHAPE), x(SHAPE), x(SHAPE, "channels_last"), x(SHAPE, "channels_last"),
            x((6, 5)), t((6,), 5), x((6, 5), "transposed"), t((6,), 5),
            t((2, 4, 5), 3), t((2, 4, 5), 3), make_tensor((5,), dtype, device, low=0.5, high=2.0),
        ]  # fmt: skip

    return run, names, inputs


def _torch_linear(x, w, b=None, activation=None):
    y = F.linear(x, w, b)
    if activation == "gelu_tanh":
        return F.gelu(y, approximate="tanh")
    return {None: y, "relu": F.relu(y), "gelu": F.gelu(y), "silu": F.silu(y)}[activation]


def products_group(lib):
    matmul = torchext.matmul if lib == "torchext" else torch.matmul
    linear = tf.linear if lib == "torchext" else _torch_linear

    def run(a, a_cl, b, bb, w, bias):
        return (
            matmul(a, b) * 2,
            matmul(a_cl, b),
            matmul(a, bb),
            linear(a, w, bias),
            linear(a_cl, w, bias, "gelu"),
            linear(a_cl, w, None, "relu"),
            linear(a, w, bias, "silu"),
            linear(a, w, bias, "gelu_tanh"),
        )

    names = ["matmul * 2", "matmul channels_last", "matmul batched transposed", "linear", "linear gelu channels_last",
             "linear relu no bias channels_last", "linear silu", "linear gelu_tanh"]  # fmt: skip

    def inputs(device, dtype):
        return [
            make_tensor(SHAPE, dtype, device), make_tensor(SHAPE, dtype, device, "channels_last"),
            make_tensor((5, 6), dtype, device), make_tensor((3, 5, 6), dtype, device, "transposed"),
            make_tensor((7, 5), dtype, device), make_tensor((7,), dtype, device),
        ]  # fmt: skip

    return run, names, inputs


def _torch_conv2d_stats(x, w, b, **opts):
    out = F.conv2d(x, w, b, **opts)
    return out, out.sum((0, 2, 3)), (out * out).sum((0, 2, 3))


def conv_group(lib):
    """conv2d (bias + relu, groups and stride, 'same' padding) and conv2d_stats on contiguous and channels-last
    inputs."""
    conv = tf.conv2d if lib == "torchext" else lambda *a, activation=None, **k: (
        F.conv2d(*a, **k).relu() if activation == "relu" else F.conv2d(*a, **k)
    )  # fmt: skip
    stats = torchext.ops.conv2d_stats if lib == "torchext" else _torch_conv2d_stats

    def run(x, x_cl, w, w_g, bias):
        out, s, ss = stats(x_cl * 0.25, w, bias, padding=1)  # smaller sums of squares: float32 tolerances hold
        return (
            conv(x, w, bias, padding=1, activation="relu"),
            conv(x_cl, w, None, stride=2, padding="valid" if lib == "torch" else 0),
            conv(x_cl, w_g, bias, padding="same", groups=3),
            out, s, ss,
        )  # fmt: skip

    names = ["conv2d relu", "conv2d stride 2 channels_last", "conv2d groups 3 same", "conv2d_stats out",
             "conv2d_stats sum", "conv2d_stats sum_sq"]  # fmt: skip

    def inputs(device, dtype):
        return [
            make_tensor((2, 3, 5, 7), dtype, device), make_tensor((2, 3, 5, 7), dtype, device, "channels_last"),
            make_tensor((6, 3, 3, 3), dtype, device), make_tensor((6, 1, 3, 2), dtype, device),
            make_tensor((6,), dtype, device),
        ]  # fmt: skip

    return run, names, inputs


def _torch_batch_norm_relu(x, rm, rv, w, b, training, residual=None):
    y = F.batch_norm(x, rm, rv, w, b, training)
    return (y if residual is None else y + residual).relu()


def norm_group(lib):
    """batch_norm, batch_norm_relu and batch_norm_add_relu in training (no running buffers: they are inputs of no
    gradient here; the modules' test below checks their updates) and batch_norm_relu in eval, contiguous and
    channels-last."""
    if lib == "torchext":
        bn, bn_relu = tf.batch_norm, tf.batch_norm_relu

        def bn_add_relu(x, r, *a):
            return tf.batch_norm_add_relu(x, r, *a)
    else:
        bn, bn_relu = F.batch_norm, _torch_batch_norm_relu

        def bn_add_relu(x, r, *a):
            return _torch_batch_norm_relu(x, *a, residual=r)

    def run(x, x_cl, r_cl, w, b):
        rm, rv = torch.full_like(w, 0.1), torch.full_like(w, 1.5)
        return (
            bn(x, None, None, w, b, True),
            bn_relu(x_cl, None, None, w, b, True),
            bn_add_relu(x_cl, r_cl, None, None, w, b, True),
            bn_relu(x, rm, rv, w, b, False),
        )

    names = ["batch_norm", "batch_norm_relu channels_last", "batch_norm_add_relu channels_last",
             "batch_norm_relu eval"]  # fmt: skip

    def inputs(device, dtype):
        return [
            make_tensor(SHAPE, dtype, device), make_tensor(SHAPE, dtype, device, "channels_last"),
            make_tensor(SHAPE, dtype, device, "channels_last"), make_tensor((3,), dtype, device, low=0.5, high=2.0),
            make_tensor((3,), dtype, device),
        ]  # fmt: skip

    return run, names, inputs


def pooling_group(lib):
    """max_pool2d (indices too), avg_pool2d and adaptive_avg_pool2d on contiguous, channels-last and unbatched
    inputs, with ceil_mode, padding, divisor_override and None in output_size."""
    f = tf if lib == "torchext" else F

    def run(x, x_cl, x3):
        out, indices = f.max_pool2d(x_cl, 3, 2, 1, return_indices=True)
        return (
            f.max_pool2d(x, 2, ceil_mode=True),
            out,
            indices.to(out.dtype),
            f.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False),
            f.avg_pool2d(x_cl, 2, divisor_override=3),
            f.adaptive_avg_pool2d(x_cl, 1),
            f.adaptive_avg_pool2d(x, (3, None)),
            f.max_pool2d(x3, (2, 3), 1, 1, dilation=(1, 2)),
        )

    names = ["max_pool2d ceil", "max_pool2d channels_last", "max_pool2d indices", "avg_pool2d exclude pad",
             "avg_pool2d divisor channels_last", "global avg channels_last", "adaptive (3, None)",
             "max_pool2d unbatched dilation"]  # fmt: skip

    def inputs(device, dtype):
        return [
            make_tensor((2, 3, 5, 7), dtype, device), make_tensor((2, 3, 5, 7), dtype, device, "channels_last"),
            make_tensor((3, 5, 7), dtype, device),
        ]  # fmt: skip

    return run, names, inputs


GROUPS = {
    "unary": unary_group,
    "add": add_group,
    "losses": losses_group,
    "products": products_group,
    "conv": conv_group,
    "norm": norm_group,
    "pooling": pooling_group,
}


def forward_backward(fn, inputs, grad_weights=None):
    """fn's outputs, and the gradients of sum(out_i * w_i) (w_i fixed random, contiguous) with respect to every
    floating input: one backward through every op's backward."""
    inputs = [i.detach().requires_grad_() if i.is_floating_point() else i for i in inputs]
    outs = fn(*inputs)
    if grad_weights is None:
        grad_weights = [torch.randn(o.shape, dtype=o.dtype, device=o.device) for o in outs]
    total = sum((o * w).sum() for o, w in zip(outs, grad_weights))
    # allow_unused: an input only a constant comes from (bce's pos_weight, detached) gets a zero gradient.
    grads = torch.autograd.grad(
        total, [i for i in inputs if i.requires_grad], allow_unused=True, materialize_grads=True
    )
    return [o.detach() for o in outs], list(grads), grad_weights


def assert_group_matches(ours, theirs, inputs, names, what, tol):
    """ours compiled (inductor, fullgraph) against ours eager and theirs (torch): outputs (values and strides) and
    every input's gradient."""
    out_c, grad_c, weights = forward_backward(torch.compile(ours, backend="inductor", fullgraph=True), inputs)
    out_e, grad_e, _ = forward_backward(ours, inputs, weights)
    out_t, grad_t, _ = forward_backward(theirs, inputs, weights)
    for name, c, e, t in zip(names, out_c, out_e, out_t, strict=True):
        torch.testing.assert_close(c, e, **tol, msg=lambda m, n=name: f"[{what} {n}: compiled vs eager] {m}")
        torch.testing.assert_close(c, t, **tol, msg=lambda m, n=name: f"[{what} {n}: compiled vs torch] {m}")
    for i, (c, e, t) in enumerate(zip(grad_c, grad_e, grad_t, strict=True)):
        torch.testing.assert_close(c, e, **tol, msg=lambda m, i=i: f"[{what} grad of input {i}: compiled vs eager] {m}")
        torch.testing.assert_close(c, t, **tol, msg=lambda m, i=i: f"[{what} grad of input {i}: compiled vs torch] {m}")


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("group", GROUPS)
def test_ops_compile_fullgraph(group, device, monkeypatch):
    # float32 at float32 accuracy: torch may run tf32 convolutions where cudnn.allow_tf32 is on (its default), and
    # torchext's conv2d then does too (implicit_mma), with errors far above TOL.
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    ours, names, make_inputs = GROUPS[group]("torchext")
    theirs, _, _ = GROUPS[group]("torch")
    torch._dynamo.reset()
    assert_group_matches(ours, theirs, make_inputs(device, torch.float32), names, group, TOL[device])


def test_reported_cases_compile():
    """The two reported failures, as written: relu's backward on a channels-last input (fake strides), and
    matmul * 2 under inductor (the schema's `kernel` argument)."""
    torch._dynamo.reset()
    x = torch.randn(2, 3, 4, 5).contiguous(memory_format=torch.channels_last).requires_grad_()
    torch.compile(lambda x: torchext.functional.relu(x).sum())(x).backward()
    torch.testing.assert_close(x.grad, (x > 0).to(x.dtype), msg="[relu channels-last compiled: x.grad]")
    a, b = torch.randn(4, 5), torch.randn(5, 3)
    out = torch.compile(lambda a, b: torchext.matmul(a, b) * 2, fullgraph=True)(a, b)
    torch.testing.assert_close(out, a @ b * 2, msg="[compiled matmul * 2]")


class SmallNet(nn.Module):
    """Stock layers of every kind torchext.nn swaps in (Conv2d, Linear, fused Linear + activation, each activation,
    softmax), with torchext's or torch's losses on top."""

    def __init__(self, lib: str):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1),
            nn.LeakyReLU(0.1), nn.GELU(), nn.SiLU(), nn.Tanh(), nn.Sigmoid(),
        )  # fmt: skip
        self.head = nn.Sequential(
            nn.Flatten(), nn.Linear(8 * 4 * 5, 16), nn.ReLU(), nn.Linear(16, 16), nn.GELU("tanh"), nn.Linear(16, 5)
        )
        self.softmax, self.log_softmax = nn.Softmax(-1), nn.LogSoftmax(-1)
        m = tnn if lib == "torchext" else nn
        self.ce, self.mse = m.CrossEntropyLoss(label_smoothing=0.1), m.MSELoss()
        self.bce, self.margin = m.BCEWithLogitsLoss(), m.MultiMarginLoss()

    def forward(self, x, t):
        logits = self.head(self.features(x))
        p = self.softmax(logits)
        return (
            self.ce(logits, t)
            + self.mse(p, torch.sigmoid(logits))
            + self.bce(logits, p.detach())
            + self.margin(logits, t)
            - self.log_softmax(logits).mean()
        )


def _assert_compiled_matches_stock(model, stock, inputs, device, loss=lambda out: out.square().mean()):
    """model compiled with inductor and fullgraph against the stock model, eager: the loss and every parameter's
    gradient (model's parameters in stock's order: a swap keeps them)."""
    compiled = torch.compile(model, backend="inductor", fullgraph=True)
    loss_c = loss(compiled(*inputs))
    grads_c = torch.autograd.grad(loss_c, list(model.parameters()))
    loss_s = loss(stock(*inputs))
    grads_s = torch.autograd.grad(loss_s, list(stock.parameters()))
    torch.testing.assert_close(loss_c, loss_s, **TOL[device], msg=lambda m: f"[loss: compiled torchext vs stock] {m}")
    for (n, _), c, s in zip(stock.named_parameters(), grads_c, grads_s, strict=True):
        torch.testing.assert_close(c, s, **TOL[device], msg=lambda m, n=n: f"[{n}.grad: compiled ours vs stock] {m}")


@pytest.mark.parametrize("device", device_params())
def test_swapped_model_compiles_fullgraph(device):
    """A stock model swapped to torchext (every torchext.nn module), channels-last, compiled with fullgraph: the
    loss and every parameter's gradient equal the stock model's, eager."""
    torch._dynamo.reset()
    stock = SmallNet("torch").to(device).to(memory_format=torch.channels_last)
    ours = SmallNet("torchext").to(device).to(memory_format=torch.channels_last)
    ours.load_state_dict(stock.state_dict())
    report = torchext.swap_modules(ours)
    swapped = {type(m) for m in ours.modules()}
    for cls in (
        tnn.Linear,
        tnn.Conv2d,
        tnn.LeakyReLU,
        tnn.GELU,
        tnn.SiLU,
        tnn.Tanh,
        tnn.Sigmoid,
        tnn.Softmax,
        tnn.LogSoftmax,
    ):
        assert cls in swapped, f"[swap report] {cls.__name__} missing after swap_modules:\n{report}"
    x = make_tensor((4, 3, 4, 5), torch.float32, device, "channels_last")
    t = torch.randint(0, 5, (4,), device=device)
    ours.train(), stock.train()
    _assert_compiled_matches_stock(ours, stock, (x, t), device, loss=lambda out: out)


@pytest.mark.parametrize("device", device_params())
def test_swapped_residual_model_with_forks_compiles_fullgraph(device, monkeypatch):
    """Residual blocks (identity and downsampling shortcuts), swapped and fused, so each block's input is forked
    (torchext.functional.fork: an autograd Function whose backward calls torchext's add), compiled with inductor and
    fullgraph: loss and every parameter's gradient equal the stock model's, eager."""
    # float32 at float32 accuracy, as test_ops_compile_fullgraph: with tf32 allowed (cuDNN's default) both sides run
    # the convolutions in tf32, and five of them put the stem's weight gradient 5e-3 apart (seen on an H100).
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    torch._dynamo.reset()

    def make():
        torch.manual_seed(0)
        return nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), torchext.models.BasicBlock(8, 8),
            torchext.models.BasicBlock(8, 16, stride=2), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 5),
        ).to(device)  # fmt: skip

    stock, ours = make(), make()
    report = torchext.swap_modules(ours)
    assert len(report.graph_forks) == 2, f"[swap report] one fork per block expected:\n{report}"
    model = report.model
    _assert_compiled_matches_stock(
        model, stock, (make_tensor((4, 3, 8, 8), torch.float32, device, "channels_last"),), device
    )


# The keyword arguments of inductor's fallback path, which passes an op's arguments to FallbackKernel.create by name:
# an op argument with one of these names fails to compile ("got multiple values for argument 'kernel'").
def _inductor_reserved_names():
    from torch._inductor import ir

    params = inspect.signature(ir.FallbackKernel.create).parameters.values()
    return {"cls"} | {p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


def test_no_schema_argument_named_like_inductors():
    reserved = _inductor_reserved_names()
    assert "kernel" in reserved, f"[inductor's reserved names] expected 'kernel' among {sorted(reserved)}"
    clashes = [
        f"{s.name}({a.name})"
        for s in torch._C._jit_get_all_schemas()
        if s.name.startswith("torchext::")
        for a in s.arguments
        if a.name in reserved
    ]
    assert not clashes, f"[schema arguments named like inductor's {sorted(reserved)}] {clashes}"


def test_decompose_mode_lets_inductor_fuse_activations():
    """Under set_compile_mode('decompose') the compiled code calls no torchext activation or softmax (inductor
    generated their math), and forward and backward still match eager torchext; 'kernels' restores the calls."""
    from torch._inductor.utils import run_and_get_code

    from torchext.compile import compile_mode, set_compile_mode

    ours, names, make_inputs = unary_group("torchext")
    inputs = make_inputs("cpu", torch.float32)
    with pytest.raises(ValueError, match="`mode` must be one of"):
        set_compile_mode("fuse")
    fx_graph_cache = torch._inductor.config.fx_graph_cache
    torch._dynamo.reset()
    set_compile_mode("decompose")
    try:
        assert compile_mode() == "decompose"
        fn = torch.compile(ours, backend="inductor", fullgraph=True)
        (out_c, grad_c, weights), code = run_and_get_code(forward_backward, fn, inputs)
    finally:
        set_compile_mode("kernels")
        torch._dynamo.reset()
    calls = [line.strip() for source in code for line in source.splitlines() if "torchext." in line]
    assert not calls, f"[decompose mode: compiled code still calls torchext ops] {calls[:5]}"
    out_e, grad_e, _ = forward_backward(ours, inputs, weights)
    for name, c, e in zip(names, out_c, out_e, strict=True):
        torch.testing.assert_close(c, e, **TOL["cpu"], msg=lambda m, n=name: f"[decompose {n}: compiled vs eager] {m}")
    for i, (c, e) in enumerate(zip(grad_c, grad_e, strict=True)):
        torch.testing.assert_close(c, e, **TOL["cpu"], msg=lambda m, i=i: f"[decompose grad {i}: compiled/eager] {m}")
    assert compile_mode() == "kernels"
    from torch._inductor.decomposition import decompositions

    assert torch.ops.torchext.relu.default not in decompositions, "[kernels mode] relu's decomposition left behind"
    assert torch._inductor.config.fx_graph_cache == fx_graph_cache, "[kernels mode] fx_graph_cache not restored"


class _NormBlocks(nn.Module):
    """Each torchext batch-norm module once, BatchNorm1d on (N, C, L) (the stock model: the same layers from torch.nn,
    relu and add written out)."""

    def __init__(self, lib):
        super().__init__()
        self.lib = lib
        if lib == "torchext":
            self.bn, self.bn_relu = tnn.BatchNorm2d(4, momentum=0.3), tnn.BatchNormReLU2d(4)
            self.bn_add_relu, self.conv_bn_relu = tnn.BatchNormAddReLU2d(4), tnn.Conv2dBatchNormReLU(4, 4, 3, padding=1)
            self.bn1d = tnn.BatchNorm1d(4)
        else:
            self.bn, self.bn_relu, self.bn_add_relu = (
                nn.BatchNorm2d(4, momentum=0.3),
                nn.BatchNorm2d(4),
                nn.BatchNorm2d(4),
            )
            self.conv_bn_relu = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU())
            self.bn1d = nn.BatchNorm1d(4)

    def forward(self, x):
        y = self.bn(x)
        if self.lib == "torchext":
            z = self.bn_add_relu(self.bn_relu(y), x)
        else:
            z = (self.bn_add_relu(self.bn_relu(y).relu()) + x).relu()
        out = self.conv_bn_relu(z)
        return out + self.bn1d(out.flatten(2)).view_as(out)  # (N, C, H W): channels-last input gives a strided view


@pytest.mark.parametrize("device", device_params())
def test_batch_norm_modules_compile_running_buffers(device):
    """torchext's batch-norm modules compiled with fullgraph, three training steps forward and backward: outputs,
    gradients, and the running buffers and num_batches_tracked after each step equal the stock modules' run eagerly.
    (momentum=None reads num_batches_tracked on the host: with fullgraph it fails as stock nn.BatchNorm2d's does.)"""
    torch._dynamo.reset()
    stock = _NormBlocks("torch").to(device, torch.float64)  # float64: a dozen layers' rounding stays under TOL
    ours = _NormBlocks("torchext").to(device, torch.float64)
    ours.load_state_dict(stock.state_dict())
    compiled = torch.compile(ours, backend="inductor", fullgraph=True)
    for step in range(3):
        x = make_tensor((3, 4, 5, 6), torch.float64, device, "channels_last" if step % 2 else "contiguous")
        out_c = compiled(x)
        out_s = stock(x)
        what = f"step {step}"
        torch.testing.assert_close(out_c, out_s, **TOL[device], msg=lambda m, w=what: f"[{w}: output] {m}")
        grads_c = torch.autograd.grad(out_c.square().sum(), list(ours.parameters()))
        grads_s = torch.autograd.grad(out_s.square().sum(), list(stock.parameters()))
        for (n, _), c, s in zip(stock.named_parameters(), grads_c, grads_s, strict=True):
            torch.testing.assert_close(c, s, **TOL[device], msg=lambda m, n=n, w=what: f"[{w}: {n}.grad] {m}")
        for (n, c), s in zip(ours.state_dict().items(), stock.state_dict().values(), strict=True):
            torch.testing.assert_close(c, s, **TOL[device], msg=lambda m, n=n, w=what: f"[{w}: {n}] {m}")


@pytest.mark.parametrize("device", device_params())
def test_swapped_pooling_model_compiles_fullgraph(device):
    """A channels-last CNN with MaxPool2d, AvgPool2d and a global AdaptiveAvgPool2d head, swapped to torchext and
    compiled with fullgraph: loss and every parameter's gradient equal the stock model's, eager."""
    torch._dynamo.reset()

    def make():
        torch.manual_seed(0)
        return nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.MaxPool2d(3, 2, 1), nn.Conv2d(8, 8, 3, padding=1),
            nn.AvgPool2d(2, ceil_mode=True), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5),
        ).to(device).to(memory_format=torch.channels_last)  # fmt: skip

    stock, ours = make(), make()
    report = torchext.swap_modules(ours)
    for cls in (tnn.MaxPool2d, tnn.AvgPool2d, tnn.AdaptiveAvgPool2d):
        assert any(type(m) is cls for m in ours.modules()), f"[swap report] {cls.__name__} missing:\n{report}"
    _assert_compiled_matches_stock(
        ours, stock, (make_tensor((4, 3, 9, 11), torch.float32, device, "channels_last"),), device
    )


# The fully swapped ResNet-18 of torchext-compare --swap-conv --compile, trained a few steps in a child process: a
# step that hangs on the GPU or compiles without end fails the test at the timeout (with the child's Python stacks,
# from faulthandler) instead of stalling the suite. On the GPU under bf16 autocast: 64-channel and wider layers at
# 32x32 take the implicit_tma convolutions and the fused batch norms, as the recipe's batch of 512 does. On the CPU
# in float32 (its kernels' dtypes), a smaller batch.
def _child_env(**extra: str) -> dict:
    """The environment of a child Python that imports this checkout's torchext, with ``extra`` set."""
    import os

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    pythonpath = os.pathsep.join(p for p in [repo, os.environ.get("PYTHONPATH", "")] if p)
    return dict(os.environ, PYTHONPATH=pythonpath, **extra)


_RESNET_COMPILE_SCRIPT = """
import contextlib, faulthandler, json, time
import torch
import torch.nn.functional as F
import torchext
from torch._dynamo.utils import counters

faulthandler.dump_traceback_later({stack_after}, exit=False)
device, batch = {device!r}, {batch}
cl = torch.channels_last


def make():
    torch.manual_seed(0)
    net = torchext.models.resnet18_cifar().to(device).to(memory_format=cl)
    return torchext.swap_modules(net, conv=True, channels_last=True, inplace=True).model


def amp():
    return torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda" else contextlib.nullcontext()


def sync():
    if device == "cuda":
        torch.cuda.synchronize()


eager, ours = make(), make()
compiled = torch.compile(ours)
optims = {{"eager": torchext.optim.SGD(eager.parameters(), lr=0.01, momentum=0.9),
           "compiled": torchext.optim.SGD(ours.parameters(), lr=0.01, momentum=0.9)}}
gen = torch.Generator(device=device).manual_seed(1)
for step, n in enumerate([batch, batch, batch, batch * 5 // 8, batch]):  # a short batch, as an epoch's last one
    x = torch.randn(n, 3, 32, 32, device=device, generator=gen).contiguous(memory_format=cl)
    y = torch.randint(0, 10, (n,), device=device, generator=gen)
    row = {{"step": step, "batch": n}}
    for name, fn in (("eager", eager), ("compiled", compiled)):
        t0 = time.perf_counter()
        with amp():
            loss = F.cross_entropy(fn(x).float(), y)
        loss.backward()
        sync()
        row[name] = loss.item()
        row[name + "_s"] = round(time.perf_counter() - t0, 2)
    # Every parameter's gradient, compiled against eager: the largest difference over the largest eager value.
    row["grad_err"] = max(
        ((c.grad - e.grad).abs().max() / e.grad.abs().max().clamp_min(1e-30)).item()
        for e, c in zip(eager.parameters(), ours.parameters(), strict=True)
    )
    for opt in optims.values():
        opt.step()
        opt.zero_grad(set_to_none=True)
    # Each step starts both models from the same weights: on CUDA the eager convolutions' weight gradients are the
    # float32 sums and the compiled ones (autocast's cast nodes) rounded to bf16, so the weights would drift apart.
    with torch.no_grad():
        for e, c in zip(eager.state_dict().values(), ours.state_dict().values(), strict=True):
            c.copy_(e)
    row["graphs"] = counters["stats"]["unique_graphs"]
    print(json.dumps(row), flush=True)
eager.eval(), ours.eval()
with torch.no_grad(), amp():
    x = torch.randn(batch, 3, 32, 32, device=device, generator=gen).contiguous(memory_format=cl)
    ref, out = eager(x).float(), compiled(x).float()
    print(json.dumps({{"eval_err": ((out - ref).abs().max() / ref.abs().max()).item()}}), flush=True)
"""


@pytest.mark.parametrize("device", device_params())
def test_swapped_resnet18_trains_compiled(device, tmp_path):
    """torch.compile of the fully swapped resnet18_cifar (every conv, batch norm, fused residual, pool and fork
    torchext's), channels-last, bf16 autocast on the GPU: five SGD steps (the fourth a short batch) and an eval pass
    finish; the compiled model's losses, every parameter's gradient at every step and the eval logits track the eager
    model's from the same weights and batches; and the fixed-shape steps reuse the compiled graphs (no recompilation
    from step to step)."""
    import json
    import subprocess
    import sys

    timeout = 300  # a compile of both directions takes well under a minute where it works
    script = tmp_path / "resnet_compile.py"
    batch = 64 if device == "cuda" else 8
    script.write_text(_RESNET_COMPILE_SCRIPT.format(stack_after=timeout - 30, device=device, batch=batch))
    try:
        proc = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, timeout=timeout, env=_child_env()
        )
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        pytest.fail(f"[compiled ResNet-18] no end within {timeout} s; steps so far:\n{out}\nstacks:\n{err[-6000:]}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == 6, proc.stdout + proc.stderr[-3000:]
    steps, final = rows[:-1], rows[-1]
    # Our kernels run in both; inductor compiles the rest (the loss, autocast's casts), which may round differently:
    # float32 on the CPU agrees to float32 rounding, bf16 activations on the GPU to bf16's (and there the compiled
    # weight gradients are rounded to bf16, the eager ones not: docs/autocast_copies.md).
    tol = 1e-4 if device == "cpu" else 0.1  # a wrong backward is off by O(1)
    for r in steps:
        assert abs(r["compiled"] - r["eager"]) <= tol * abs(r["eager"]), f"[loss, compiled vs eager] {r}"
        assert r["grad_err"] <= tol, f"[parameter gradients, compiled vs eager] {r}"
    # Steps 1 and 2 repeat step 0's shapes: no new graph. The short batch may compile a dynamic one; step 4 reuses it.
    assert steps[2]["graphs"] == steps[0]["graphs"], f"[recompiled between fixed-shape steps] {steps}"
    assert steps[4]["graphs"] == steps[3]["graphs"], f"[recompiled after the short batch] {steps}"
    assert final["eval_err"] <= tol, f"[eval logits, compiled vs eager] {final}"


_FALLBACK_CHAIN_SCRIPT = """
import logging, sys
import torch
{imports}
torch._logging.set_logs(inductor=logging.INFO)
from torch._inductor.exc import OperatorIssue
assert OperatorIssue.operator_str is torchext.compile._operator_str, "torch._inductor.exc's operator_str is torch's"


def chain(x):
    for _ in range({depth}):
        x = torch.ops.torchext.matmul(x, x)  # each product reads its input twice
    return torch.ops.torchext.relu(x)


x = torch.eye(3)[[1, 2, 0]]  # a 3-cycle: its powers are permutations, exact in float32
assert torch.equal(torch.compile(chain)(x), chain(x)), "compiled result differs from eager"
"""


@pytest.mark.parametrize("order", ["torchext_first", "inductor_first"])
def test_inductor_fallback_message_is_bounded(order, tmp_path):
    """Inductor's "Creating implicit fallback for:" message, with its log on, for an op whose argument derives from
    14 matmul(x, x): torch's text holds 2^14 copies of x (63 MB), torchext's a line per argument (torchext/compile.py;
    docs/compile.md). Whether inductor is imported after torchext (the import hook) or before, the chain compiles, the
    log stays short and the compiled chain gives eager's result."""
    import subprocess
    import sys

    # Caches off: a cached graph is not lowered again, and the message is written while lowering.
    env = _child_env(TORCHINDUCTOR_FORCE_DISABLE_CACHES="1")
    imports = {
        "torchext_first": "import torchext\nimport torch._dynamo",
        "inductor_first": "import torch._dynamo\nimport torchext",
    }
    script = tmp_path / "chain.py"
    script.write_text(_FALLBACK_CHAIN_SCRIPT.format(imports=imports[order], depth=14))
    log = tmp_path / "log.txt"
    with open(log, "w") as err:  # unbounded, the text is tens of megabytes: to a file, not to memory
        try:
            proc = subprocess.run([sys.executable, str(script)], stdout=err, stderr=err, timeout=180, env=env)
        except subprocess.TimeoutExpired:
            pytest.fail(
                f"[fallback message] 14 chained torchext ops: no compile in 180 s ({log.stat().st_size} B logged)"
            )
    size = log.stat().st_size
    text = log.read_text() if size < 1_000_000 else ""
    assert proc.returncode == 0, text[-4000:]
    assert size < 200_000, f"[fallback message] {size} bytes logged"
    assert "Creating implicit fallback" in text and "target: torchext.relu.default" in text, text[-4000:]
