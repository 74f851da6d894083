"""torchext's max_pool2d, avg_pool2d and adaptive_avg_pool2d against torch.nn.functional: odd shapes (batch 1 and 3,
C = 1 and 3, 5x7 images, H = W = 1), ceil_mode with a window that would start in the padding and one that hangs
over the edge, stride != kernel, dilation, a window entirely in the padding; every layout (contiguous, channels-last,
transposed, sliced, expanded, offset) with csrc/pooling.h's layout rule; unbatched and empty inputs; NaN and inf;
poisoned outputs; every dtype on each device against a float64 reference; the backward ops (deterministic gathers)
for overlapping windows; gradcheck and gradgradcheck; the modules. The CUDA variants run the same tests with a GPU,
plus the vectorized channels-last paths (C a multiple of the vector width or not, misaligned views) and a tensor of
more than 2^31 elements."""

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_accurate, device_params, gpu, make_tensor, poison_allocator
from torch import nn
from torch.autograd import gradcheck, gradgradcheck

import torchext.functional as tf
import torchext.nn as tnn

ops = torch.ops.torchext

HALF = (torch.float16, torch.bfloat16)
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)

# (id, shape, kernel_size, stride, padding, dilation, ceil_mode)
MAX_CASES = [
    ("3x3 s2 p1", (3, 3, 5, 7), 3, 2, 1, 1, False),
    ("N1 C1 2x2", (1, 1, 5, 7), 2, None, 0, 1, False),
    ("ceil, last window would start in padding", (1, 3, 5, 5), 2, 2, 1, 1, True),
    ("ceil, last window hangs over", (3, 1, 5, 7), 2, 2, 0, 1, True),
    ("stride != kernel", (3, 3, 5, 7), (3, 2), (1, 2), (1, 0), 1, False),
    ("dilation", (3, 3, 5, 7), 3, 1, 1, 2, True),
    ("rectangular dilation ceil", (1, 3, 7, 5), (2, 3), (3, 2), (1, 1), (2, 1), True),
    ("H=W=1 padded", (3, 3, 1, 1), 2, 1, 1, 1, False),
    ("global", (3, 3, 5, 7), (5, 7), None, 0, 1, False),
]

# (id, shape, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
AVG_CASES = [
    ("3x3 s2 p1", (3, 3, 5, 7), 3, 2, 1, False, True, None),
    ("3x3 s2 p1 exclude pad", (3, 3, 5, 7), 3, 2, 1, False, False, None),
    ("2x2", (1, 1, 5, 7), 2, None, 0, False, True, None),
    ("ceil, last window would start in padding", (1, 3, 5, 5), 2, 2, 1, True, True, None),
    ("ceil hangs over, include pad", (3, 1, 5, 7), 3, 2, 1, True, True, None),
    ("ceil hangs over, exclude pad", (3, 1, 5, 7), 3, 2, 1, True, False, None),
    ("stride != kernel", (3, 3, 5, 7), (3, 2), (1, 2), (1, 0), False, True, None),
    ("divisor_override", (3, 3, 5, 7), 3, 2, 1, True, False, 5),
    ("H=W=1 padded", (3, 3, 1, 1), 2, 1, 1, False, False, None),
]

# (id, shape, output_size)
ADAPTIVE_CASES = [
    ("global", (3, 3, 5, 7), 1),
    ("2x3", (3, 3, 5, 7), (2, 3)),
    ("identity", (1, 1, 5, 7), (5, 7)),
    ("upsampling, overlapping windows", (3, 3, 5, 7), (4, 9)),
    ("None keeps width", (1, 3, 5, 7), (3, None)),
    ("H=W=1 to 3x2", (3, 3, 1, 1), (3, 2)),
]

LAYOUTS = ("contiguous", "channels_last", "transposed", "strided", "expanded", "offset")


def _id(case):
    return case[0]


