"""Every version of the CUDA convolution ladder (cuda_ops/conv2d*.cu) on the GPU, pass by pass: forward (bias, relu),
the input's and the weight's gradients, the bias gradient and conv2d_stats, against float64 references
(torch.nn.functional.conv2d and torch.autograd.grad), in four dtypes, NCHW and channels-last, awkward shapes
(odd sizes, 3 / 5 channels, stride 2 on odd sizes, 1x1, 7x7 stride 2, dilation, groups) and a few ResNet-18 layers
in bf16. Outputs start poisoned (NaN), results must be the same bits on a second run, strides must follow
csrc/conv2d.h's layout rule, and a named variant that cannot run the arguments must say so with a ValueError
('does not support'); variant=None must always work."""

import pytest
import torch
import torch.nn.functional as F
from conftest import HAS_CUDA, assert_accurate, poison_allocator

import torchext  # noqa: F401  (registers the ops)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")]

VARIANTS = (None, "direct", "im2col", "implicit_simt", "implicit_mma", "implicit_wgmma", "implicit_tma")
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
LAYOUTS = ("nchw", "nhwc")

# (N, C, H, W, K, R, S, stride, padding, dilation, groups)
SHAPES = [
    (3, 3, 5, 7, 8, 3, 3, 1, 1, 1, 1),  # 3-channel stem, odd sizes
    (2, 5, 7, 5, 6, 3, 3, 2, 1, 1, 1),  # 5 channels, stride 2 on odd sizes
    (3, 8, 6, 6, 16, 1, 1, 1, 0, 1, 1),  # 1x1
    (2, 16, 9, 9, 8, 1, 1, 2, 0, 1, 1),  # 1x1 stride 2
    (2, 5, 7, 9, 8, 1, 1, 2, 0, 1, 1),  # 1x1 stride 2, 5 channels: tapless phases of unequal sizes, zeroed per element
    (2, 8, 10, 11, 16, 2, 1, (3, 2), (1, 0), 1, 1),  # kernel below the stride: tapless rows, columns and both
    (2, 3, 15, 13, 16, 7, 7, 2, 3, 1, 1),  # 7x7 stride 2 padding 3 (the ResNet stem)
    (2, 8, 9, 9, 8, 3, 3, 1, 2, 2, 1),  # dilation 2
    (2, 16, 6, 6, 8, 3, 3, 1, 1, 1, 2),  # groups 2
    (1, 16, 5, 7, 24, 3, 1, (2, 1), (1, 0), 1, 1),  # asymmetric kernel, stride and padding
    # 9x9 (81 taps): backward_input's sub-kernels placed in the kernel itself, past the host's table of 64 taps
    (1, 8, 11, 13, 16, 9, 9, 2, 4, 1, 1),
]
RESNET_SHAPES = [
    (8, 64, 32, 32, 64, 3, 3, 1, 1, 1, 1),
    (8, 128, 16, 16, 256, 3, 3, 2, 1, 1, 1),
    (8, 128, 16, 16, 256, 1, 1, 2, 0, 1, 1),
    (40, 64, 32, 32, 64, 3, 3, 1, 1, 1, 1),  # 160 tiles of 256 rows: more than one per SM for the persistent rung
    # stride 2 on odd sizes: backward_input's 4 phases (16x17, 16x16, 15x17 and 15x16 pixels; 1, 2, 2 and 4 taps) in
    # one persistent launch under implicit_tma, 200 tiles of unequal k-loops walked across the phases
    (40, 64, 31, 33, 128, 3, 3, 2, 1, 1, 1),
    # fewer phases than a launch holds (2: stride (2, 1)), and more (9 at stride 3: launches of 4, 4 and 1)
    (2, 64, 9, 11, 64, 3, 1, (2, 1), (1, 0), 1, 1),
    (2, 64, 12, 12, 64, 3, 3, 3, 1, 1, 1),
]

