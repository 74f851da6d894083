"""torchext.conv2d against torch.nn.functional.conv2d: odd shapes (padding beyond the kernel's half, stride 2 on odd
sizes, 1x1, 7x7, dilation, groups), every input and weight layout with the layout rule of csrc/conv2d.h, empty
batches and channels, poisoned outputs, the fused ReLU, conv2d_stats, conv2d_backward for each output_mask,
gradcheck and gradgradcheck, opcheck, 'same' padding, torchext.nn.Conv2d, autocast and errors. The CPU tests use
small shapes (the file runs in seconds); the GPU tests run every version of the CUDA ladder against a float64
reference on the CPU."""

import pytest
import torch
import torch.nn.functional as F
from conftest import ERROR_FLOOR, assert_accurate, gpu, make_tensor, max_error, poison_allocator
from torch.autograd import gradcheck, gradgradcheck
from torch.library import opcheck

import torchext
import torchext.functional as tf
import torchext.nn as tnn
from torchext.ops.conv2d import CONV2D_KERNELS

ops = torch.ops.torchext

# (id, N, C, H, W, K, kH, kW, stride, padding, dilation, groups)
CASES = [
    ("3x3", 3, 3, 5, 7, 4, 3, 3, 1, 1, 1, 1),
    ("1x1", 1, 5, 5, 7, 3, 1, 1, 1, 0, 1, 1),
    ("1x1 stride 2", 3, 4, 5, 7, 6, 1, 1, 2, 0, 1, 1),
    ("pad beyond half", 1, 2, 5, 7, 3, 3, 3, 1, 3, 1, 1),
    ("stride 2 odd", 3, 3, 5, 7, 5, 3, 3, 2, 1, 1, 1),
    ("7x7 stride 2 pad 3", 1, 3, 5, 7, 4, 7, 7, 2, 3, 1, 1),
    ("dilation 2", 3, 2, 5, 7, 3, 3, 3, 1, 2, 2, 1),
    ("groups 2", 3, 6, 5, 7, 4, 3, 3, 1, 1, 1, 2),
    ("depthwise", 1, 7, 5, 7, 7, 3, 3, 2, 1, 1, 7),
    ("rectangular", 3, 1, 5, 7, 2, (3, 2), None, (2, 1), (0, 2), (1, 2), 1),
]


