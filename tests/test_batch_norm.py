"""torchext's batch norm family against torch: batch_norm, batch_norm_relu and batch_norm_add_relu (forward in training
and eval, the running statistics, the relu mask), batch_norm_backward for each output_mask, gradcheck and
gradgradcheck, the stats-from-convolution path (conv2d_stats' sums), empty batches, the modules (BatchNorm2d,
BatchNormReLU2d, BatchNormAddReLU2d, Conv2dBatchNormReLU: state_dict both ways, momentum=None, track_running_stats,
affine) and swap_modules.

References are float64 torch on the CPU; torch's own result in the tested dtype sets the tolerance (conftest's
assert_accurate). Odd shapes: batch 1 in eval, batch 2 in training, C = 1 and 3, H = W = 1, N H W not a multiple of
any vector width, 2-D, 3-D and 5-D inputs; contiguous, channels-last, sliced, offset and expanded layouts. The CUDA
variants of the same tests skip without a GPU (every rung of the CUDA ladder: tests/test_batch_norm_kernels_gpu.py)."""

import pytest
import torch
import torch.nn.functional as F
from conftest import ERROR_FLOOR, assert_accurate, gpu, make_tensor, max_error, poison_allocator
from torch import nn
from torch.autograd import gradcheck, gradgradcheck

import torchext
import torchext.functional as tf
import torchext.nn as tnn

ops = torch.ops.torchext
KINDS = ("plain", "relu", "add_relu")
DEVICE_DTYPES = [
    pytest.param("cpu", torch.float32, id="cpu-float32"),
    pytest.param("cpu", torch.float64, id="cpu-float64"),
    pytest.param("cpu", torch.bfloat16, id="cpu-bfloat16"),
    pytest.param("cuda", torch.float32, id="cuda-float32", marks=gpu),
    pytest.param("cuda", torch.float64, id="cuda-float64", marks=gpu),
    pytest.param("cuda", torch.float16, id="cuda-float16", marks=gpu),
    pytest.param("cuda", torch.bfloat16, id="cuda-bfloat16", marks=gpu),
]
DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=gpu)]

# (id, shape, layout, training)
CASES = [
    ("4d train", (2, 3, 5, 7), "contiguous", True),
    ("4d train channels_last", (2, 3, 5, 7), "channels_last", True),
    ("4d eval batch 1", (1, 3, 5, 7), "contiguous", False),
    ("4d eval batch 1 channels_last", (1, 3, 5, 7), "channels_last", False),
    ("C=1 train", (3, 1, 4, 5), "contiguous", True),
    ("H=W=1 batch 2 train", (2, 3, 1, 1), "channels_last", True),
    ("C=16 train channels_last", (2, 16, 3, 5), "channels_last", True),
    ("C=16 eval channels_last", (3, 16, 3, 3), "channels_last", False),
    ("HW=8 train", (3, 8, 2, 4), "contiguous", True),
    ("sliced train", (2, 3, 5, 7), "strided", True),
    ("offset train", (2, 8, 2, 4), "offset", True),
    ("expanded train", (3, 3, 4, 5), "expanded", True),
    ("2d train", (5, 3), "contiguous", True),
    ("2d eval batch 1", (1, 3), "contiguous", False),
    ("2d C=24 train", (7, 24), "contiguous", True),
    ("3d train", (3, 4, 7), "contiguous", True),
    ("5d train channels_last_3d", (2, 3, 2, 3, 4), "channels_last_3d", True),
]


def _id(case):
    return case[0]


def _params(c, device, dtype, param_dtype=None, affine=True):
    """weight, bias, running_mean, running_var for c channels (float32 parameters for half inputs by default)."""
    pdt = param_dtype or (torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype)
    w = make_tensor((c,), pdt, device, low=0.5, high=2.0) if affine else None
    b = make_tensor((c,), pdt, device) if affine else None
    rm = make_tensor((c,), pdt, device, low=-1.0, high=1.0)
    rv = make_tensor((c,), pdt, device, low=0.5, high=2.0)
    return w, b, rm, rv


def _copy(t):
    return None if t is None else t.clone()


def torch_batch_norm(kind, x, residual, w, b, rm, rv, training, momentum=0.1, eps=1e-5):
    """The pure-PyTorch reference of the family (also benchmarks/bench_batch_norm.py's eager and compiled baseline):
    kind 'plain' is F.batch_norm, 'relu' relu(F.batch_norm), 'add_relu' relu(F.batch_norm + residual)."""
    y = F.batch_norm(x, rm, rv, w, b, training, momentum, eps)
    if kind == "add_relu":
        y = y + residual
    return y.relu() if kind != "plain" else y