# implicit_tma's geometry (at least 64 channels; cuda_ops/conv2d_wgmma.cu): channel and output-channel counts that are
# not multiples of 64 (TMA's zero fill past C, weight rows past K), several images per tile, row tiles with a partial
# last one, stride 2 with padding past the kernel's half, a 1x1 stride-2 whose odd input-gradient phases have no tap
# (also with 68 channels: grad_input's rows not 16-byte chunks), dilation, a 250-wide row (one row per tile) and a
# 300-wide one (too wide for a box: refused, default falls back).
TMA_SHAPES = [
    (3, 72, 5, 7, 80, 3, 3, 1, 1, 1, 1),
    (2, 64, 9, 11, 64, 3, 3, 2, 2, 1, 1),
    (1, 64, 40, 37, 72, 3, 3, 1, 1, 1, 1),
    (3, 64, 11, 9, 128, 1, 1, 2, 0, 1, 1),
    (2, 68, 9, 7, 64, 1, 1, 2, 0, 1, 1),
    (2, 64, 12, 12, 64, 3, 3, 1, 2, 2, 1),
    (2, 96, 12, 13, 64, 5, 5, 2, 3, 1, 1),
    (1, 64, 6, 250, 64, 3, 3, 1, 1, 1, 1),
    (1, 64, 3, 300, 64, 3, 3, 1, 1, 1, 1),
    # the halo plan (stride 1, rows of a multiple of 8 pixels, one image per tile; HALO_SHAPES): two tiles of 10 rows
    # of 24, dilation 2 with a partial last tile, 128 channels (two chunks), 128 into 72 (128-column tiles, weight rows
    # past K), a 2x2 kernel
    (2, 64, 20, 24, 64, 3, 3, 1, 1, 1, 1),
    (2, 64, 19, 16, 64, 3, 3, 1, 2, 2, 1),
    (1, 128, 16, 16, 64, 3, 3, 1, 1, 1, 1),
    (1, 128, 16, 16, 72, 3, 3, 1, 1, 1, 1),
    (1, 64, 9, 17, 64, 2, 2, 1, 0, 1, 1),
]
# Which of them implicit_tma's backward_weight takes (cuda_ops/conv2d_wgrad_tma.cu: at least 64 channels in and out,
# R S ceil(C / 64) a multiple of 3, rows of at most 112 pixels): not the two 1x1, not the 5x5 over 96 channels (50
# boxes), not the 250- and 300-wide rows.
TMA_WGRAD = (True, True, True, False, False, True, False, False, False, True, True, True, True, False)
assert len(TMA_WGRAD) == len(TMA_SHAPES)
# The shapes whose forward implicit_tma runs on its halo plan (cuda_ops/conv2d_wgmma.cu, make_tma_maps): the five
# above, and ResNet-18's 3x3 layers at 32x32 and 16x16 (their stride-1 input gradients too).
HALO_SHAPES = TMA_SHAPES[-5:] + [RESNET_SHAPES[0], (4, 128, 16, 16, 128, 3, 3, 1, 1, 1, 1)]


@pytest.fixture(autouse=True)
def _no_tf32():
    """float32 in full precision on both sides (torch's convolutions and ours read the same flag)."""
    old = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32 = old


def _name(v):
    return str(v).split(".")[-1]


def _fmt(layout):
    return torch.channels_last if layout == "nhwc" else torch.contiguous_format