def device_dtypes():
    """Every (device, dtype): the pools implement all four float dtypes on CPU and CUDA."""
    return [
        pytest.param(device.values[0], dtype, id=f"{device.id}-{str(dtype)[6:]}", marks=device.marks)
        for device in device_params()
        for dtype in DTYPES
    ]


def distinct(shape, dtype, device, layout="contiguous", requires_grad=False):
    """Values without ties in any dtype (a permutation of multiples of 1/8, exact in bfloat16 at these sizes), in
    `layout`: the argmax is the same in every dtype, and gradcheck's perturbations never move it."""
    n = math.prod(shape)
    values = ((torch.randperm(n, dtype=torch.float64) - n // 2) / 8).view(shape)
    if layout == "expanded":  # one image repeated along the batch: no tie within a plane
        t = values[:1].to(device, dtype).expand(shape)
    else:
        t = make_tensor(shape, dtype, device, layout)
        with torch.no_grad():
            t.copy_(values)
    return t.requires_grad_(requires_grad)


def expected_format(x):
    """csrc/pooling.h's rule: channels-last iff a 4-D input suggests it."""
    if x.dim() != 4:
        return torch.contiguous_format
    from torch._prims_common import suggest_memory_format

    return torch.channels_last if suggest_memory_format(x) == torch.channels_last else torch.contiguous_format


def assert_layout(t, like, shape, what):
    expected = torch.empty(shape, memory_format=expected_format(like)).stride()
    assert t.stride() == expected, f"[{what} strides] {t.stride()} != {expected}"


def max_opts(case):
    _, shape, k, s, p, d, c = case
    return shape, dict(kernel_size=k, stride=s, padding=p, dilation=d, ceil_mode=c)


def avg_opts(case):
    _, shape, k, s, p, c, cip, div = case
    return shape, dict(kernel_size=k, stride=s, padding=p, ceil_mode=c, count_include_pad=cip, divisor_override=div)


def unpool_grad(g, indices, input_shape):
    """The exact max_pool2d gradient for these indices, in float64: g added at each index within its plane."""
    lead, hw = input_shape[:-2], input_shape[-2] * input_shape[-1]
    flat = torch.zeros(*lead, hw, dtype=torch.float64)
    return flat.scatter_add_(-1, indices.cpu().flatten(-2), g.detach().cpu().double().flatten(-2)).view(input_shape)


# Relative tolerance of a gradient summed in float32 (float64 for float64) and rounded once to its dtype.
GRAD_RTOL = {torch.float64: 1e-12, torch.float32: 1e-6, torch.float16: 2**-10, torch.bfloat16: 2**-7}


# --- max_pool2d ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("device, dtype", device_dtypes())
@pytest.mark.parametrize("case", MAX_CASES, ids=_id)
def test_max_pool2d_matches_torch(case, device, dtype):
    """Values and indices equal torch's exactly (a max is exact in every dtype, ties taken first); the gradient is
    the float64 sum of grad_output at the indices (overlapping windows add), within one rounding."""
    shape, opts = max_opts(case)
    x = make_tensor(shape, dtype, device, requires_grad=True)
    ref, ref_idx = F.max_pool2d(x.detach().cpu().double(), **opts, return_indices=True)
    poison_allocator(device, ref.to(dtype))
    out, idx = tf.max_pool2d(x, **opts, return_indices=True)
    theirs, their_idx = F.max_pool2d(x.detach(), **opts, return_indices=True)
    what = f"max_pool2d {case[0]} {device} {dtype}"
    assert out.dtype == dtype and idx.dtype == torch.int64 and out.shape == ref.shape, what
    torch.testing.assert_close(out, theirs, rtol=0, atol=0, msg=lambda m: f"[{what}: output] {m}")
    torch.testing.assert_close(idx, their_idx, rtol=0, atol=0, msg=lambda m: f"[{what}: indices] {m}")
    if dtype == torch.float64:
        torch.testing.assert_close(idx.cpu(), ref_idx, rtol=0, atol=0, msg=lambda m: f"[{what}: float64 indices] {m}")
    g = make_tensor(out.shape, dtype, device, "channels_last" if out.dim() == 4 else "contiguous")
    (grad,) = torch.autograd.grad(out, x, g)
    expected = unpool_grad(g, idx, x.shape)
    torch.testing.assert_close(grad.cpu().double(), expected, rtol=GRAD_RTOL[dtype], atol=1e-12,
                               msg=lambda m: f"[{what}: input.grad] {m}")  # fmt: skip
    assert_layout(grad, x, x.shape, f"{what}: input.grad")


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("layout", LAYOUTS)
def test_max_pool2d_every_layout(layout, device):
    """Any input layout is read through its strides; output, indices and grad_input follow the layout rule."""
    shape, opts = max_opts(MAX_CASES[0])
    x = distinct(shape, torch.float64, device, layout, requires_grad=True)
    out, idx = tf.max_pool2d(x, **opts, return_indices=True)
    ref, ref_idx = F.max_pool2d(x.detach().cpu(), **opts, return_indices=True)
    what = f"max_pool2d input {layout} {device}"
    torch.testing.assert_close(out.cpu(), ref, rtol=0, atol=0, msg=lambda m: f"[{what}: output] {m}")
    if layout != "expanded":  # an expanded input has ties across the batch: torch's first is ours too, checked above
        torch.testing.assert_close(idx.cpu(), ref_idx, rtol=0, atol=0, msg=lambda m: f"[{what}: indices] {m}")
    assert_layout(out, x, out.shape, f"{what}: output")
    assert_layout(idx, x, idx.shape, f"{what}: indices")
    for g_layout in ("contiguous", "channels_last", "strided"):
        g = make_tensor(out.shape, torch.float64, device, g_layout)
        (grad,) = torch.autograd.grad(out, x, g, retain_graph=True)
        torch.testing.assert_close(grad.cpu(), unpool_grad(g, idx, x.shape), msg=lambda m: f"[{what}: grad] {m}")
        assert_layout(grad, x, x.shape, f"{what}, grad_output {g_layout}: input.grad")


@pytest.mark.parametrize("device", device_params())
def test_max_pool2d_nan_inf_and_ties(device):
    """NaN wins (the last NaN of a window), the first of equal maxima, -inf windows keep their first position, and
    a window entirely in the padding gives -inf with torch's index (past the plane); all as torch's CPU kernel (on
    CUDA, torch's channels-last kernel gives index 0 to an all -inf window: docs/differences.md)."""
    nan, inf = float("nan"), float("inf")
    rows = torch.tensor([[1.0, nan, 3.0, nan, 2.0, 2.0, -inf, -inf], [5.0, 5.0, -1.0, nan, inf, 0.0, -inf, 4.0]])
    x = rows.view(1, 1, 2, 8).repeat(2, 8, 1, 1)  # 8 channels: the vectorized channels-last CUDA path for every dtype
    for fmt in (torch.contiguous_format, torch.channels_last):
        for opts in (dict(kernel_size=2), dict(kernel_size=(2, 3), stride=1, padding=(1, 1)), dict(kernel_size=(1, 4))):
            xs = x.to(device).contiguous(memory_format=fmt)
            out, idx = tf.max_pool2d(xs, **opts, return_indices=True)
            ref, ref_idx = F.max_pool2d(x, **opts, return_indices=True)
            what = f"{opts} {fmt}"
            torch.testing.assert_close(out.cpu(), ref, rtol=0, atol=0, equal_nan=True,
                                       msg=lambda m, w=what: f"[{w}] {m}")  # fmt: skip
            torch.testing.assert_close(idx.cpu(), ref_idx, rtol=0, atol=0, msg=lambda m, w=what: f"[{w} indices] {m}")
    x = torch.randn(1, 2, 4, 4, device=device, requires_grad=True)
    out, idx = tf.max_pool2d(x, 2, 1, 1, 5, return_indices=True)  # span 6 over 4 + 2 padding: taps -1 and 4
    ref, ref_idx = F.max_pool2d(x.detach().cpu(), 2, 1, 1, 5, return_indices=True)
    assert out.isneginf().all() and torch.equal(idx.cpu(), ref_idx), f"[all-padding window] {out}, {idx}"
    (grad,) = torch.autograd.grad(out.sum(), x)
    assert torch.count_nonzero(grad) == 0, "[all-padding window: input.grad]"


# --- avg_pool2d and adaptive_avg_pool2d ------------------------------------------------------------------------


def _check_average(what, ours_fn, torch_fn, x):
    """ours against torch and a float64 reference, forward and backward (tests/conftest.py's accuracy rule)."""
    x64 = x.detach().cpu().double().requires_grad_()
    ref = torch_fn(x64)
    poison_allocator(x.device, ref.to(x.dtype))
    out = ours_fn(x)
    theirs = torch_fn(x.detach())
    assert out.shape == ref.shape and out.dtype == x.dtype, f"[{what}] {out.shape} {out.dtype}"
    assert_accurate(out, theirs, ref, f"{what}: output")
    assert_layout(out, x, out.shape, f"{what}: output")
    if out.numel() == 0:
        return
    g = make_tensor(out.shape, x.dtype, x.device, "channels_last" if out.dim() == 4 else "contiguous")
    (grad,) = torch.autograd.grad(out, x, g)
    (grad_ref,) = torch.autograd.grad(ref, x64, g.cpu().double())
    x_t = x.detach().requires_grad_()
    (grad_theirs,) = torch.autograd.grad(torch_fn(x_t), x_t, g)
    assert_accurate(grad, grad_theirs, grad_ref, f"{what}: input.grad")
    assert_layout(grad, x, x.shape, f"{what}: input.grad")


@pytest.mark.parametrize("device, dtype", device_dtypes())
@pytest.mark.parametrize("case", AVG_CASES, ids=_id)
def test_avg_pool2d_matches_torch(case, device, dtype):
    shape, opts = avg_opts(case)
    x = make_tensor(shape, dtype, device, requires_grad=True)
    _check_average(f"avg_pool2d {case[0]} {device} {dtype}", lambda t: tf.avg_pool2d(t, **opts),
                   lambda t: F.avg_pool2d(t, **opts), x)  # fmt: skip


@pytest.mark.parametrize("device, dtype", device_dtypes())
@pytest.mark.parametrize("case", ADAPTIVE_CASES, ids=_id)
def test_adaptive_avg_pool2d_matches_torch(case, device, dtype):
    _, shape, size = case
    x = make_tensor(shape, dtype, device, requires_grad=True)
    _check_average(f"adaptive_avg_pool2d {case[0]} {device} {dtype}", lambda t: tf.adaptive_avg_pool2d(t, size),
                   lambda t: F.adaptive_avg_pool2d(t, size), x)  # fmt: skip


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("layout", LAYOUTS)
def test_averages_every_layout(layout, device):
    for what, ours, theirs in (
        (
            "avg_pool2d",
            lambda t: tf.avg_pool2d(t, 3, 2, 1, True, False),
            lambda t: F.avg_pool2d(t, 3, 2, 1, True, False),
        ),
        ("adaptive global", lambda t: tf.adaptive_avg_pool2d(t, 1), lambda t: F.adaptive_avg_pool2d(t, 1)),
        ("adaptive 4x9", lambda t: tf.adaptive_avg_pool2d(t, (4, 9)), lambda t: F.adaptive_avg_pool2d(t, (4, 9))),
    ):
        x = make_tensor((3, 3, 5, 7), torch.float64, device, layout, requires_grad=True)
        _check_average(f"{what} input {layout} {device}", ours, theirs, x)


# --- every op: unbatched, empty, errors ------------------------------------------------------------------------

POOLS = {
    "max_pool2d": (lambda t: tf.max_pool2d(t, 3, 2, 1, ceil_mode=True),
                   lambda t: F.max_pool2d(t, 3, 2, 1, ceil_mode=True)),
    "avg_pool2d": (lambda t: tf.avg_pool2d(t, 2, 1, 1, count_include_pad=False),
                   lambda t: F.avg_pool2d(t, 2, 1, 1, count_include_pad=False)),
    "adaptive_avg_pool2d": (lambda t: tf.adaptive_avg_pool2d(t, (2, 3)), lambda t: F.adaptive_avg_pool2d(t, (2, 3))),
}  # fmt: skip


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("name", POOLS)
def test_unbatched_input(name, device):
    """(C, H, W) input gives (C, OH, OW) contiguous results, whatever the input's strides, and its gradient."""
    ours, theirs = POOLS[name]
    for x in (distinct((3, 5, 7), torch.float64, device), distinct((5, 7, 3), torch.float64, device).permute(2, 0, 1)):
        x.requires_grad_()
        out = ours(x)
        ref = theirs(x.detach().cpu())
        torch.testing.assert_close(out.cpu(), ref, msg=lambda m: f"[{name} unbatched] {m}")
        assert out.is_contiguous(), f"[{name} unbatched output strides] {out.stride()}"
        g = torch.randn_like(out)
        (grad,) = torch.autograd.grad(out, x, g)
        x_ref = x.detach().cpu().requires_grad_()
        (grad_ref,) = torch.autograd.grad(theirs(x_ref), x_ref, g.cpu())
        torch.testing.assert_close(grad.cpu(), grad_ref, msg=lambda m: f"[{name} unbatched input.grad] {m}")
        assert grad.is_contiguous(), f"[{name} unbatched grad strides] {grad.stride()}"


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("name", POOLS)
def test_empty_batch(name, device):
    ours, theirs = POOLS[name]
    for fmt in (torch.contiguous_format, torch.channels_last):
        x = torch.randn(0, 3, 5, 7, device=device).contiguous(memory_format=fmt).requires_grad_()
        out = ours(x)
        assert out.shape == theirs(x.detach().cpu()).shape, f"[{name} empty batch] {out.shape}"
        (grad,) = torch.autograd.grad(out.sum(), x)
        assert grad.shape == x.shape, f"[{name} empty batch: grad] {grad.shape}"


@pytest.mark.parametrize("device", device_params())
def test_adaptive_avg_pool2d_empty_output_and_channels(device):
    """output_size 0 (allowed, as torch) gives an empty output and a zero gradient; C = 0 an empty output."""
    x = torch.randn(2, 3, 5, 7, device=device, requires_grad=True)
    out = tf.adaptive_avg_pool2d(x, (0, 3))
    assert out.shape == (2, 3, 0, 3)
    (grad,) = torch.autograd.grad(out.sum(), x)
    assert grad.shape == x.shape and torch.count_nonzero(grad) == 0, "[output_size 0: input.grad]"
    assert tf.adaptive_avg_pool2d(torch.randn(2, 0, 5, 7, device=device), 2).shape == (2, 0, 2, 2)


def test_errors_name_the_argument():
    x = torch.randn(2, 3, 5, 7)
    cases = [
        (lambda: tf.max_pool2d(x, 0), ValueError, "`kernel_size` must be at least 1"),
        (lambda: tf.max_pool2d(x, 3, 0), ValueError, "`stride` must be at least 1"),
        (lambda: tf.max_pool2d(x, 3, 1, 2), ValueError, "`padding` must be at most half"),
        (lambda: tf.max_pool2d(x, 3, 1, -1), ValueError, "`padding` must be non-negative"),
        (lambda: tf.max_pool2d(x, 3, 1, 1, 0), ValueError, "`dilation` must be at least 1"),
        (lambda: tf.max_pool2d(x, 6), ValueError, "output would be empty"),
        (lambda: tf.max_pool2d(x[0, 0], 2), ValueError, "`input` must be 4-D"),
        (lambda: tf.max_pool2d(x[:, :0], 2), ValueError, "non-empty channels"),
        (lambda: tf.max_pool2d(x.long(), 2), TypeError, "`input` must be float32"),
        (lambda: tf.max_pool2d(x, (2, 2, 2)), TypeError, "`kernel_size`"),
        (lambda: tf.max_pool2d([1.0], 2), TypeError, "`input`"),
        (lambda: tf.avg_pool2d(x, 3, divisor_override=0), ValueError, "`divisor_override` must not be 0"),
        (lambda: tf.avg_pool2d(x, 3, 1, 2), ValueError, "`padding`"),
        (lambda: tf.adaptive_avg_pool2d(x, -1), ValueError, "`output_size` must be non-negative"),
        (lambda: tf.adaptive_avg_pool2d(x, "a"), TypeError, "`output_size`"),
        (lambda: tf.adaptive_avg_pool2d(x[:, :, :0], 2), ValueError, "non-empty height and width"),
    ]
    for call, exc, words in cases:
        with pytest.raises(exc, match=words):
            call()


def test_backward_ops_check_grad_output_and_indices():
    x = torch.randn(2, 3, 5, 7)
    out, idx = ops.max_pool2d(x, [2, 2], [2, 2], [0, 0], [1, 1], False)
    with pytest.raises(ValueError, match="`grad_output` must have shape"):
        ops.max_pool2d_backward(out[:, :2], x, [2, 2], [2, 2], [0, 0], [1, 1], False, idx)
    with pytest.raises(TypeError, match="`indices` must be int64"):
        ops.max_pool2d_backward(out, x, [2, 2], [2, 2], [0, 0], [1, 1], False, idx.int())
    with pytest.raises(TypeError, match="`grad_output` must have the same dtype"):
        ops.avg_pool2d_backward(out.double(), x, [2, 2], [2, 2], [0, 0], False, True, None)
    with pytest.raises(ValueError, match="`grad_output` must have shape"):
        ops.adaptive_avg_pool2d_backward(torch.randn(2, 4, 1, 1), x)


# --- gradients -------------------------------------------------------------------------------------------------

GRAD_FNS = {
    "max 3x3 s2 ceil": lambda t: tf.max_pool2d(t, 3, 2, 1, ceil_mode=True),
    "max dilation": lambda t: tf.max_pool2d(t, (2, 3), 1, 1, (2, 1)),
    "avg ceil exclude pad": lambda t: tf.avg_pool2d(t, 3, 2, 1, True, False),
    "avg divisor_override": lambda t: tf.avg_pool2d(t, (2, 3), 1, (1, 0), False, True, 4),
    "adaptive 4x9": lambda t: tf.adaptive_avg_pool2d(t, (4, 9)),
    "adaptive global": lambda t: tf.adaptive_avg_pool2d(t, 1),
}


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("name", GRAD_FNS)
def test_gradcheck_gradgradcheck(name, layout):
    x = distinct((2, 3, 5, 7), torch.float64, "cpu", layout, requires_grad=True)
    assert gradcheck(GRAD_FNS[name], (x,)), f"[gradcheck {name} {layout}]"
    assert gradgradcheck(GRAD_FNS[name], (x,)), f"[gradgradcheck {name} {layout}]"


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("name", GRAD_FNS)
def test_second_derivatives_match_torch(name, device):
    """d/d(grad_output) of <v, grad_input> (the only non-zero second derivative of a pool) equals torch's."""
    torch_fns = {
        "max 3x3 s2 ceil": lambda t: F.max_pool2d(t, 3, 2, 1, ceil_mode=True),
        "max dilation": lambda t: F.max_pool2d(t, (2, 3), 1, 1, (2, 1)),
        "avg ceil exclude pad": lambda t: F.avg_pool2d(t, 3, 2, 1, True, False),
        "avg divisor_override": lambda t: F.avg_pool2d(t, (2, 3), 1, (1, 0), False, True, 4),
        "adaptive 4x9": lambda t: F.adaptive_avg_pool2d(t, (4, 9)),
        "adaptive global": lambda t: F.adaptive_avg_pool2d(t, 1),
    }
    x = distinct((2, 3, 5, 7), torch.float64, device, requires_grad=True)
    v = torch.randn(x.shape, dtype=torch.float64, device=device)
    results = []
    for fn in (GRAD_FNS[name], torch_fns[name]):
        out = fn(x)
        torch.manual_seed(1)
        u = torch.randn(out.shape, dtype=torch.float64).to(device).requires_grad_()
        (gx,) = torch.autograd.grad(out, x, u, create_graph=True)
        results.append(torch.autograd.grad((gx * v).sum(), (x, u), allow_unused=True, materialize_grads=True))
    for label, ours, theirs in zip(("input", "grad_output"), *results, strict=True):
        torch.testing.assert_close(ours, theirs, msg=lambda m, n=label: f"[{name}: d/d {n}] {m}")


# --- modules -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("device", device_params())
def test_modules_match_torch(device):
    stock = [
        nn.MaxPool2d(3, 2, 1),
        nn.MaxPool2d((2, 3), (1, 2), (1, 1), dilation=(2, 1), ceil_mode=True),
        nn.AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False),
        nn.AvgPool2d(2, divisor_override=3),
        nn.AdaptiveAvgPool2d((1, 1)),
        nn.AdaptiveAvgPool2d((3, None)),
    ]
    x = distinct((2, 3, 5, 7), torch.float64, device, "channels_last", requires_grad=True)
    # torch's modules run on a CPU copy: torch's channels-last CUDA avg_pool2d backward leaves the padding out of the
    # input coordinate (pytorch/pytorch#188344: AvgPool2d(3, 2, 1) below gets wrong gradients on CUDA).
    x_ref = x.detach().cpu().requires_grad_()
    for module in stock:
        ours = getattr(tnn, type(module).__name__).from_torch(module)
        assert type(ours) is not type(module) and isinstance(ours, type(module)), f"[{module}] class"
        assert repr(ours) == repr(module), f"[{module}] repr {ours!r}"
        out, ref = ours(x), module(x_ref)
        torch.testing.assert_close(out.cpu(), ref, msg=lambda m, mod=module: f"[{mod} output] {m}")
        g = torch.randn_like(ref)
        torch.testing.assert_close(torch.autograd.grad(out, x, g.to(device))[0].cpu(),
                                   torch.autograd.grad(ref, x_ref, g)[0],
                                   msg=lambda m, mod=module: f"[{mod} input.grad] {m}")  # fmt: skip
    pool = tnn.MaxPool2d(2, return_indices=True)
    out, idx = pool(x)
    torch.testing.assert_close(idx, F.max_pool2d(x, 2, return_indices=True)[1], msg="[MaxPool2d return_indices]")
    unpooled = F.max_unpool2d(out, idx, 2, output_size=x.shape[-2:])
    assert unpooled.shape == x.shape, "[indices usable by max_unpool2d]"


# --- CUDA-only: the vectorized channels-last paths, determinism, 64-bit indexing -------------------------------


@gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("channels", [1, 3, 8, 24, 64, 67])
def test_cuda_channels_last_vector_widths(channels, dtype):
    """C a multiple of the 16-byte vector width (8 half / 4 float / 2 double) or not, and a view at an odd storage
    offset (not 16-byte aligned): every path gives torch's values; the global pool's block reduction too."""
    base = torch.randn(2 * channels * 9 * 11 + 1, device="cuda", dtype=dtype)
    for x in (torch.randn(2, channels, 9, 11, device="cuda", dtype=dtype).contiguous(memory_format=torch.channels_last),
              base[1:].view(2, 9, 11, channels).permute(0, 3, 1, 2)):  # fmt: skip
        what = f"C={channels} {dtype} storage offset {x.storage_offset()}"
        out, idx = tf.max_pool2d(x, 3, 2, 1, return_indices=True)
        theirs, their_idx = F.max_pool2d(x, 3, 2, 1, return_indices=True)
        assert torch.equal(out, theirs) and torch.equal(idx, their_idx), f"[{what}: max_pool2d]"
        for name, ours_fn, torch_fn in (
            ("avg_pool2d", lambda t: tf.avg_pool2d(t, 2), lambda t: F.avg_pool2d(t, 2)),
            ("global", lambda t: tf.adaptive_avg_pool2d(t, 1), lambda t: F.adaptive_avg_pool2d(t, 1)),
            ("adaptive 4x5", lambda t: tf.adaptive_avg_pool2d(t, (4, 5)), lambda t: F.adaptive_avg_pool2d(t, (4, 5))),
        ):
            _check_average(f"{name} {what}", ours_fn, torch_fn, x.detach().requires_grad_())
        xg = x.detach().requires_grad_()
        out = tf.max_pool2d(xg, 3, 2, 1)
        g = torch.randn_like(out)
        (grad,) = torch.autograd.grad(out, xg, g)
        # Overlapping windows: an input element sums the gradients of several outputs, in float32 on the GPU, in
        # float64 in the reference; with cancellation a sum's error is a few float32 ulps of its terms, not of itself.
        torch.testing.assert_close(grad.cpu().double(), unpool_grad(g, idx, x.shape), rtol=GRAD_RTOL[dtype],
                                   atol=1e-6 if dtype == torch.float32 else 1e-12,
                                   msg=lambda m, w=what: f"[{w}: max_pool2d input.grad] {m}")  # fmt: skip


@gpu
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_cuda_backward_is_deterministic(layout):
    """Overlapping windows (3x3 stride 1 and 2) gather in a fixed order: two runs give the same bits, float and
    bfloat16."""
    for dtype in (torch.float32, torch.bfloat16):
        x = make_tensor((4, 16, 17, 19), dtype, "cuda", layout, requires_grad=True)
        for fn in (lambda t: tf.max_pool2d(t, 3, 1, 1), lambda t: tf.avg_pool2d(t, 3, 2, 1, True),
                   lambda t: tf.adaptive_avg_pool2d(t, (7, 11))):  # fmt: skip
            out = fn(x)
            g = torch.randn_like(out)
            first = torch.autograd.grad(out, x, g, retain_graph=True)[0]
            second = torch.autograd.grad(out, x, g)[0]
            assert torch.equal(first, second), f"[{layout} {dtype}] backward differs between runs"


@gpu
@pytest.mark.slow
def test_cuda_more_than_2_31_elements():
    """A channels-last bfloat16 input of 2^31 + 2^22 elements (4.3 GB): offsets past 2^31 are right."""
    x = torch.empty(1, 8, 16384, 16416, device="cuda", dtype=torch.bfloat16, memory_format=torch.channels_last)
    x.normal_()
    out, idx = tf.max_pool2d(x, 2, return_indices=True)
    theirs, their_idx = F.max_pool2d(x, 2, return_indices=True)
    assert torch.equal(out, theirs) and torch.equal(idx, their_idx), "[max_pool2d past 2^31]"
    del theirs, their_idx
    args = ([2, 2], [2, 2], [0, 0], [1, 1], False, idx)
    grad = torch.ops.torchext.max_pool2d_backward(out, x, *args)
    assert torch.equal(grad, torch.ops.aten.max_pool2d_with_indices_backward(out, x, *args)), "[backward past 2^31]"
    del grad, out, idx
    torch.testing.assert_close(tf.avg_pool2d(x, 2), F.avg_pool2d(x, 2), msg="[avg_pool2d past 2^31]")
    size = (8192, 8208)
    # torch's own CUDA adaptive_avg_pool2d asserts numel < 2^31 (AdaptiveAveragePooling.cu): halving the image is
    # the same 2 x 2 average as avg_pool2d's, which the line above checked against torch's.
    torch.testing.assert_close(tf.adaptive_avg_pool2d(x, size), tf.avg_pool2d(x, 2), msg="[adaptive]")