def _ours(kind, x, residual, w, b, rm, rv, training, momentum=0.1, eps=1e-5, **kw):
    if kind == "plain":
        return tf.batch_norm(x, rm, rv, w, b, training, momentum, eps, **kw)
    if kind == "relu":
        return tf.batch_norm_relu(x, rm, rv, w, b, training, momentum, eps, **kw)
    return tf.batch_norm_add_relu(x, residual, rm, rv, w, b, training, momentum, eps, **kw)


def _f64(t):
    return None if t is None else t.detach().cpu().double().clone()


def _expected_strides(x):
    from torchext.ops.batch_norm import memory_format

    return torch.empty(x.shape, memory_format=memory_format(x)).stride()


# --- forward ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("device, dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("case", CASES, ids=_id)
def test_forward_matches_torch(case, device, dtype):
    """Each op's output (values and layout) and the running statistics after the call, against float64 torch."""
    _, shape, layout, training = case
    for kind in KINDS:
        x = make_tensor(shape, dtype, device, layout)
        residual = make_tensor(shape, dtype, device, layout) if kind == "add_relu" else None
        w, b, rm, rv = _params(shape[1], device, dtype)
        ref_rm, ref_rv = _f64(rm), _f64(rv)
        ref = torch_batch_norm(kind, _f64(x), _f64(residual), _f64(w), _f64(b), ref_rm, ref_rv, training)
        theirs_rm, theirs_rv = rm.clone(), rv.clone()
        # torch's own result from a fresh (aligned) copy: cuDNN's fp16 training kernel (bn_fw_tr_1C11_singleread_spec)
        # reads a storage-offset input with misaligned half2 loads and faults (compute-sanitizer, H100, cuDNN 9.19).
        theirs = torch_batch_norm(kind, _copy(x), _copy(residual), w, b, theirs_rm, theirs_rv, training)
        poison_allocator(device, x)
        out = _ours(kind, x, residual, w, b, rm, rv, training)
        what = f"{kind} {case[0]} {dtype}"
        assert out.dtype == dtype and out.shape == x.shape, f"[{what}] {out.dtype} {tuple(out.shape)}"
        assert out.stride() == _expected_strides(x), f"[{what}: strides] {out.stride()} vs {_expected_strides(x)}"
        assert_accurate(out, theirs, ref, f"{what}: output", dtype=dtype)
        assert_accurate(rm, theirs_rm, ref_rm, f"{what}: running_mean", dtype=rm.dtype)
        assert_accurate(rv, theirs_rv, ref_rv, f"{what}: running_var", dtype=rv.dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_parameters_in_input_dtype_and_absent(device):
    """bfloat16 parameters with a bfloat16 input (on CUDA; the CPU has bfloat16 too), and no weight / bias / running
    buffers at all (training on the batch's statistics alone)."""
    x = make_tensor((4, 8, 3, 5), torch.bfloat16, device, "channels_last")
    w, b, rm, rv = _params(8, device, torch.bfloat16, param_dtype=torch.bfloat16)
    ref_rm, ref_rv = _f64(rm), _f64(rv)
    ref = torch_batch_norm("relu", _f64(x), None, _f64(w), _f64(b), ref_rm, ref_rv, True)
    theirs_rm, theirs_rv = rm.clone(), rv.clone()
    theirs = torch_batch_norm("relu", x, None, w, b, theirs_rm, theirs_rv, True)
    out = tf.batch_norm_relu(x, rm, rv, w, b, training=True)
    assert_accurate(out, theirs, ref, "bf16 parameters: output")
    assert_accurate(rv, theirs_rv, ref_rv, "bf16 parameters: running_var")
    x = make_tensor((4, 3, 5), torch.float64, device)
    torch.testing.assert_close(tf.batch_norm(x, None, None, training=True), F.batch_norm(x, None, None, training=True))


@pytest.mark.parametrize("device", DEVICES)
def test_relu_mask_bits(device):
    """The mask's bits, in the output's memory order (channels-last here), are the pre-activation's sign; the bits
    past numel are 0; save_mean / save_invstd are the batch's mean and 1 / sqrt(var + eps) in float32."""
    x = make_tensor((3, 5, 3, 3), torch.float32, device, "channels_last")  # 135 elements: a partial last byte
    out, mask, save_mean, save_invstd = ops.batch_norm_relu(x, None, None, None, None, True, 0.1, 1e-5)
    pre = F.batch_norm(x.double(), None, None, training=True)
    order = pre.permute(0, 2, 3, 1).reshape(-1)  # memory order of a channels-last tensor
    bits = ((mask.cpu().unsqueeze(1) >> torch.arange(8, dtype=torch.uint8)) & 1).reshape(-1)
    assert mask.dtype == torch.uint8 and mask.shape == (17,), f"[mask] {mask.dtype} {tuple(mask.shape)}"
    assert torch.equal(bits[:135].bool(), (order > 0).cpu()), "[mask bits vs pre-activation > 0]"
    assert not bits[135:].any(), "[mask bits past numel]"
    assert save_mean.dtype == torch.float32 and save_invstd.dtype == torch.float32
    var, mean = torch.var_mean(x.double(), (0, 2, 3), correction=0)
    torch.testing.assert_close(save_mean.double(), mean, msg="[save_mean]")
    torch.testing.assert_close(save_invstd.double(), (var + 1e-5).rsqrt(), msg="[save_invstd]")


# --- the running statistics ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("momentum", [0.1, None], ids=["momentum=0.1", "momentum=None"])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_running_statistics_bit_for_bit(device, momentum, layout):
    """float64, integer-valued inputs over N H W = 64 elements per channel (so every batch statistic is exact on both
    sides): after several training steps the running buffers and num_batches_tracked are the same bits as
    nn.BatchNorm2d's on the CPU, and eval outputs then agree."""
    stock = nn.BatchNorm2d(5, momentum=momentum).double()
    ours = tnn.BatchNorm2d.from_torch(stock).to(device)
    for step in range(4):
        x = torch.randint(-8, 9, (4, 5, 4, 4), dtype=torch.float64) + step
        if layout == "channels_last":
            x = x.contiguous(memory_format=torch.channels_last)
        stock(x)
        ours(x.to(device))
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        theirs, mine = getattr(stock, name), getattr(ours, name).cpu()
        assert torch.equal(mine, theirs), f"[{name} after 4 steps] {mine.tolist()} vs {theirs.tolist()}"
    stock.eval(), ours.eval()
    x = make_tensor((1, 5, 3, 3), torch.float64, "cpu", layout)
    torch.testing.assert_close(ours(x.to(device)).cpu(), stock(x), msg="[eval output]")


def test_running_buffers_version_and_n1():
    """The running buffers' version counters advance (they are written in place); one value per channel in training
    raises as torch's F.batch_norm does, and the op itself gives ATen's NaN running_var (0 / 0)."""
    rm, rv = torch.zeros(3), torch.ones(3)
    version = rm._version
    tf.batch_norm(torch.randn(2, 3, 2, 2, requires_grad=True), rm, rv, training=True)
    assert rm._version > version, "[running_mean version counter]"
    with pytest.raises(ValueError, match="Expected more than 1 value per channel when training"):
        tf.batch_norm_relu(torch.randn(1, 3, 1, 1), rm, rv, training=True)
    ops.batch_norm(torch.randn(1, 3, 1, 1), None, None, rm, rv, True, 0.1, 1e-5)
    assert torch.isnan(rv).all(), f"[running_var after one value per channel] {rv}"


@pytest.mark.parametrize("device", DEVICES)
def test_num_batches_tracked_counted_by_the_op(device):
    """num_batches_tracked given to an op in training gains exactly 1 per call (each op; an empty batch and a tensor
    with no channels count too, as nn.BatchNorm2d counts them) and its version counter advances."""
    count = torch.zeros((), dtype=torch.long, device=device)
    calls = 0
    for shape in [(4, 8, 3, 3), (0, 8, 3, 3), (2, 0, 3, 3)]:
        x = torch.randn(shape, device=device).contiguous(memory_format=torch.channels_last)
        for kind in KINDS:
            version = count._version
            if kind == "plain":
                ops.batch_norm(x, None, None, None, None, True, 0.1, 1e-5, num_batches_tracked=count)
            elif kind == "relu":
                ops.batch_norm_relu(x, None, None, None, None, True, 0.1, 1e-5, num_batches_tracked=count)
            else:
                ops.batch_norm_add_relu(x, x, None, None, None, None, True, 0.1, 1e-5, num_batches_tracked=count)
            calls += 1
            assert count.item() == calls, f"[{kind} {shape}] num_batches_tracked {count.item()}, expected {calls}"
            assert count._version > version, f"[{kind} {shape}] version counter"


@pytest.mark.parametrize("momentum", [0.1, None], ids=["momentum=0.1", "momentum=None"])
def test_modules_count_batches_in_the_op(momentum):
    """With a momentum the modules hand num_batches_tracked to the op, which counts the batch (no aten::add_ of their
    own in a training forward); with momentum=None the factor 1 / num_batches_tracked needs the count first, so the
    module adds it on the host as torch does. Either way the count is nn.BatchNorm2d's."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(str(func))
            return func(*args, **(kwargs or {}))

    x = torch.randn(4, 6, 3, 3)
    for module in (tnn.BatchNorm2d(6, momentum=momentum), tnn.BatchNormReLU2d(6, momentum=momentum)):
        with Record() as rec:
            module(x)
        adds = [n for n in rec.names if n.startswith("aten.add")]
        assert len(adds) == (0 if momentum is not None else 1), f"[{type(module).__name__}] {rec.names}"
        assert module.num_batches_tracked.item() == 1
    pair = tnn.Conv2dBatchNormReLU(3, 6, 3, padding=1, momentum=momentum)
    stock = nn.BatchNorm2d(6, momentum=momentum)
    for _ in range(3):
        pair(torch.randn(2, 3, 5, 5))
        stock(torch.randn(2, 6, 5, 5))
    pair.eval()(torch.randn(2, 3, 5, 5))
    assert torch.equal(pair.bn.num_batches_tracked, stock.num_batches_tracked)


# --- backward --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("device, dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("case", [c for c in CASES if c[2] != "expanded"], ids=_id)
def test_backward_matches_torch(case, device, dtype):
    """Gradients of input, residual, weight and bias through each op, against torch's (float64 reference), with a
    grad_out in another layout than the output's; grad_input and the residual's take input's layout."""
    _, shape, layout, training = case
    for kind in KINDS:
        x = make_tensor(shape, dtype, device, layout)
        residual = make_tensor(shape, dtype, device, layout) if kind == "add_relu" else None
        w, b, rm, rv = _params(shape[1], device, dtype)
        g = make_tensor(shape, dtype, device, "transposed" if len(shape) > 1 else "contiguous")
        inputs = [t for t in (x, residual, w, b) if t is not None]

        def grads(fn, tensors, grad, kind=kind, rm=rm, rv=rv, training=training):
            leaves = [t.detach().clone().requires_grad_() for t in tensors]
            args = iter(leaves)
            xx = next(args)
            rr = next(args) if kind == "add_relu" else None
            ww, bb = next(args), next(args)
            out = fn(kind, xx, rr, ww, bb, rm.to(ww.device, ww.dtype), rv.to(ww.device, ww.dtype), training)
            return torch.autograd.grad(out, leaves, grad)

        ref = grads(torch_batch_norm, [_f64(t) for t in inputs], _f64(g))
        theirs = grads(torch_batch_norm, inputs, g)
        ours = grads(_ours, inputs, g)
        names = ["input"] + (["residual"] if kind == "add_relu" else []) + ["weight", "bias"]
        for name, o, t, r, src in zip(names, ours, theirs, ref, inputs, strict=True):
            what = f"{kind} {case[0]} {dtype}: {name}.grad"
            assert o.dtype == src.dtype, f"[{what}] dtype {o.dtype}"
            if name in ("input", "residual"):
                assert o.stride() == _expected_strides(x), f"[{what}: strides] {o.stride()}"
            assert_accurate(o, t, r, what, dtype=o.dtype, factor=4.0)


@pytest.mark.parametrize("device", DEVICES)
def test_backward_op_output_masks(device):
    """batch_norm_backward for every output_mask: requested results equal the full call's, the others are empty;
    the results start poisoned (NaN) and are written fully."""
    x = make_tensor((3, 5, 2, 3), torch.float32, device, "channels_last")
    r = make_tensor(x.shape, torch.float32, device, "channels_last")
    w, b, _, _ = _params(5, device, torch.float32)
    out, mask, sm, si = ops.batch_norm_add_relu(x, r, w, b, None, None, True, 0.1, 1e-5)
    g = make_tensor(x.shape, torch.float32, device)
    full = ops.batch_norm_backward(g, x, w, sm, si, mask, True, 1e-5, [True] * 4)
    masked_g = g * (out > 0)
    torch.testing.assert_close(full[3], masked_g, msg="[grad_residual = grad_out * (out > 0)]")
    torch.testing.assert_close(full[2], masked_g.sum((0, 2, 3)), msg="[grad_bias]")
    for bits in range(16):
        output_mask = [bool(bits >> i & 1) for i in range(4)]
        for t in full:
            poison_allocator(device, t)
        got = ops.batch_norm_backward(g, x, w, sm, si, mask, True, 1e-5, output_mask)
        for i, (want, have) in enumerate(zip(full, got, strict=True)):
            if output_mask[i]:
                torch.testing.assert_close(have, want, msg=lambda m, i=i, k=output_mask: f"[mask {k}: result {i}] {m}")
            else:
                assert have.numel() == 0, f"[mask {output_mask}: result {i} should be empty] {tuple(have.shape)}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(3, 2, 2, 3), (1, 8, 2, 4)], ids=["C2", "C8"])
def test_gradcheck_and_gradgradcheck(device, shape):
    """float64: first and second derivatives of each op in training and eval, NCHW and channels-last, with and without
    affine parameters, through input, residual, weight and bias. On the GPU the first derivatives run the CUDA kernels
    (C = 8, H W = 8: the vectorized rows kernels in channels-last, the planes kernels in NCHW; C = 2: the simple ones),
    the second compose ATen ops."""
    C = shape[1]
    for layout in ("contiguous", "channels_last"):
        x = make_tensor(shape, torch.float64, device, layout, requires_grad=True)
        r = make_tensor(x.shape, torch.float64, device, layout, requires_grad=True)
        w = make_tensor((C,), torch.float64, device, low=0.5, high=2.0, requires_grad=True)
        b = make_tensor((C,), torch.float64, device, requires_grad=True)
        for training in (True, False):

            def norm(op, *args, training=training):
                rm = torch.zeros(C, dtype=torch.float64, device=device)
                rv = torch.ones(C, dtype=torch.float64, device=device)
                if op == "add_relu":
                    x, r, w, b = args
                    return tf.batch_norm_add_relu(x, r, rm, rv, w, b, training)
                fn = tf.batch_norm_relu if op == "relu" else tf.batch_norm
                x, w, b = (*args, None, None)[:3]
                return fn(x, rm, rv, w, b, training)

            fns = {
                "plain": (lambda x, w, b: norm("plain", x, w, b), (x, w, b)),
                "relu": (lambda x, w, b: norm("relu", x, w, b), (x, w, b)),
                "add_relu": (lambda x, r, w, b: norm("add_relu", x, r, w, b), (x, r, w, b)),
                "no affine": (lambda x: norm("plain", x), (x,)),
            }
            for name, (fn, args) in fns.items():
                what = f"{name} training={training} {layout}"
                assert gradcheck(fn, args), f"[gradcheck {what}]"
                assert gradgradcheck(fn, args), f"[gradgradcheck {what}]"


# --- statistics from the convolution ---------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_stats_from_conv2d_stats(device, layout):
    """batch_norm_relu with conv2d_stats' sum / sum_sq matches the plain path (outputs, running statistics, and the
    gradients of the convolution's input and weight through both), and the sums receive no gradient."""
    dtype = torch.float64
    x = make_tensor((3, 4, 6, 5), dtype, device, layout)
    cw = make_tensor((6, 4, 3, 3), dtype, device) * 0.3
    w, b, rm, rv = _params(6, device, dtype)
    results = {}
    for path in ("plain", "sums"):
        xx, ww = x.detach().clone().requires_grad_(), cw.detach().clone().requires_grad_()
        run_mean, run_var = rm.clone(), rv.clone()
        out, s, ss = torchext.ops.conv2d_stats(xx, ww, None, padding=1)
        sums = dict(sum=s, sum_sq=ss) if path == "sums" else {}
        y = tf.batch_norm_relu(out, run_mean, run_var, w, b, True, 0.1, 1e-5, **sums)
        g = torch.autograd.grad(y, (xx, ww, s, ss), torch.ones_like(y), allow_unused=True)
        results[path] = (y, run_mean, run_var, *g)
    names = ("output", "running_mean", "running_var", "input.grad", "weight.grad")
    for i, name in enumerate(names):
        torch.testing.assert_close(results["sums"][i], results["plain"][i], msg=lambda m, n=name: f"[{n}] {m}")
    assert results["sums"][5] is None and results["sums"][6] is None, "[sum / sum_sq receive no gradient]"


def test_stats_from_sums_gradcheck():
    """With sums computed from the input by differentiable ops, first and second derivatives are batch norm's."""
    x = make_tensor((3, 2, 2, 3), torch.float64, "cpu", requires_grad=True)
    w = make_tensor((2,), torch.float64, "cpu", requires_grad=True)

    def fn(x, w):
        s, ss = x.sum((0, 2, 3)), (x * x).sum((0, 2, 3))
        return tf.batch_norm_relu(x, None, None, w, None, True, sum=s, sum_sq=ss)

    assert gradcheck(fn, (x, w)), "[gradcheck with sums]"
    assert gradgradcheck(fn, (x, w)), "[gradgradcheck with sums]"
    torch.testing.assert_close(fn(x, w), tf.batch_norm_relu(x, None, None, w, None, True), msg="[sums vs plain]")


def test_stats_from_sums_large_mean():
    """Plain sums with a mean far from zero (mean^2 / var = 1e4): the variance from E[x^2] - E[x]^2, computed in
    float64 from float32 sums, is within the documented bound 2^-24 (1 + mean^2 / var) x a small factor."""
    x = (torch.randn(8, 4, 16, 16, dtype=torch.float64) + 100.0).float()
    s, ss = x.double().sum((0, 2, 3)).float(), (x.double() ** 2).sum((0, 2, 3)).float()
    _, _, invstd = ops.batch_norm(x, None, None, None, None, True, 0.1, 0.0, s, ss)
    var = x.double().var((0, 2, 3), unbiased=False)
    rel = ((invstd.double() ** -2 - var) / var).abs().max().item()
    assert rel < 16 * 2**-24 * (1 + 1e4), f"[variance from plain sums, relative error] {rel:.3g}"


# --- empty tensors ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_empty_batch(device, layout):
    """N = 0, as torch: an empty output, the running statistics untouched in training, zero weight and bias
    gradients; eval likewise; C = 0 gives empty everything."""
    for training in (True, False):
        for kind in KINDS:
            x = make_tensor((0, 3, 4, 5), torch.float32, device, layout, requires_grad=True)
            r = make_tensor((0, 3, 4, 5), torch.float32, device, layout) if kind == "add_relu" else None
            w, b, rm, rv = _params(3, device, torch.float32)
            w.requires_grad_(), b.requires_grad_()
            rm0, rv0 = rm.clone(), rv.clone()
            out = _ours(kind, x, r, w, b, rm, rv, training)
            assert out.shape == x.shape, f"[{kind} training={training}: output shape]"
            assert torch.equal(rm, rm0) and torch.equal(rv, rv0), f"[{kind}: running statistics must stay]"
            gx, gw, gb = torch.autograd.grad(out.sum(), (x, w, b))
            assert gx.shape == x.shape and not gw.any() and not gb.any(), f"[{kind} training={training}: grads]"
    out = tf.batch_norm(torch.randn(2, 0, 3, device=device), None, None, training=True)
    assert out.shape == (2, 0, 3)


# --- modules ---------------------------------------------------------------------------------------------------------


def _stock_pair(module_kwargs, device="cpu"):
    stock = nn.BatchNorm2d(6, **module_kwargs).double().to(device)
    with torch.no_grad():
        if stock.affine:
            stock.weight.uniform_(0.5, 2.0)
            stock.bias.uniform_(-1.0, 1.0)
    return stock, tnn.BatchNorm2d.from_torch(stock)


def _step_matches_stock(stock, ours, x, what):
    """One forward and backward of both modules on x: ours runs torchext's op (its autograd node), and the outputs
    and the gradients of x and every parameter agree."""
    xs, xo = x.clone().requires_grad_(), x.clone().requires_grad_()
    ys, yo = stock(xs), ours(xo)
    assert "torchext" in yo.grad_fn.name(), f"[{what}] not torchext's op: {yo.grad_fn.name()}"
    torch.testing.assert_close(yo, ys, msg=lambda m: f"[{what}: output] {m}")
    g = torch.randn_like(ys)
    params_s, params_o = [xs, *stock.parameters()], [xo, *ours.parameters()]
    grads = zip(torch.autograd.grad(yo, params_o, g), torch.autograd.grad(ys, params_s, g), strict=True)
    for i, (a, c) in enumerate(grads):
        torch.testing.assert_close(a, c, msg=lambda m, i=i: f"[{what}: grad {i}] {m}")


def _state_dicts_match(stock, ours, what):
    for (name, a), c in zip(ours.state_dict().items(), stock.state_dict().values(), strict=True):
        torch.testing.assert_close(a, c, msg=lambda m, n=name: f"[{what}: {n}] {m}")


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"momentum": None}, {"affine": False}, {"track_running_stats": False}, {"eps": 1e-3, "momentum": 0.3}],
    ids=["default", "momentum None", "affine False", "no running stats", "eps momentum"],
)
def test_batch_norm2d_module_matches_stock(kwargs):
    """torchext.nn.BatchNorm2d against nn.BatchNorm2d: training steps (outputs, gradients, buffers), then eval."""
    stock, ours = _stock_pair(kwargs)
    assert isinstance(ours, nn.BatchNorm2d) and type(ours) is tnn.BatchNorm2d
    for step in range(3):
        x = make_tensor((4, 6, 3, 5), torch.float64, "cpu", "channels_last" if step % 2 else "contiguous")
        _step_matches_stock(stock, ours, x, f"{kwargs} step {step}")
    _state_dicts_match(stock, ours, str(kwargs))
    stock.eval(), ours.eval()
    x = make_tensor((2, 6, 3, 5), torch.float64, "cpu")
    torch.testing.assert_close(ours(x), stock(x), msg=lambda m: f"[{kwargs}: eval output] {m}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "kwargs",
    [{}, {"momentum": None}, {"affine": False}, {"track_running_stats": False}],
    ids=["default", "momentum None", "affine False", "no running stats"],
)
def test_batch_norm1d_module_matches_stock(device, kwargs):
    """torchext.nn.BatchNorm1d against nn.BatchNorm1d on (N, C) and (N, C, L) input, float64: training steps
    (outputs, every gradient, the buffers), eval, the state_dict; from_torch takes only an nn.BatchNorm1d, and batch
    1 of (N, C) in training raises torch's error."""
    stock = nn.BatchNorm1d(16, **kwargs).double().to(device)
    with torch.no_grad():
        if stock.affine:
            stock.weight.uniform_(0.5, 2.0)
            stock.bias.uniform_(-1.0, 1.0)
    ours = tnn.BatchNorm1d.from_torch(stock)
    assert isinstance(ours, nn.BatchNorm1d) and type(ours) is tnn.BatchNorm1d
    # on the GPU (N, C) is the kernels' rows path (16-byte vectors where C % 8 == 0), (N, C, L) their planes (vectors
    # where L % 8 == 0); the strided and transposed inputs are copied to that layout first
    shapes = [
        ((5, 16), "contiguous"),
        ((3, 16, 7), "contiguous"),
        ((4, 16, 8), "contiguous"),
        ((4, 16, 8), "strided"),
        ((6, 16), "transposed"),
        ((2, 16), "contiguous"),
    ]
    for step, (shape, layout) in enumerate(shapes):
        x = make_tensor(shape, torch.float64, device, layout)
        _step_matches_stock(stock, ours, x, f"{kwargs} step {step} {shape} {layout}")
    _state_dicts_match(stock, ours, str(kwargs))
    with pytest.raises(ValueError, match="Expected more than 1 value per channel when training"):
        ours(make_tensor((1, 16), torch.float64, device))
    with pytest.raises(ValueError, match="expected 2D or 3D input"):
        ours(make_tensor((2, 16, 3, 3), torch.float64, device))
    stock.eval(), ours.eval()
    for shape in ((1, 16) if stock.track_running_stats else (3, 16), (2, 16, 5)):
        x = make_tensor(shape, torch.float64, device)
        torch.testing.assert_close(ours(x), stock(x), msg=lambda m, s=shape: f"[{kwargs}: eval output {s}] {m}")
    with pytest.raises(TypeError, match="expected an nn.BatchNorm1d, got BatchNorm2d"):
        tnn.BatchNorm1d.from_torch(nn.BatchNorm2d(3))