def _make(shape, dtype, layout):
    n, c, h, w, k, r, s, stride, padding, dilation, groups = shape
    gen = torch.Generator().manual_seed(hash(shape) % (2**31))

    def rand(*size):
        return (torch.rand(size, generator=gen, dtype=torch.float64) * 2 - 1).cuda()

    fmt = _fmt(layout)
    x64, w64, b64 = rand(n, c, h, w), rand(k, c // groups, r, s), rand(k)
    x = x64.to(dtype).contiguous(memory_format=fmt)
    wt = w64.to(dtype).contiguous(memory_format=fmt)
    b = b64.to(dtype)
    conv = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
    out_shape = F.conv2d(x64, w64, None, **conv).shape
    g = (torch.rand(out_shape, generator=gen, dtype=torch.float64).cuda() * 2 - 1).to(dtype)
    g = g.contiguous(memory_format=fmt)
    return x, wt, b, g, conv


def _pair(v):
    return list(v) if isinstance(v, tuple) else [v, v]


def _call(fn, variant, what):
    """fn(); None where a named variant refuses the arguments (the message must say so)."""
    try:
        return fn()
    except ValueError as e:
        assert variant is not None, f"[{what}] variant=None must always work, got: {e}"
        assert "does not support" in str(e), f"[{what}] unexpected message: {e}"
        return None


def _must_support(variant, groups):
    return variant in (None, "direct") or (variant == "im2col" and groups == 1)


def _expected_strides(shape, fmt):
    return torch.empty(shape, memory_format=fmt).stride()


def _rule_format(t, weight=None):
    """csrc/conv2d.h's layout rule: channels-last where the tensor suggests it (a 1x1 weight or a 1x1 image is
    ambiguous and suggests contiguous), else contiguous; the output's and grad_input's: where the input or the weight
    suggests it."""
    from torch._prims_common import suggest_memory_format

    def fmt(u):
        return torch.channels_last if suggest_memory_format(u) == torch.channels_last else torch.contiguous_format

    if weight is not None and fmt(weight) == torch.channels_last:
        return torch.channels_last
    return fmt(t)


def _check_shape(shape, variant, dtype, layout, act):
    x, w, b, g, conv = _make(shape, dtype, layout)
    st, pad, dil, groups = _pair(conv["stride"]), _pair(conv["padding"]), _pair(conv["dilation"]), conv["groups"]
    op = torch.ops.torchext
    tag = f"{variant}-{_name(dtype)}-{layout}-{shape}"
    fmt = _rule_format(x, w)

    # float64 references and torch's own result in this dtype.
    # The references see the same rounded inputs as ours; the backward is the convolution's alone (no relu).
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, w, b))
    z64 = F.conv2d(x64, w64, b64, **conv)
    y64 = z64.relu() if act == "relu" else z64
    gx64, gw64, gb64 = torch.autograd.grad(z64, (x64, w64, b64), g.double())
    xt, wt_, bt = (t.detach().clone().requires_grad_() for t in (x, w, b))
    zt = F.conv2d(xt, wt_, bt, **conv)
    yt = zt.relu() if act == "relu" else zt
    gxt, gwt, gbt = torch.autograd.grad(zt, (xt, wt_, bt), g)

    # forward
    poison_allocator("cuda", yt)
    y = _call(lambda: op.conv2d(x, w, b, st, pad, dil, groups, act, variant), variant, f"{tag} forward")
    if y is None:
        assert not _must_support(variant, groups), f"[{tag} forward] {variant} must support this"
    else:
        assert y.dtype == dtype and y.shape == yt.shape
        assert y.stride() == _expected_strides(y.shape, fmt), f"[{tag} forward strides] {y.stride()}"
        assert_accurate(y, yt, y64, f"{tag} forward")
        y2 = op.conv2d(x, w, b, st, pad, dil, groups, act, variant)
        assert torch.equal(y, y2), f"[{tag} forward] two runs differ"

    # conv2d_stats (no activation): the statistics of the stored output
    res = _call(lambda: op.conv2d_stats(x, w, b, st, pad, dil, groups, variant), variant, f"{tag} stats")
    if res is not None:
        out, s, sq = res
        acc = torch.float64 if dtype == torch.float64 else torch.float32
        k = out.shape[1]
        for t, name in ((s, "sum"), (sq, "sum_sq")):
            assert t.dtype == acc and t.shape == (k,) and t.stride() == (1,), f"[{tag} {name}] {t.dtype} {t.stride()}"
        o64 = out.double()
        ref_s, ref_sq = o64.sum((0, 2, 3)), (o64 * o64).sum((0, 2, 3))
        rel = 1e-10 if dtype == torch.float64 else 1e-4
        scale = o64.abs().sum((0, 2, 3)) + 1
        assert ((s.double() - ref_s).abs() <= rel * scale).all(), f"[{tag} stats sum]"
        assert ((sq.double() - ref_sq).abs() <= rel * (ref_sq + 1)).all(), f"[{tag} stats sum_sq]"
        assert_accurate(out, zt, z64, f"{tag} stats out")
        out2, s2, sq2 = op.conv2d_stats(x, w, b, st, pad, dil, groups, variant)
        assert torch.equal(out, out2) and torch.equal(s, s2) and torch.equal(sq, sq2), f"[{tag} stats] two runs differ"

    # backward, one gradient at a time (a variant may take one pass and not another)
    for i, (theirs, ref, like, what) in enumerate(
        ((gxt, gx64, x, "grad_input"), (gwt, gw64, w, "grad_weight"), (gbt, gb64, b, "grad_bias"))
    ):
        mask = [j == i for j in range(3)]
        poison_allocator("cuda", like)
        res = _call(
            lambda m=mask: op.conv2d_backward(g, x, w, st, pad, dil, groups, m, variant), variant, f"{tag} {what}"
        )
        if res is None:
            assert not _must_support(variant, groups), f"[{tag} {what}] {variant} must support this"
            continue
        got = res[i]
        for j in range(3):
            if j != i:
                assert res[j].numel() == 0, f"[{tag} {what}] output {j} not requested but not empty"
        assert got.shape == like.shape and got.dtype == dtype
        expect_fmt = (fmt, _rule_format(w), torch.contiguous_format)[i]
        assert got.stride() == _expected_strides(got.shape, expect_fmt), f"[{tag} {what} strides] {got.stride()}"
        assert_accurate(got, theirs, ref, f"{tag} {what}")
        again = op.conv2d_backward(g, x, w, st, pad, dil, groups, mask, variant)[i]
        assert torch.equal(got, again), f"[{tag} {what}] two runs differ"