def case_args(case, dtype=torch.float64, device="cpu", x_layout="contiguous", w_layout="contiguous", bias=True):
    """input, weight, bias and the options of a CASES row."""
    _, n, c, h, w, k, kh, kw, stride, padding, dilation, groups = case
    kh, kw = kh if isinstance(kh, tuple) else (kh, kw)
    x = make_tensor((n, c, h, w), dtype, device, x_layout)
    wt = make_tensor((k, c // groups, kh, kw), dtype, device, w_layout)
    b = make_tensor((k,), dtype, device) if bias else None
    return x, wt, b, dict(stride=stride, padding=padding, dilation=dilation, groups=groups)


def reference(x, w, b, activation=None, **opts):
    """float64 F.conv2d on the CPU, then the activation."""
    f64 = [t.detach().cpu().double() if t is not None else None for t in (x, w, b)]
    out = F.conv2d(*f64, **opts)
    return out.relu() if activation == "relu" else out


def expected_strides(x, w, out_shape):
    """csrc/conv2d.h's rule (torch's): channels-last output iff the input or the weight suggests channels-last."""
    channels_last = x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
    channels_last = channels_last or _suggests_channels_last(x) or _suggests_channels_last(w)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    return torch.empty(out_shape, memory_format=fmt).stride()


def _suggests_channels_last(t):
    from torch._prims_common import suggest_memory_format

    return suggest_memory_format(t) == torch.channels_last


def _id(case):
    return case[0]


# --- forward ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("case", CASES, ids=_id)
def test_conv2d_matches_reference(case, dtype):
    for bias, activation in ((True, None), (False, "relu")):
        x, w, b, opts = case_args(case, dtype, bias=bias)
        ref = reference(x, w, b, activation, **opts)
        poison_allocator("cpu", ref.to(dtype))
        out = tf.conv2d(x, w, b, activation=activation, **opts)
        theirs = F.conv2d(x, w, b, **opts)
        theirs = theirs.relu() if activation else theirs
        assert out.dtype == dtype and out.shape == ref.shape
        assert_accurate(out, theirs, ref, f"conv2d {case[0]} {dtype} bias={bias} {activation}")


W_LAYOUTS = ("contiguous", "channels_last", "transposed", "strided")
X_LAYOUTS = ("contiguous", "channels_last", "transposed", "strided", "expanded", "offset")


@pytest.mark.parametrize("x_layout", X_LAYOUTS)
def test_conv2d_every_layout(x_layout):
    """Any input layout is read through its strides, with each weight layout; the output, grad_input and grad_weight
    follow the layout rule; values equal the float64 reference, forward and backward."""
    case = CASES[7]  # groups 2: strides matter per group
    for w_layout in W_LAYOUTS:
        x, w, b, opts = case_args(case, x_layout=x_layout, w_layout=w_layout)
        x, w, b = (t.requires_grad_() for t in (x, w, b))
        out = tf.conv2d(x, w, b, **opts)
        what = f"input {x_layout}, weight {w_layout}"
        assert out.stride() == expected_strides(x, w, out.shape), f"[{what}: output strides] {out.stride()}"
        ref_inputs = [t.detach().clone().requires_grad_() for t in (x, w, b)]
        ref = F.conv2d(*ref_inputs, **opts)
        torch.testing.assert_close(out, ref, msg=lambda m, what=what: f"[{what}: output] {m}")
        assert out.stride() == ref.stride(), f"[{what}: output strides {out.stride()}, torch's {ref.stride()}]"
        g = make_tensor(out.shape, torch.float64, "cpu", "transposed")
        grads = torch.autograd.grad(out, (x, w, b), g)
        ref_grads = torch.autograd.grad(ref, ref_inputs, g)
        for name, ours, theirs in zip(("input", "weight", "bias"), grads, ref_grads, strict=True):
            torch.testing.assert_close(ours, theirs, msg=lambda m, n=name, what=what: f"[{what}: {n}.grad] {m}")
        assert grads[0].stride() == expected_strides(x, w, x.shape), f"[{what}: grad_input strides] {grads[0].stride()}"
        w_fmt = torch.channels_last if _suggests_channels_last(w) else torch.contiguous_format
        assert grads[1].stride() == torch.empty(w.shape, memory_format=w_fmt).stride(), f"[{what}: grad_weight]"


@pytest.mark.parametrize("x_layout,w_layout", [("channels_last", "contiguous"), ("contiguous", "channels_last")])
def test_conv2d_frozen_weight_grad_input_layout(x_layout, w_layout):
    """With the weight frozen the autograd keeps no input (only its shape): grad_input still follows the layout rule
    of input and weight, as torch's does, with the same values."""
    x, w, b, opts = case_args(CASES[0], x_layout=x_layout, w_layout=w_layout)
    x = x.requires_grad_()
    x_ref = x.detach().clone().requires_grad_()
    out, ref = tf.conv2d(x, w, b, **opts), F.conv2d(x_ref, w, b, **opts)
    g = make_tensor(out.shape, torch.float64, "cpu")
    (gx,), (gx_ref,) = torch.autograd.grad(out, (x,), g), torch.autograd.grad(ref, (x_ref,), g)
    torch.testing.assert_close(gx, gx_ref, msg=lambda m: f"[frozen weight: grad_input] {m}")
    assert gx.stride() == gx_ref.stride() == expected_strides(x, w, x.shape), f"[grad_input strides] {gx.stride()}"


@pytest.mark.parametrize("shape", [(0, 3, 5, 7), (2, 0, 5, 7)], ids=["N=0", "C=0"])
def test_conv2d_empty_input(shape):
    """An empty batch gives an empty output and zero weight and bias gradients; no input channels give act(bias)."""
    x = make_tensor(shape, torch.float64, "cpu", requires_grad=True)
    w = make_tensor((4, shape[1], 3, 3), torch.float64, "cpu", requires_grad=True)
    b = make_tensor((4,), torch.float64, "cpu", requires_grad=True)
    out = tf.conv2d(x, w, b, padding=1, activation="relu")
    assert out.shape == (shape[0], 4, 5, 7)
    torch.testing.assert_close(out, b.relu().view(1, 4, 1, 1).expand(out.shape), msg="[empty: output]")
    gx, gw, gb = torch.autograd.grad(out.sum(), (x, w, b))
    assert gx.shape == x.shape and torch.count_nonzero(gw) == 0
    torch.testing.assert_close(gb, (b > 0).double() * shape[0] * 35, msg="[empty: bias.grad]")


def test_conv2d_no_output_channels():
    """K = 0 (torch raises): a (N, 0, P, Q) output, zero input gradient, empty weight and bias gradients."""
    x = make_tensor((2, 3, 5, 7), torch.float64, "cpu", requires_grad=True)
    w = make_tensor((0, 3, 3, 3), torch.float64, "cpu", requires_grad=True)
    out = tf.conv2d(x, w, torch.zeros(0, dtype=torch.float64), stride=2)
    assert out.shape == (2, 0, 2, 3)
    gi, gw, gb = ops.conv2d_backward(out, x, w, [2, 2], [0, 0], [1, 1], 1, [True, True, True])
    assert torch.count_nonzero(gi) == 0 and gi.shape == x.shape and gw.shape == w.shape and gb.shape == (0,)


def test_conv2d_variant_on_cpu():
    x, w, b, opts = case_args(CASES[0])
    torch.testing.assert_close(tf.conv2d(x, w, b, kernel="cpu", **opts), reference(x, w, b, **opts))
    with pytest.raises(ValueError, match="runs on CUDA tensors"):
        tf.conv2d(x, w, b, kernel="implicit_mma", **opts)
    with pytest.raises(ValueError, match="unknown variant 'fast'") as info:
        tf.conv2d(x, w, b, kernel="fast", **opts)
    # The message lists the engine's names (cuda_ops/conv2d_args.h): the Python list must be the same, in order.
    assert ", ".join(f"'{k}'" for k in CONV2D_KERNELS) + " (CUDA tensors)" in str(info.value)
    with pytest.raises(ValueError, match="activation"):
        tf.conv2d(x, w, b, activation="gelu", **opts)


@pytest.mark.parametrize("padding", ["same", "valid", (2, 1)], ids=str)
def test_functional_conv2d_padding_strings(padding):
    """'same' with odd and even effective kernel sizes (torch pads the extra row or column after the input)."""
    x = make_tensor((2, 3, 5, 7), torch.float64, "cpu")
    for kernel_size, dilation in (((3, 3), 1), ((2, 4), 1), ((2, 3), (2, 3))):
        w = make_tensor((4, 3, *kernel_size), torch.float64, "cpu")
        ours = tf.conv2d(x, w, padding=padding, dilation=dilation)
        torch.testing.assert_close(ours, F.conv2d(x, w, padding=padding, dilation=dilation))
    torch.testing.assert_close(tf.conv2d(x[0], w), F.conv2d(x[0], w), msg="[unbatched input]")
    with pytest.raises(ValueError, match="strided"):
        tf.conv2d(x, w, padding="same", stride=2)


# --- conv2d_stats and conv2d_backward ----------------------------------------------------------------------------


@pytest.mark.parametrize("x_layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_conv2d_stats(dtype, x_layout):
    x, w, b, opts = case_args(CASES[4], dtype, x_layout=x_layout)
    out, s, ss = torchext.ops.conv2d_stats(x, w, b, **opts)
    ref = reference(x, w, b, **opts)
    torch.testing.assert_close(out.double(), ref, **_tol(dtype, ref))
    assert s.dtype == dtype and ss.dtype == dtype and s.shape == (w.shape[0],)
    torch.testing.assert_close(s.double(), ref.sum((0, 2, 3)), **_tol(dtype, ref, 100), msg="[sum]")
    torch.testing.assert_close(ss.double(), (ref * ref).sum((0, 2, 3)), **_tol(dtype, ref * ref, 100), msg="[sum_sq]")


def _tol(dtype, ref, terms=1):
    scale = max(1.0, ref.abs().max().item()) * terms
    return {"rtol": 0, "atol": {torch.float64: 1e-12, torch.float32: 1e-5}[dtype] * scale}


@pytest.mark.parametrize("mask", [(True, True, True), (True, False, False), (False, True, False), (False, False, True),
                                  (False, False, False)], ids=str)  # fmt: skip
def test_conv2d_backward_output_mask(mask):
    """Each result that output_mask asks for equals torch's gradient; the others are empty."""
    x, w, _, opts = case_args(CASES[5])
    g = make_tensor(reference(x, w, None, **opts).shape, torch.float64, "cpu", "channels_last")
    p = [opts[k] if isinstance(opts[k], tuple) else (opts[k], opts[k]) for k in ("stride", "padding", "dilation")]
    got = ops.conv2d_backward(g, x, w, *p, opts["groups"], list(mask))
    x_ref, w_ref = x.clone().requires_grad_(), w.clone().requires_grad_()
    b_ref = torch.zeros(w.shape[0], dtype=torch.float64, requires_grad=True)
    expected = torch.autograd.grad(F.conv2d(x_ref, w_ref, b_ref, **opts), (x_ref, w_ref, b_ref), g)
    for name, wanted, ours, theirs in zip(("grad_input", "grad_weight", "grad_bias"), mask, got, expected, strict=True):
        if wanted:
            torch.testing.assert_close(ours, theirs, msg=lambda m, n=name: f"[{n}] {m}")
        else:
            assert ours.numel() == 0, f"[{name}] not asked for, got shape {tuple(ours.shape)}"


def test_conv2d_large_batch_spans_chunks():
    """A batch whose patch matrices exceed one workspace chunk (csrc/conv2d_cpu.cpp: 16 MB, 45 of these images in
    float64): the weight gradient adds the chunks' GEMMs, the input gradient and the output are written chunk by
    chunk."""
    x = make_tensor((50, 16, 18, 18), torch.float64, "cpu", "channels_last", requires_grad=True)
    w = make_tensor((8, 16, 3, 3), torch.float64, "cpu", requires_grad=True)
    out = tf.conv2d(x, w, padding=1)
    x_ref, w_ref = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    ref = F.conv2d(x_ref, w_ref, padding=1)
    torch.testing.assert_close(out, ref, msg="[chunked output]")
    g = make_tensor(out.shape, torch.float64, "cpu")
    for name, ours, theirs in zip(("input", "weight"), torch.autograd.grad(out, (x, w), g),
                                  torch.autograd.grad(ref, (x_ref, w_ref), g), strict=True):  # fmt: skip
        torch.testing.assert_close(ours, theirs, msg=lambda m, n=name: f"[chunked {n}.grad] {m}")


# --- gradients -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", [CASES[0], CASES[4], CASES[6], CASES[7]], ids=_id)
def test_conv2d_gradcheck_gradgradcheck(case):
    x, w, b, opts = case_args(case)
    x, w, b = (t[:2].clone().requires_grad_() if t is x else t.requires_grad_() for t in (x, w, b))

    def conv(x, w, b):
        return tf.conv2d(x, w, b, activation="relu", **opts)

    def stats(x, w, b):
        out, s, ss = torchext.ops.conv2d_stats(x, w, b, **opts)
        return out.sin(), s, ss * 0.1

    for name, fn in (("conv2d relu", conv), ("conv2d_stats", stats)):
        assert gradcheck(fn, (x, w, b)), f"[gradcheck {name} {case[0]}]"
        assert gradgradcheck(fn, (x, w, b)), f"[gradgradcheck {name} {case[0]}]"


def test_conv2d_third_derivative():
    """conv2d_backward's double backward is itself differentiable (it calls conv2d and conv2d_backward)."""
    x, w, _, opts = case_args(CASES[7])
    x, w = x[:1].clone().requires_grad_(), w.requires_grad_()

    def grad_norm(x, w):
        out = tf.conv2d(x, w, **opts)
        gx, gw = torch.autograd.grad((out**2).sum(), (x, w), create_graph=True)
        return (gx**2).sum() + (gw * w).sum()

    assert gradgradcheck(grad_norm, (x, w)), "[third derivative of conv2d]"


def test_opcheck():
    for case in (CASES[0], CASES[7]):
        x, w, b, opts = case_args(case, torch.float32)
        p = [opts[k] if isinstance(opts[k], tuple) else (opts[k],) * 2 for k in ("stride", "padding", "dilation")]
        x, w, b = (t.requires_grad_() for t in (x, w, b))
        opcheck(ops.conv2d.default, (x, w, b, *p, opts["groups"], "relu", None))
        opcheck(ops.conv2d_stats.default, (x, w, b, *p, opts["groups"], None))
        g = make_tensor(reference(x, w, b, **opts).shape, torch.float32, "cpu")
        opcheck(ops.conv2d_backward.default, (g, x.detach(), w.detach(), *p, opts["groups"], [True, True, True], None))


def test_conv2d_cpu_autocast_runs_float32():
    x, w, b, opts = case_args(CASES[0], torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = tf.conv2d(x, w, b, **opts)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, F.conv2d(x, w, b, **opts), rtol=1e-5, atol=1e-5)


# --- modules ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("padding_mode", ["zeros", "reflect", "circular"])
def test_nn_conv2d_matches_torch(padding_mode):
    """Same parameters, initialisation (same seed), state_dict, repr and output as torch.nn.Conv2d, both ways."""
    kwargs = dict(stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2, padding_mode=padding_mode)
    torch.manual_seed(1)
    stock = torch.nn.Conv2d(4, 6, (3, 2), **kwargs, dtype=torch.float64)
    torch.manual_seed(1)
    ours = tnn.Conv2d(4, 6, (3, 2), **kwargs, dtype=torch.float64)
    for key, value in stock.state_dict().items():
        assert torch.equal(ours.state_dict()[key], value), f"[{key}: initialisation]"
    assert repr(ours) == repr(stock)
    x = make_tensor((2, 4, 6, 7), torch.float64, "cpu", "channels_last")
    torch.testing.assert_close(ours(x), stock(x), msg="[nn.Conv2d output]")
    back = torch.nn.Conv2d(4, 6, (3, 2), **kwargs, dtype=torch.float64)
    back.load_state_dict(ours.state_dict())
    torch.testing.assert_close(back(x), ours(x), msg="[state_dict round trip]")
    relu = tnn.Conv2d.from_torch(stock, activation="relu")
    assert "activation='relu'" in repr(relu)
    torch.testing.assert_close(relu(x), stock(x).relu(), msg="[from_torch, relu]")
    same = tnn.Conv2d(4, 6, 4, padding="same", padding_mode=padding_mode, dtype=torch.float64)
    stock_same = torch.nn.Conv2d(4, 6, 4, padding="same", padding_mode=padding_mode, dtype=torch.float64)
    stock_same.load_state_dict(same.state_dict())
    torch.testing.assert_close(same(x), stock_same(x), msg="[padding='same', even kernel]")


def test_swap_modules_small_cnn():
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(4, 4, 1, bias=False),
        type("MyConv", (torch.nn.Conv2d,), {})(4, 2, 1),
    ).double()  # fmt: skip
    x = make_tensor((2, 3, 5, 7), torch.float64, "cpu")
    expected = model(x)
    weight = model[0].weight
    report = torchext.swap_modules(model)
    assert type(model[0]) is tnn.Conv2d and type(model[2]) is tnn.Conv2d and model[0].weight is weight
    assert ("0", "nn.Conv2d", "torchext.nn.Conv2d(activation='relu')") in report.replaced  # the ReLU fused
    assert ("2", "nn.Conv2d", "torchext.nn.Conv2d") in report.replaced
    assert any(s.name == "3" and "subclass of nn.Conv2d" in s.reason for s in report.left_stock), str(report)
    torch.testing.assert_close(model(x), expected, msg="[swapped small CNN output]")


def test_swap_modules_resnet18_cifar_reports_convs():
    model = torchext.models.resnet18_cifar()
    report = torchext.swap_modules(model)
    assert report.counts["replaced_by_class"]["nn.Conv2d"] == 20, str(report)
    assert sum(type(m) is tnn.Conv2d for m in model.modules()) == 20


# --- GPU: every version of the ladder --------------------------------------------------------------------------

GPU_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def run_variant(variant, *args, **kwargs):
    """tf.conv2d with kernel=variant; a named version may refuse arguments it does not support (ValueError saying
    so), never the default."""
    try:
        return tf.conv2d(*args, kernel=variant, **kwargs)
    except ValueError as e:
        if variant is None or "does not support" not in str(e):
            raise
        pytest.skip(f"{variant}: {e}")


@gpu
@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=str)
@pytest.mark.parametrize("variant", (*CONV2D_KERNELS, None), ids=str)
@pytest.mark.parametrize("case", CASES, ids=_id)
@pytest.mark.parametrize("x_layout", ["contiguous", "channels_last"])
def test_conv2d_cuda_variants(case, variant, dtype, x_layout, monkeypatch):
    """Forward (bias + relu) and backward of each version against float64 on the CPU: error at most four times
    torch's own in that dtype (half-precision accumulation included), or under the dtype's floor. float32 runs with
    tf32 off for cuDNN and torchext alike (cuDNN picks tf32 or not per shape when allowed, so the two errors are
    only comparable without it; test_conv2d_cuda_tf32 covers tf32). A named version may refuse a backward pass it
    does not support (the ValueError says so); the default never does."""
    if dtype == torch.float32:
        monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    x, w, b, opts = case_args(case, dtype, "cuda", x_layout=x_layout, w_layout=x_layout)
    x, w, b = (t.requires_grad_() for t in (x, w, b))
    poison_allocator("cuda", torch.empty(reference(x, w, b, **opts).shape, dtype=dtype, device="cuda"))
    out = run_variant(variant, x, w, b, activation="relu", **opts)
    assert out.stride() == expected_strides(x, w, out.shape), f"[{variant} output strides]"
    x64, w64, b64 = (t.detach().cpu().double().requires_grad_() for t in (x, w, b))
    ref = F.conv2d(x64, w64, b64, **opts).relu()
    theirs = F.conv2d(x, w, b, **opts).relu()
    assert_accurate(out, theirs, ref, f"{variant} {dtype} {case[0]} output", factor=4)
    g = torch.randn(out.shape, dtype=dtype, device="cuda")
    try:
        ours = torch.autograd.grad(out, (x, w, b), g)
    except ValueError as e:
        if variant is None or "does not support" not in str(e):
            raise
        pytest.skip(f"{variant} backward: {e}")
    expected = torch.autograd.grad(ref, (x64, w64, b64), g.cpu().double())
    torch_grads = torch.autograd.grad(theirs, (x, w, b), g)
    for name, o, e, t in zip(("input", "weight", "bias"), ours, expected, torch_grads, strict=True):
        assert_accurate(o, t, e, f"{variant} {dtype} {case[0]} {name}.grad", factor=4)


@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("x_layout,w_layout", [("contiguous", "channels_last"), ("channels_last", "contiguous")])
def test_conv2d_cuda_mixed_layouts(x_layout, w_layout, dtype, monkeypatch):
    """Input and weight in different layouts on CUDA (the default version): the output and grad_input are
    channels-last, as torch's are (its rule: either operand), grad_weight keeps the weight's layout; values within
    four times torch's own error of the float64 reference (float32 without tf32, as in test_conv2d_cuda_variants)."""
    if dtype == torch.float32:
        monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    x, w, b, opts = case_args(CASES[0], dtype, "cuda", x_layout=x_layout, w_layout=w_layout)
    x, w, b = (t.requires_grad_() for t in (x, w, b))
    out = tf.conv2d(x, w, b, **opts)
    theirs = F.conv2d(x, w, b, **opts)
    assert out.stride() == theirs.stride() == expected_strides(x, w, out.shape), f"[output strides] {out.stride()}"
    x64, w64, b64 = (t.detach().cpu().double().requires_grad_() for t in (x, w, b))
    ref = F.conv2d(x64, w64, b64, **opts)
    assert_accurate(out, theirs, ref, f"mixed layouts {x_layout}/{w_layout} {dtype} output", factor=4)
    g = torch.randn(out.shape, dtype=dtype, device="cuda")
    ours, torch_grads = torch.autograd.grad(out, (x, w, b), g), torch.autograd.grad(theirs, (x, w, b), g)
    expected = torch.autograd.grad(ref, (x64, w64, b64), g.cpu().double())
    assert ours[0].stride() == expected_strides(x, w, x.shape), f"[grad_input strides] {ours[0].stride()}"
    assert ours[1].stride() == w.stride(), f"[grad_weight strides] {ours[1].stride()}"
    for name, o, e, t in zip(("input", "weight", "bias"), ours, expected, torch_grads, strict=True):
        assert_accurate(o, t, e, f"mixed layouts {x_layout}/{w_layout} {dtype} {name}.grad", factor=4)


@gpu
@pytest.mark.parametrize("allow", [True, False])
def test_conv2d_cuda_tf32(allow, monkeypatch):
    """float32 runs on the tensor cores as tf32 exactly when torch allows tf32 for cuDNN's convolutions: then the
    error is tf32's (about 2^-11 of the output's scale) and implicit_mma runs it; otherwise implicit_mma refuses and
    the default is float32-accurate."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", allow)
    x = torch.randn(4, 32, 16, 16, device="cuda").contiguous(memory_format=torch.channels_last)
    w = torch.randn(64, 32, 3, 3, device="cuda").contiguous(memory_format=torch.channels_last)
    ref = F.conv2d(x.double(), w.double(), padding=1)
    scale = ref.abs().max().item()
    out = tf.conv2d(x, w, padding=1)
    err = (out.double() - ref).abs().max().item() / scale
    if allow:
        assert 1e-6 < err < 2e-3, f"tf32 error {err:.2e}"
        named = tf.conv2d(x, w, padding=1, kernel="implicit_mma")
        assert torch.equal(named, out)
    else:
        assert err < 1e-5, f"float32 error {err:.2e}"
        with pytest.raises(ValueError, match="does not support.*tf32"):
            tf.conv2d(x, w, padding=1, kernel="implicit_mma")


@gpu
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32), ids=str)
@pytest.mark.parametrize("variant", (*CONV2D_KERNELS, None), ids=str)
def test_conv2d_stats_cuda(variant, dtype, monkeypatch):
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)  # float32: implicit_simt is the default
    x, w, b, opts = case_args(CASES[4], dtype, "cuda", x_layout="channels_last")
    try:
        out, s, ss = torchext.ops.conv2d_stats(x, w, b, kernel=variant, **opts)
    except ValueError as e:
        if variant is None or "does not support" not in str(e):
            raise
        pytest.skip(f"{variant}: {e}")
    assert s.dtype == torch.float32 and ss.dtype == torch.float32
    stored = out.double().cpu()
    torch.testing.assert_close(s.double().cpu(), stored.sum((0, 2, 3)), rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(ss.double().cpu(), (stored * stored).sum((0, 2, 3)), rtol=1e-4, atol=1e-3)


@gpu
def test_conv2d_cuda_empty_and_autocast_and_devices():
    x = torch.randn(0, 3, 5, 7, device="cuda")
    w = torch.randn(4, 3, 3, 3, device="cuda")
    assert tf.conv2d(x, w, padding=1).shape == (0, 4, 5, 7)
    x = torch.randn(2, 3, 5, 7, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = tf.conv2d(x, w, torch.randn(4, device="cuda"))
    assert out.dtype == torch.bfloat16
    with pytest.raises(RuntimeError, match="`weight`.*same device"):
        tf.conv2d(x, w.cpu())
    err = max_error(tf.conv2d(x.double(), w.double()), F.conv2d(x.double(), w.double()))
    assert err <= ERROR_FLOOR[torch.float64] * 100, f"[float64 default kernel] {err}"