def test_state_dict_round_trip_and_fused_modules():
    """A stock state_dict loads into every torchext BatchNorm module and back; BatchNormReLU2d and BatchNormAddReLU2d
    equal the stock layers followed by relu (and + residual), outputs and gradients."""
    stock, ours = _stock_pair({})
    stock(torch.randn(4, 6, 3, 3, dtype=torch.float64))  # non-trivial running statistics
    for cls in (tnn.BatchNorm2d, tnn.BatchNormReLU2d, tnn.BatchNormAddReLU2d):
        module = cls(6).double()
        module.load_state_dict(stock.state_dict())
        back = nn.BatchNorm2d(6).double()
        back.load_state_dict(module.state_dict())
        for key, value in stock.state_dict().items():
            assert torch.equal(back.state_dict()[key], value), f"[{cls.__name__}: {key} round trip]"
    relu, add = tnn.BatchNormReLU2d.from_torch(stock), tnn.BatchNormAddReLU2d.from_torch(stock)
    ref_relu, ref_add = (_stock_pair({})[0] for _ in range(2))
    for ref in (ref_relu, ref_add):
        ref.load_state_dict(stock.state_dict())
    x = make_tensor((3, 6, 4, 5), torch.float64, "cpu", "channels_last", requires_grad=True)
    r = make_tensor(x.shape, torch.float64, "cpu", requires_grad=True)
    pairs = (
        ("BatchNormReLU2d", relu(x), ref_relu(x).relu(), relu, ref_relu),
        ("BatchNormAddReLU2d", add(x, r), (ref_add(x) + r).relu(), add, ref_add),
    )
    for name, ours_out, theirs_out, mod, ref in pairs:
        torch.testing.assert_close(ours_out, theirs_out, msg=lambda m, n=name: f"[{n}: output] {m}")
        wrt = [x, r, mod.weight] if "Add" in name else [x, mod.weight]
        wrt_ref = [x, r, ref.weight] if "Add" in name else [x, ref.weight]
        ours_grads, theirs_grads = (
            torch.autograd.grad(ours_out.sum(), wrt),
            torch.autograd.grad(theirs_out.sum(), wrt_ref),
        )
        for i, (a, c) in enumerate(zip(ours_grads, theirs_grads, strict=True)):
            torch.testing.assert_close(a, c, msg=lambda m, n=name, i=i: f"[{n}: grad {i}] {m}")
        torch.testing.assert_close(mod.running_var, ref.running_var, msg=lambda m, n=name: f"[{n}: running_var] {m}")
    with pytest.raises(TypeError, match="expected an nn.BatchNorm2d"):
        tnn.BatchNorm2d.from_torch(nn.BatchNorm1d(3))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("padding_mode, padding", [("zeros", 1), ("zeros", "same"), ("reflect", 1)])