def _params(shapes, dtypes):
    out = []
    for si, shape in enumerate(shapes):
        for dtype in dtypes:
            for layout in LAYOUTS:
                for variant in VARIANTS:
                    act = "relu" if si % 2 else "none"
                    out.append(
                        pytest.param(
                            shape, variant, dtype, layout, act, id=f"{variant}-{_name(dtype)}-{layout}-s{si}-{act}"
                        )
                    )
    return out


@pytest.mark.parametrize("shape,variant,dtype,layout,act", _params(SHAPES, DTYPES))
def test_conv2d_variant_small(shape, variant, dtype, layout, act):
    _check_shape(shape, variant, dtype, layout, act)


@pytest.mark.parametrize("shape,variant,dtype,layout,act", _params(RESNET_SHAPES, (torch.bfloat16,)))
def test_conv2d_variant_resnet18_bf16(shape, variant, dtype, layout, act):
    _check_shape(shape, variant, dtype, layout, act)


@pytest.mark.parametrize("shape,variant,dtype,layout,act", _params(TMA_SHAPES, (torch.bfloat16, torch.float16)))
def test_conv2d_variant_tma_geometry(shape, variant, dtype, layout, act):
    _check_shape(shape, variant, dtype, layout, act)


def _is_sm90():
    return torch.cuda.get_device_capability() == (9, 0)


@pytest.mark.parametrize("si", range(len(TMA_SHAPES)))
def test_conv2d_tma_takes_its_shapes(si):
    """On an sm_90 GPU implicit_tma must run the shapes it was written for (the generic test accepts a refusal), and
    the default must be it, except for a 1x1 stride-2 forward, where the default is implicit_mma (faster there:
    cuda_ops/conv2d.cu, strided_pointwise_forward); the 300-wide row is refused with a reason, and so is
    backward_weight where TMA_WGRAD says so."""
    if not _is_sm90():
        pytest.skip("implicit_tma needs an sm_90 GPU")
    shape = TMA_SHAPES[si]
    x, w, b, g, conv = _make(shape, torch.bfloat16, "nhwc")
    st, pad, dil, groups = _pair(conv["stride"]), _pair(conv["padding"]), _pair(conv["dilation"]), conv["groups"]
    op = torch.ops.torchext
    if shape[3] > 256:
        with pytest.raises(ValueError, match="256"):
            op.conv2d(x, w, b, st, pad, dil, groups, "none", "implicit_tma")
        return
    y = op.conv2d(x, w, b, st, pad, dil, groups, "none", "implicit_tma")
    default = op.conv2d(x, w, b, st, pad, dil, groups, "none", None)
    if shape[5] == shape[6] == 1 and shape[7] > 1:
        y_mma = op.conv2d(x, w, b, st, pad, dil, groups, "none", "implicit_mma")
        assert torch.equal(y_mma, default), "the default 1x1 stride-2 forward is not implicit_mma"
    else:
        assert torch.equal(y, default), "the default is not implicit_tma"
    if dil == [1, 1]:
        gx = op.conv2d_backward(g, x, w, st, pad, dil, groups, [True, False, False], "implicit_tma")[0]
        gx0 = op.conv2d_backward(g, x, w, st, pad, dil, groups, [True, False, False], None)[0]
        assert torch.equal(gx, gx0), "the default backward_input is not implicit_tma"
    wgrad = [False, True, False]
    if TMA_WGRAD[si]:
        gw = op.conv2d_backward(g, x, w, st, pad, dil, groups, wgrad, "implicit_tma")[1]
        gw0 = op.conv2d_backward(g, x, w, st, pad, dil, groups, wgrad, None)[1]
        assert torch.equal(gw, gw0), "the default backward_weight is not implicit_tma"
    else:
        with pytest.raises(ValueError, match="backward_weight needs"):
            op.conv2d_backward(g, x, w, st, pad, dil, groups, wgrad, "implicit_tma")


@pytest.mark.parametrize("si", range(len(HALO_SHAPES)))
def test_conv2d_tma_halo_plan(si, monkeypatch):
    """implicit_tma's halo plan (each tap column's input window read once for its R taps) against its plan without
    (TORCHEXT_CONV2D_HALO=0, read at each launch) and against float64: the forward with relu, conv2d_stats and the
    stride-1 input gradient. The two plans add the taps in another order, so they agree to rounding, not bits."""
    if not _is_sm90():
        pytest.skip("implicit_tma needs an sm_90 GPU")
    x, w, b, g, conv = _make(HALO_SHAPES[si], torch.bfloat16, "nhwc")
    st, pad, dil, groups = _pair(conv["stride"]), _pair(conv["padding"]), _pair(conv["dilation"]), conv["groups"]
    op = torch.ops.torchext

    def run():
        y = op.conv2d(x, w, b, st, pad, dil, groups, "relu", "implicit_tma")
        out, s, sq = op.conv2d_stats(x, w, b, st, pad, dil, groups, "implicit_tma")
        gx = None
        if dil == [1, 1]:
            gx = op.conv2d_backward(g, x, w, st, pad, dil, groups, [True, False, False], "implicit_tma")[0]
        return y, out, s, sq, gx

    halo = run()
    monkeypatch.setenv("TORCHEXT_CONV2D_HALO", "0")
    plain = run()
    y64 = F.conv2d(x.double(), w.double(), b.double(), st, pad, dil, groups)
    for name, got, other, ref in (("forward", halo[0], plain[0], y64.relu()), ("stats out", halo[1], plain[1], y64)):
        err = (got.double() - ref).abs().max().item() / max(ref.abs().max().item(), 1e-30)
        assert err < 1e-2, f"{name}: halo plan error {err:.2e} against float64"
        torch.testing.assert_close(got.float(), other.float(), rtol=2e-2, atol=2e-2 * ref.abs().max().item())
    torch.testing.assert_close(halo[2], plain[2], rtol=1e-3, atol=1e-2 * y64.abs().sum((0, 2, 3)).max().item())
    torch.testing.assert_close(halo[3], plain[3], rtol=1e-3, atol=1e-3 * (y64 * y64).sum((0, 2, 3)).max().item())
    if halo[4] is not None:
        gx64 = torch.nn.grad.conv2d_input(x.shape, w.double(), g.double(), st, pad, dil, groups)
        err = (halo[4].double() - gx64).abs().max().item() / gx64.abs().max().item()
        assert err < 1e-2, f"input gradient: halo plan error {err:.2e} against float64"
        torch.testing.assert_close(halo[4].float(), plain[4].float(), rtol=2e-2, atol=2e-2 * gx64.abs().max().item())