def test_conv2d_batch_norm_relu_module(device, padding_mode, padding):
    """Conv2dBatchNormReLU.from_torch(conv, bn) against the stock conv -> bn -> relu: training steps (outputs,
    running statistics, every parameter's gradient), eval, and its state_dict is nn.Sequential(conv, bn, relu)'s."""
    dtype = torch.float64
    conv = nn.Conv2d(3, 8, 3, padding=padding, padding_mode=padding_mode).to(device, dtype)
    bn = nn.BatchNorm2d(8).to(device, dtype)
    stock = nn.Sequential(conv, bn, nn.ReLU())
    fused = tnn.Conv2dBatchNormReLU.from_torch(conv, bn)
    assert list(fused.state_dict()) == list(stock.state_dict()), "[state_dict keys]"
    for step in range(2):
        x = make_tensor((2, 3, 6, 7), dtype, device, "channels_last" if step else "contiguous")
        ys, yf = stock(x), fused(x)
        torch.testing.assert_close(yf, ys, msg=lambda m, s=step: f"[step {s}: output] {m}")
        gs = torch.autograd.grad(ys.square().sum(), list(stock.parameters()))
        gf = torch.autograd.grad(yf.square().sum(), list(fused.parameters()))
        for (name, _), a, c in zip(stock.named_parameters(), gf, gs, strict=True):
            torch.testing.assert_close(a, c, msg=lambda m, n=name, s=step: f"[step {s}: {n}.grad] {m}")
    for (name, a), c in zip(fused.state_dict().items(), stock.state_dict().values(), strict=True):
        torch.testing.assert_close(a, c, msg=lambda m, n=name: f"[{n} after training] {m}")
    stock.eval(), fused.eval()
    x = make_tensor((1, 3, 6, 7), dtype, device)
    torch.testing.assert_close(fused(x), stock(x), msg="[eval output]")
    built = tnn.Conv2dBatchNormReLU(3, 8, 3, padding=1, momentum=None, dtype=dtype)
    assert type(built.conv) is tnn.Conv2d and type(built.bn) is tnn.BatchNorm2d and built.bn.momentum is None