# implicit_tma's TMA-store epilogue (the forward, and the input gradient's launches: one GEMM at stride 1, the stride
# phases' persistent launch at stride 2, whose phase outputs are strided views of grad_input): the geometry above (the
# 68-channel 1x1 stride 2: one phase with taps, into grad_input rows of 136 bytes, which no tensor map can address;
# stride 2 over 9 rows: phase views that do not nest; both store from the registers), ResNet-18's 64 -> 64 at 32x32
# (BN 64, halo), 128 -> 128 at 16x16 (BN 128, halo), 256 -> 256 at 8x8 (several images per tile), a 64 -> 128
# stride-2 3x3 at 16x16 (four phases of 8x8, each with its output map), and three with more tiles than SMs. Not the
# 300-wide row, which the rung refuses.
STORE_SHAPES = (
    TMA_SHAPES[:-6]
    + TMA_SHAPES[-5:]
    + [
        RESNET_SHAPES[0],
        (4, 128, 16, 16, 128, 3, 3, 1, 1, 1, 1),
        (3, 256, 8, 8, 256, 3, 3, 1, 1, 1, 1),
        (4, 64, 16, 16, 128, 3, 3, 2, 1, 1, 1),
        # more tiles than an H100 / H200 has SMs, so blocks reuse the staging (the wait for the last copy's reads):
        # 400 tiles (halo, BN 64), 300 (BN 128, 4 images a tile), 256 over four stride phases
        (100, 64, 32, 32, 64, 3, 3, 1, 1, 1, 1),
        (600, 256, 8, 8, 256, 3, 3, 1, 1, 1, 1),
        (64, 64, 32, 32, 128, 3, 3, 2, 1, 1, 1),
    ]
)


@pytest.mark.parametrize("si", range(len(STORE_SHAPES)))
def test_conv2d_tma_store_epilogue(si, monkeypatch):
    """implicit_tma's TMA-store epilogue (the tile through shared memory, stored by the copy engine) against the same
    kernel storing from the registers (TORCHEXT_CONV2D_TMA_STORE=0, read at each launch): the same arithmetic, so the
    same bits, for the forward with bias and relu, conv2d_stats (output and sums) and the input gradient. Outputs
    start poisoned (NaN): an element the copy engine skips shows. And against float64."""
    if not _is_sm90():
        pytest.skip("implicit_tma needs an sm_90 GPU")
    x, w, b, g, conv = _make(STORE_SHAPES[si], torch.bfloat16, "nhwc")
    st, pad, dil, groups = _pair(conv["stride"]), _pair(conv["padding"]), _pair(conv["dilation"]), conv["groups"]
    op = torch.ops.torchext
    y64 = F.conv2d(x.double(), w.double(), b.double(), st, pad, dil, groups)
    y_like = torch.empty_like(y64, dtype=x.dtype)  # the poison's size and NaN pattern: the output's dtype

    def run():
        poison_allocator("cuda", y_like)
        y = op.conv2d(x, w, b, st, pad, dil, groups, "relu", "implicit_tma")
        poison_allocator("cuda", y_like)
        stats = op.conv2d_stats(x, w, b, st, pad, dil, groups, "implicit_tma")
        poison_allocator("cuda", x)
        gx = None
        if dil == [1, 1]:
            gx = op.conv2d_backward(g, x, w, st, pad, dil, groups, [True, False, False], "implicit_tma")[0]
        return (y, *stats, gx)

    tma = run()
    monkeypatch.setenv("TORCHEXT_CONV2D_TMA_STORE", "0")
    plain = run()
    names = ("forward", "stats out", "sum", "sum of squares", "input gradient")
    for name, got, other in zip(names, tma, plain, strict=True):
        if got is not None:
            assert torch.equal(got, other), f"{name}: the TMA-store epilogue differs from the register stores"
    err = (tma[0].double() - y64.relu()).abs().max().item() / y64.abs().max().item()
    assert err < 1e-2, f"forward: error {err:.2e} against float64"
    if tma[4] is not None:
        gx64 = torch.nn.grad.conv2d_input(x.shape, w.double(), g.double(), st, pad, dil, groups)
        err = (tma[4].double() - gx64).abs().max().item() / gx64.abs().max().item()
        assert err < 1e-2, f"input gradient: error {err:.2e} against float64"


@pytest.mark.parametrize("si", [len(RESNET_SHAPES) - 2, len(RESNET_SHAPES) - 1])
def test_conv2d_tma_backward_input_phase_groups(si):
    """implicit_tma must take the input gradient of the 2-phase and the 9-phase shape (a launch of fewer phases than
    it holds; launches of 4, 4 and 1) and match the direct rung (test_conv2d_variant_resnet18_bf16, which accepts a
    refusal, checks every rung against float64)."""
    if not _is_sm90():
        pytest.skip("implicit_tma needs an sm_90 GPU")
    x, w, b, g, conv = _make(RESNET_SHAPES[si], torch.bfloat16, "nhwc")
    st, pad, dil, groups = _pair(conv["stride"]), _pair(conv["padding"]), _pair(conv["dilation"]), conv["groups"]
    op = torch.ops.torchext
    mask = [True, False, False]
    gx = op.conv2d_backward(g, x, w, st, pad, dil, groups, mask, "implicit_tma")[0]
    ref = op.conv2d_backward(g, x, w, st, pad, dil, groups, mask, "direct")[0]
    torch.testing.assert_close(gx.float(), ref.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("variant", VARIANTS, ids=str)
def test_conv2d_grad_weight_ignores_unread_rows(variant):
    """x's row 15 is read by no output (3x3, stride 2, no padding, 16 rows: the last output reads rows 12-14), so an
    inf there must not reach grad_weight. implicit_tma's weight gradient tiles 7 output rows in boxes of 4, and its
    phantom 8th row would read row 15: x's tensor map ends at the last row read (cuda_ops/conv2d_wgrad_tma.cu)."""
    gen = torch.Generator().manual_seed(15)
    x64 = torch.rand(1, 64, 16, 35, generator=gen, dtype=torch.float64) * 2 - 1
    w64 = torch.rand(64, 64, 3, 3, generator=gen, dtype=torch.float64) * 2 - 1
    g64 = torch.rand(1, 64, 7, 17, generator=gen, dtype=torch.float64) * 2 - 1
    x64[:, :, 15, :] = float("inf")
    ref = torch.nn.grad.conv2d_weight(x64, w64.shape, g64, stride=2)
    assert torch.isfinite(ref).all()
    cl = torch.channels_last
    x, w, g = (t.to("cuda", torch.bfloat16).contiguous(memory_format=cl) for t in (x64, w64, g64))
    res = _call(
        lambda: torch.ops.torchext.conv2d_backward(g, x, w, [2, 2], [0, 0], [1, 1], 1, [False, True, False], variant),
        variant,
        "grad_weight, inf in an unread row",
    )
    if res is None:
        return
    gw = res[1].double().cpu()
    assert torch.isfinite(gw).all(), f"[{variant}] inf or NaN in grad_weight"
    ref_bf16 = torch.nn.grad.conv2d_weight(x.double().cpu(), w64.shape, g.double().cpu(), stride=2)
    assert (gw - ref_bf16).abs().max() <= 2e-2 * ref_bf16.abs().max(), f"[{variant}] grad_weight differs"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=_name)