def test_swap_modules_swaps_batch_norm():
    """swap_modules gives every nn.BatchNorm2d and nn.BatchNorm1d torchext's class in place (same buffers), reports
    it like the others, leaves it with batch_norm=False, and the swapped model trains like the stock one."""
    torchext.nn.BatchNorm2d  # noqa: B018
    stock = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.BatchNorm1d(4)).double()
    kept = torchext.swap_modules(stock, inplace=False, batch_norm=False)
    assert ("1", "nn.BatchNorm2d", "batch_norm=False") in kept.left_stock
    report = torchext.swap_modules(stock, inplace=False, fuse=False)  # BN + ReLU fusion: tests/test_fusion.py
    model = report.model
    assert type(model[1]) is tnn.BatchNorm2d and ("1", "nn.BatchNorm2d", "torchext.nn.BatchNorm2d") in report.replaced
    assert model[1].running_mean is not stock[1].running_mean  # a copy: inplace=False
    assert type(model[3]) is tnn.BatchNorm1d and ("3", "nn.BatchNorm1d", "torchext.nn.BatchNorm1d") in report.replaced
    node = model[3](torch.randn(5, 4, dtype=torch.float64, requires_grad=True)).grad_fn.name()
    assert "torchext" in node, f"[swapped BatchNorm1d] not torchext's op: {node}"
    assert ("3", "nn.BatchNorm1d", "batch_norm=False") in kept.left_stock
    x = torch.randn(5, 3, 6, 6, dtype=torch.float64)
    head = nn.Sequential(*list(stock)[:3])
    swapped_head = nn.Sequential(*list(model)[:3])
    torch.testing.assert_close(swapped_head(x), head(x), msg="[swapped output]")
    torch.testing.assert_close(model[1].running_var, stock[1].running_var, msg="[running_var after one step]")


def test_autocast_runs_in_input_dtype():
    """As torch's batch_norm (on no autocast list): under CPU autocast the op runs in its input's dtype, float32
    parameters with a bfloat16 input."""
    x = make_tensor((2, 4, 3, 3), torch.bfloat16, "cpu")
    w, b, rm, rv = _params(4, "cpu", torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours = tf.batch_norm(x, rm.clone(), rv.clone(), w, b, True)
        theirs = F.batch_norm(x, rm.clone(), rv.clone(), w, b, True)
        ours32 = tf.batch_norm(x.float(), rm.clone(), rv.clone(), w, b, True)
    assert ours.dtype == theirs.dtype == torch.bfloat16 and ours32.dtype == torch.float32
    assert max_error(ours, theirs) <= 2 * ERROR_FLOOR[torch.bfloat16] * 4, "[autocast bf16 output vs torch's]"