@pytest.mark.parametrize("variant", VARIANTS, ids=str)
def test_conv2d_grad_weight_in_float32(variant, dtype):
    """grad_weight_dtype=float32 for a half weight (autocast's float32 master weights): a float32, channels-last
    gradient that, rounded to the weight's dtype, is the same bits as the half-precision result (the same sums), and
    no farther from the float64 reference. implicit_mma and implicit_tma write it from their float sums (w_acc, one
    split and several; at least one shape must come out unrounded), the others compute in the weight's dtype and cast.
    Poisoned outputs; NCHW tensors take the cast path; an empty batch gives zeros."""
    op = torch.ops.torchext
    unrounded = 0
    shapes = [SHAPES[2], SHAPES[6], RESNET_SHAPES[0], RESNET_SHAPES[2], RESNET_SHAPES[3], TMA_SHAPES[0], (0, 64, 8, 8,
              64, 3, 3, 1, 1, 1, 1)]  # fmt: skip
    for shape in shapes:
        for layout in LAYOUTS:
            x, w, b, g, conv = _make(shape, dtype, layout)
            st, pad, dil = _pair(conv["stride"]), _pair(conv["padding"]), _pair(conv["dilation"])
            tag = f"{variant}-{_name(dtype)}-{layout}-{shape}"

            def grad_weight(*dt, x=x, w=w, g=g, st=st, pad=pad, dil=dil):
                poison_allocator("cuda", w.float() if dt else w)
                return op.conv2d_backward(g, x, w, st, pad, dil, 1, [False, True, False], variant, *dt)[1]

            half = _call(grad_weight, variant, tag)
            if half is None:
                continue
            wide = grad_weight(torch.float32)
            assert wide.dtype == torch.float32 and wide.shape == w.shape, tag
            assert wide.stride() == _expected_strides(w.shape, _rule_format(w)), f"[{tag}] strides {wide.stride()}"
            assert torch.equal(wide.to(dtype), half), f"[{tag}] float32 gradient rounded != the {dtype} gradient"
            ref = torch.nn.grad.conv2d_weight(x.double(), w.shape, g.double(), **conv)
            err_wide, err_half = (wide.double() - ref).abs().max(), (half.double() - ref).abs().max()
            assert err_wide <= err_half, f"[{tag}] float32 error {err_wide} > {dtype} error {err_half}"
            unrounded += int(not torch.equal(wide, half.float()))
    if variant in ("implicit_mma", "implicit_tma", None):
        assert unrounded > 0, f"[{variant}] every float32 gradient was a rounded one: the float sums never reached it"
    with pytest.raises(TypeError, match="`grad_weight_dtype`"):
        op.conv2d_backward(g, x, w, st, pad, dil, 1, [False, True, False], variant, torch.float64)


@pytest.mark.parametrize("variant", VARIANTS, ids=str)
@pytest.mark.parametrize("case", ["n0", "k0", "c0"])
def test_conv2d_empty_sizes(variant, case):
    n, c, k = {"n0": (0, 4, 8), "k0": (2, 4, 0), "c0": (2, 0, 8)}[case]
    x = torch.rand(n, c, 5, 5, device="cuda")
    w = torch.rand(k, c, 3, 3, device="cuda")
    b = torch.rand(k, device="cuda")
    op = torch.ops.torchext
    y = _call(lambda: op.conv2d(x, w, b, [1, 1], [1, 1], [1, 1], 1, "relu", variant), variant, case)
    if y is not None:
        assert y.shape == (n, k, 5, 5)
        if c == 0:
            torch.testing.assert_close(y, b.view(1, -1, 1, 1).relu().expand(n, k, 5, 5))
    res = _call(lambda: op.conv2d_stats(x, w, b, [1, 1], [1, 1], [1, 1], 1, variant), variant, case)
    if res is not None:
        out, s, sq = res
        torch.testing.assert_close(s.double(), out.double().sum((0, 2, 3)), rtol=1e-5, atol=1e-5)
    g = torch.rand(n, k, 5, 5, device="cuda")
    res = _call(
        lambda: op.conv2d_backward(g, x, w, [1, 1], [1, 1], [1, 1], 1, [True, True, True], variant), variant, case
    )
    if res is not None:
        gx, gw, gb = res
        assert gx.shape == x.shape and gw.shape == w.shape and gb.shape == (k,)
        if k == 0:
            assert (gx == 0).all()
        if n == 0:
            assert (gw == 0).all() and (gb == 0).all()


def test_conv2d_variant_names():
    x = torch.rand(1, 4, 5, 5, device="cuda")
    w = torch.rand(4, 4, 3, 3, device="cuda")
    with pytest.raises(ValueError, match="'cpu' runs on CPU"):
        torch.ops.torchext.conv2d(x, w, None, [1, 1], [0, 0], [1, 1], 1, "none", "cpu")
    names = "'direct', 'im2col', 'implicit_simt', 'implicit_mma', 'implicit_wgmma', 'implicit_tma'"
    with pytest.raises(ValueError, match=names):
        torch.ops.torchext.conv2d(x, w, None, [1, 1], [0, 0], [1, 1], 1, "none", "winograd")
    with pytest.raises(ValueError, match="does not support"):
        torch.ops.torchext.conv2d(
            x, torch.rand(4, 2, 3, 3, device="cuda"), None, [1, 1], [0, 0], [1, 1], 2, "none", "im2col"
        )
