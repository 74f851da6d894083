"""Every version of the CUDA batch-norm ladder (cuda_ops/batch_norm.cu) on the GPU: batch_norm, batch_norm_relu and
batch_norm_add_relu forward (training and eval: output, mask bits, save_mean / save_invstd, running statistics) and
batch_norm_backward (grad_input, grad_weight, grad_bias, grad_residual), against float64 references, in four dtypes,
NCHW and channels-last, on shapes that take each kernel path: C % 8 == 0 (the vectorized and fused rows x C tiles), H W
% 8 == 0 (vectorized planes), neither (simple only), many reduction chunks (and fused's groups of chunks), two column
blocks, a 2-D input, two rows. The fused rung's forward runs as one launch where its grid fits on the GPU and as two
launches otherwise (TORCHEXT_BATCH_NORM_SINGLE=0 forces them): both must give the same bits. Outputs start poisoned
(NaN), results must be the same bits on a second run, strides follow csrc/batch_norm.h's layout rule, and a named
variant that cannot run the arguments must say so with a ValueError ('does not support'); variant=None always works."""

import functools

import pytest
import torch
import torch.nn.functional as F
from conftest import HAS_CUDA, assert_accurate, poison_allocator

import torchext  # noqa: F401  (registers the ops)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")]

VARIANTS = (None, "simple", "vectorized", "fused")
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
LAYOUTS = ("nchw", "nhwc")
KINDS = ("plain", "relu", "add_relu")
SHAPES = [
    (3, 16, 5, 7),  # C % 8 == 0: vectorized in NHWC; H W = 35: simple only in NCHW
    (2, 8, 4, 6),  # H W = 24: vectorized in both layouts
    (3, 5, 3, 3),  # C = 5, H W = 9: simple only
    (64, 32, 16, 16),  # 16384 rows: many reduction chunks
    (4, 24, 1, 1),  # H = W = 1
    (37, 24),  # 2-D
    (32, 8, 64, 72),  # 147456 rows of 8 channels: fused's chunk groups (2 groups in bf16, 3 in float32, 9 in float64)
    (6, 264, 5, 5),  # C = 264: two column blocks in the rows x C kernels, the second with one 8-channel unit
    (2, 16, 1, 1),  # two rows
]

ops = torch.ops.torchext


def _name(v):
    return str(v).split(".")[-1]


def _make(shape, dtype, layout, seed):
    gen = torch.Generator().manual_seed(seed)

    def rand(*size, low=-2.0, high=2.0):
        return (torch.rand(size, generator=gen, dtype=torch.float64) * (high - low) + low).cuda()

    fmt = torch.channels_last if layout == "nhwc" and len(shape) == 4 else torch.contiguous_format
    x = (rand(*shape) + 0.5).to(dtype).contiguous(memory_format=fmt)
    r = rand(*shape).to(dtype).contiguous(memory_format=fmt)
    g = rand(*shape).to(dtype).contiguous(memory_format=fmt)
    pdt = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    c = shape[1]
    w, b = rand(c, low=0.5, high=1.5).to(pdt), rand(c).to(pdt)
    rm, rv = rand(c, low=-0.5, high=0.5).to(pdt), rand(c, low=0.5, high=1.5).to(pdt)
    return x, r, g, w, b, rm, rv


def _call(fn, variant, what):
    try:
        return fn()
    except ValueError as e:
        assert variant is not None, f"[{what}] variant=None must always work, got: {e}"
        assert "does not support" in str(e), f"[{what}] unexpected message: {e}"
        return None


def _must_support(variant, shape, layout):
    """'vectorized' and 'fused' run rows x C (channels-last, 2-D, or H W = 1) with C % 8 == 0 and planes with
    H W % 8 == 0."""
    if variant not in ("vectorized", "fused"):
        return True
    c, spatial = shape[1], 1
    for s in shape[2:]:
        spatial *= s
    b = 1 if layout == "nhwc" else spatial
    return c % 8 == 0 if b == 1 else b % 8 == 0


def _forward(kind, x, r, w, b, rm, rv, training, variant):
    if kind == "plain":
        out, save_mean, save_invstd = ops.batch_norm(x, w, b, rm, rv, training, 0.1, 1e-5, None, None, variant)
        return out, None, save_mean, save_invstd
    if kind == "relu":
        return ops.batch_norm_relu(x, w, b, rm, rv, training, 0.1, 1e-5, None, None, variant)
    return ops.batch_norm_add_relu(x, r, w, b, rm, rv, training, 0.1, 1e-5, None, None, variant)


def _torch(kind, x, r, w, b, rm, rv, training):
    # From a fresh copy: cuDNN's fp16 kernels fault on a misaligned (storage-offset) input (tests/test_batch_norm.py).
    x, r = x.clone(), (r.clone() if r is not None else None)
    y = F.batch_norm(x, rm, rv, w, b, training, 0.1, 1e-5)
    if kind == "add_relu":
        y = y + r
    return y if kind == "plain" else y.relu()


def _memory_order(t):
    """t's elements in memory order (the mask's bit order)."""
    if t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous():
        return t.permute(0, 2, 3, 1).reshape(-1)
    return t.reshape(-1)


def _unpack(mask, numel):
    bits = (mask.unsqueeze(1) >> torch.arange(8, device=mask.device, dtype=torch.uint8)) & 1
    return bits.reshape(-1)[:numel].bool(), bits.reshape(-1)[numel:]


def _check(shape, variant, dtype, layout, kind, training):
    tag = f"{variant}-{_name(dtype)}-{layout}-{shape}-{kind}-{'train' if training else 'eval'}"
    x, r, g, w, b, rm, rv = _make(shape, dtype, layout, seed=hash((shape, kind)) % (2**31))
    res = r if kind == "add_relu" else None
    f64 = [t.double() for t in (x, r, w, b)]
    rm64, rv64 = rm.double(), rv.double()
    x64 = f64[0].detach().requires_grad_()
    w64, b64 = f64[2].detach().requires_grad_(), f64[3].detach().requires_grad_()
    r64 = f64[1].detach().requires_grad_()
    y64 = _torch(kind, x64, r64, w64, b64, rm64, rv64, training)
    grads64 = torch.autograd.grad(y64, (x64, r64, w64, b64), g.double(), allow_unused=True)
    xt, rt, wt, bt = (t.detach().clone().requires_grad_() for t in (x, r, w, b))
    rmt, rvt = rm.clone(), rv.clone()
    yt = _torch(kind, xt, rt, wt, bt, rmt, rvt, training)
    grads_t = torch.autograd.grad(yt, (xt, rt, wt, bt), g, allow_unused=True)

    # forward
    rm1, rv1 = rm.clone(), rv.clone()
    poison_allocator("cuda", x)
    got = _call(lambda: _forward(kind, x, res, w, b, rm1, rv1, training, variant), variant, f"{tag} forward")
    if got is None:
        assert not _must_support(variant, shape, layout), f"[{tag}] {variant} must support this"
        return
    out, mask, save_mean, save_invstd = got
    from torchext.ops.batch_norm import memory_format

    assert out.dtype == dtype and out.shape == x.shape
    assert out.stride() == torch.empty(shape, memory_format=memory_format(x)).stride(), f"[{tag} strides]"
    assert_accurate(out, yt, y64, f"{tag} output")
    if training:
        assert_accurate(rm1, rmt, rm64, f"{tag} running_mean", dtype=rm.dtype)
        assert_accurate(rv1, rvt, rv64, f"{tag} running_var", dtype=rv.dtype)
        var, mean = torch.var_mean(x.double(), [d for d in range(x.dim()) if d != 1], correction=0)
        torch.testing.assert_close(save_mean.double(), mean, rtol=1e-5, atol=1e-5, msg=f"[{tag} save_mean]")
        invstd = (var + 1e-5).rsqrt()
        torch.testing.assert_close(save_invstd.double(), invstd, rtol=1e-4, atol=1e-5, msg=f"[{tag} save_invstd]")
    else:
        assert torch.equal(rm1, rm) and torch.equal(rv1, rv), f"[{tag}] eval must not touch the running buffers"
    if mask is not None:
        bits, tail = _unpack(mask, x.numel())
        # The bit is the pre-activation's sign: it may be 1 where a tiny positive value rounded to a zero output.
        shape_c = [1, -1] + [1] * (x.dim() - 2)
        pre = (x.double() - save_mean.double().view(shape_c)) * (save_invstd.double() * w.double()).view(shape_c)
        pre = pre + b.double().view(shape_c) + (r.double() if kind == "add_relu" else 0)
        differ = bits != (_memory_order(out) > 0)
        assert (_memory_order(pre)[differ].abs() < 1e-3).all(), f"[{tag} mask bits vs output > 0]"
        assert not tail.any(), f"[{tag} mask bits past numel]"
    rm2, rv2 = rm.clone(), rv.clone()
    again = _forward(kind, x, res, w, b, rm2, rv2, training, variant)
    assert torch.equal(out, again[0]) and torch.equal(rm1, rm2) and torch.equal(rv1, rv2), f"[{tag}] runs differ"

    # backward: every gradient at once, then each alone must give the same bits
    output_mask = [True, True, True, kind == "add_relu"]
    poison_allocator("cuda", x)
    res_b = _call(
        lambda: ops.batch_norm_backward(g, x, w, save_mean, save_invstd, mask, training, 1e-5, output_mask, variant),
        variant,
        f"{tag} backward",
    )
    assert res_b is not None, f"[{tag}] a variant that runs the forward must run the backward"
    names = ("grad_input", "grad_weight", "grad_bias", "grad_residual")
    refs = (grads64[0], grads64[2], grads64[3], grads64[1])
    theirs = (grads_t[0], grads_t[2], grads_t[3], grads_t[1])
    for i, name in enumerate(names):
        if not output_mask[i]:
            assert res_b[i].numel() == 0, f"[{tag} {name}] not requested but not empty"
            continue
        assert_accurate(res_b[i], theirs[i], refs[i], f"{tag} {name}", dtype=res_b[i].dtype, factor=4.0)
        alone = ops.batch_norm_backward(
            g, x, w, save_mean, save_invstd, mask, training, 1e-5, [j == i for j in range(4)], variant
        )[i]
        assert torch.equal(alone, res_b[i]), f"[{tag} {name}] alone vs with the others: bits differ"
    assert res_b[0].stride() == out.stride(), f"[{tag} grad_input strides]"


def _params():
    out = []
    for si, shape in enumerate(SHAPES):
        for dtype in DTYPES:
            for layout in LAYOUTS:
                if len(shape) == 2 and layout == "nhwc":
                    continue
                for variant in VARIANTS:
                    out.append(
                        pytest.param(shape, variant, dtype, layout, id=f"{variant}-{_name(dtype)}-{layout}-s{si}")
                    )
    return out


@pytest.mark.parametrize("shape,variant,dtype,layout", _params())
def test_batch_norm_variant(shape, variant, dtype, layout):
    for kind in KINDS:
        for training in (True, False):
            _check(shape, variant, dtype, layout, kind, training)


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=_name)
def test_batch_norm_rows_reduction_sweeps_past_one_slab_per_block(dtype):
    """The rows x C reductions give slab s of blockDim.y x N rows to block s % 264. 589815 rows of 8 channels (256 rows
    a block) are 287 full slabs of 2048 rows and a partial one of 2039 in bf16's forward (blocks sum one or two; block
    23 a full one, then the partial), and 575 of 1024 and one of 1015 in float32 and in every backward (blocks sum two
    or three; block 47 two full ones, then the partial): walks no shape above reaches (one slab a block at most)."""
    for kind in ("plain", "add_relu"):
        _check((9, 8, 255, 257), "vectorized", dtype, "nhwc", kind, True)


@pytest.mark.parametrize("variant", VARIANTS, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_batch_norm_empty_batch(variant, layout):
    fmt = torch.channels_last if layout == "nhwc" else torch.contiguous_format
    x = torch.rand(0, 16, 4, 6, device="cuda").contiguous(memory_format=fmt)
    w, b = torch.rand(16, device="cuda"), torch.rand(16, device="cuda")
    rm, rv = torch.rand(16, device="cuda"), torch.rand(16, device="cuda") + 0.5
    rm0, rv0 = rm.clone(), rv.clone()
    out, mask, save_mean, save_invstd = ops.batch_norm_relu(x, w, b, rm, rv, True, 0.1, 1e-5, None, None, variant)
    assert out.shape == x.shape and mask.numel() == 0
    assert torch.equal(rm, rm0) and torch.equal(rv, rv0), "[empty batch: running statistics must stay]"
    gx, gw, gb, _ = ops.batch_norm_backward(
        x, x, w, save_mean, save_invstd, mask, True, 1e-5, [True, True, True, False], variant
    )
    assert gx.shape == x.shape and not gw.any() and not gb.any()


@pytest.mark.parametrize("variant", VARIANTS, ids=str)
@pytest.mark.parametrize("dtype", (torch.float32, torch.float16, torch.bfloat16), ids=_name)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_batch_norm_backward_grad_residual_is_grad_out_where_the_mask_is_set(variant, dtype, layout):
    """grad_residual is grad_out where the relu mask's bit is set and +0 elsewhere, bit for bit (torch's
    threshold_backward), for special values of grad_out (+-0, +-inf, subnormals, the largest finite): eight side by
    side in memory (one 8-element unit) and eight spread over rows. A random mask and its complement: every value is
    passed once and zeroed once. (4, 16, 3, 5): the rows kernels in channels-last, simple in NCHW; 960 elements and a
    second shape of 945 (a partial last mask byte)."""
    fmt = torch.channels_last if layout == "nhwc" else torch.contiguous_format
    info = torch.finfo(dtype)
    special = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), info.tiny / 4, -info.tiny / 2, info.max, -info.max])
    for shape in ((4, 16, 3, 5), (3, 7, 5, 9)):
        gen = torch.Generator().manual_seed(7)
        n, c, h, w_ = shape
        # grad_out built in memory order, then viewed in the layout: flat[i] is element i in memory
        flat = torch.randn(n * c * h * w_, generator=gen).to(dtype)
        flat[8:16] = special.to(dtype)
        flat[40 : 40 + 8 * 13 : 13] = special.to(dtype)
        if layout == "nhwc":
            g = flat.view(n, h, w_, c).permute(0, 3, 1, 2)
        else:
            g = flat.view(shape)
        g = g.cuda()
        assert g.is_contiguous(memory_format=fmt) and torch.equal(_memory_order(g).cpu(), flat)
        x = torch.randn(shape, generator=gen).to(dtype).cuda().contiguous(memory_format=fmt)
        weight = torch.rand(c, generator=gen).cuda() + 0.5
        numel = g.numel()
        drawn = torch.randint(0, 256, ((numel + 7) // 8,), generator=gen, dtype=torch.uint8).cuda()
        tail = torch.full_like(drawn, 0xFF)
        tail[-1] = (1 << (numel % 8 or 8)) - 1  # no bits past numel
        mean, invstd = torch.zeros(c, device="cuda"), torch.ones(c, device="cuda")
        for mask in (drawn & tail, ~drawn & tail):
            args = (g, x, weight, mean, invstd, mask, True, 1e-5, [True, False, False, True], variant)
            call = functools.partial(ops.batch_norm_backward, *args)
            got = _call(call, variant, "grad_residual")
            if got is None:
                assert not _must_support(variant, shape, layout)
                continue
            bits, _ = _unpack(mask, numel)
            want = torch.where(bits, _memory_order(g), torch.zeros((), dtype=dtype, device="cuda"))
            itype = torch.int16 if dtype.itemsize == 2 else torch.int32
            assert torch.equal(_memory_order(got[3]).view(itype), want.view(itype)), f"grad_residual bits {shape}"
            assert got[3].stride() == g.stride()


@pytest.mark.parametrize("variant", VARIANTS, ids=str)
@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16), ids=_name)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_batch_norm_relu_constant_channel(variant, dtype, layout):
    """A constant channel far from zero (x = 1000, so mean = x and var = 0, invstd = 1 / sqrt(eps)) normalizes to
    exactly the bias, 0 here: relu's output and mask must be 0 and its input gradient the bias path only, as in torch.
    (Folding the affine map to x a + (b - mean a) in float32 leaves |mean a| 2^-24, about 2.7e-3 here, and flips the
    mask: found in review, not kept.)"""
    fmt = torch.channels_last if layout == "nhwc" else torch.contiguous_format
    x = torch.full((4, 16, 3, 8), 1000.0, device="cuda", dtype=dtype).contiguous(memory_format=fmt)
    w, b = torch.ones(16, device="cuda"), torch.zeros(16, device="cuda")
    rm, rv = torch.zeros(16, device="cuda"), torch.ones(16, device="cuda")
    got = _call(lambda: ops.batch_norm_relu(x, w, b, rm, rv, True, 0.1, 1e-5, None, None, variant), variant, "const")
    if got is None:
        return
    out, mask, save_mean, save_invstd = got
    assert not out.any(), f"[{variant}] a constant channel must normalize to 0: {out.abs().max().item()}"
    assert not mask.any(), f"[{variant}] relu mask bits set for a zero output"
    g = torch.randn_like(x)
    gx = ops.batch_norm_backward(
        g, x, w, save_mean, save_invstd, mask, True, 1e-5, [True, False, False, False], variant
    )[0]
    assert not gx.any(), f"[{variant}] the relu mask passes no gradient: {gx.abs().max().item()}"


def test_batch_norm_stats_from_conv2d_stats_gpu():
    """bf16 channels-last: conv2d_stats' float32 sums in place of the statistics pass give the plain path's output and
    running statistics within bf16 rounding."""
    x = torch.randn(8, 16, 12, 12, device="cuda", dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last)
    cw = (
        (torch.randn(32, 16, 3, 3, device="cuda") / 12).to(torch.bfloat16).contiguous(memory_format=torch.channels_last)
    )
    out, s, ss = ops.conv2d_stats(x, cw, None, [1, 1], [1, 1], [1, 1], 1, None)
    w, b = torch.rand(32, device="cuda") + 0.5, torch.randn(32, device="cuda")
    runs = {}
    for path in ("plain", "sums"):
        rm, rv = torch.zeros(32, device="cuda"), torch.ones(32, device="cuda")
        sums = (s, ss) if path == "sums" else (None, None)
        y = ops.batch_norm_relu(out, w, b, rm, rv, True, 0.1, 1e-5, *sums, None)[0]
        runs[path] = (y, rm, rv)
    for i, name in enumerate(("output", "running_mean", "running_var")):
        torch.testing.assert_close(runs["sums"][i], runs["plain"][i], rtol=2e-2, atol=2e-2, msg=f"[{name}]")


def test_batch_norm_variant_names():
    x = torch.rand(2, 5, 3, 3, device="cuda")
    with pytest.raises(ValueError, match="'cpu' runs on CPU"):
        ops.batch_norm(x, None, None, None, None, True, 0.1, 1e-5, None, None, "cpu")
    with pytest.raises(ValueError, match="'simple', 'vectorized'"):
        ops.batch_norm(x, None, None, None, None, True, 0.1, 1e-5, None, None, "persistent_v9")
    with pytest.raises(ValueError, match="does not support"):
        ops.batch_norm(x, None, None, None, None, True, 0.1, 1e-5, None, None, "vectorized")


def _fused_blocks(shape, dtype):
    """The fused rung's grid for a channels-last shape (cuda_ops/batch_norm.cu's fused_plan): 256-thread blocks of bx
    8-channel units by by rows, R rows a thread (256 bytes of a unit; 2 rows for float64)."""
    c = shape[1]
    rows, units = torch.Size(shape).numel() // c, c // 8
    bx = 1
    while bx < units and bx < 32:
        bx *= 2
    by, rows_per_thread = 256 // bx, {2: 16, 4: 8, 8: 2}[torch.empty(0, dtype=dtype).element_size()]
    return -(-rows // (by * rows_per_thread)) * -(-units // bx)


@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
def test_batch_norm_fused_single_launch_matches_two(dtype, monkeypatch):
    """The fused rung as one cooperative launch per direction (the forward holds x in shared memory between the
    statistics and the normalize; the backward reads its tile again) and as two launches per direction
    (TORCHEXT_BATCH_NORM_SINGLE=0) runs the same plan in the same order: the same bits. The profiler shows which ran:
    two fused kernels per direction when forced, one where the grid fits one block per multiprocessor (the kernels
    fit two)."""
    from torch.profiler import ProfilerActivity, profile

    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    for shape in ((64, 32, 16, 16), (32, 8, 64, 72), (6, 264, 5, 5)):
        x, r, g, w, b, rm, rv = _make(shape, dtype, "nhwc", seed=11)
        saved = None
        runs = {}
        for single in ("1", "0"):
            monkeypatch.setenv("TORCHEXT_BATCH_NORM_SINGLE", single)
            rm1, rv1 = rm.clone(), rv.clone()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                fwd = ops.batch_norm_add_relu(x, r, w, b, rm1, rv1, True, 0.1, 1e-5, None, None, "fused")
                if saved is None:  # the backward of both runs gets the same inputs
                    saved = fwd
                _, mask, save_mean, save_invstd = saved
                bwd = ops.batch_norm_backward(
                    g, x, w, save_mean, save_invstd, mask, True, 1e-5, [True, True, True, True], "fused"
                )
                torch.cuda.synchronize()
            launches = {
                d: sum(e.count for e in prof.key_averages() if f"batch_norm_fused_{d}_kernel" in e.key)
                for d in ("forward", "backward")
            }
            runs[single] = (tuple(fwd) + (rm1, rv1) + tuple(bwd), launches)
        tag = f"{_name(dtype)}-{shape}"
        for d in ("forward", "backward"):
            forced, free = runs["0"][1][d], runs["1"][1][d]
            assert forced == 2, f"[{tag}] TORCHEXT_BATCH_NORM_SINGLE=0: {forced} fused {d} launches, not 2"
            if _fused_blocks(shape, dtype) <= sms:
                assert free == 1, f"[{tag}] {free} fused {d} launches where one fits, not 1"
        names = ("out", "mask", "save_mean", "save_invstd", "running_mean", "running_var")
        names += ("grad_input", "grad_weight", "grad_bias", "grad_residual")
        for name, one, two in zip(names, runs["1"][0], runs["0"][0], strict=True):
            assert torch.equal(one, two), f"[{tag} {name}] one launch vs two: bits differ"


@pytest.mark.parametrize("single", ["1", "0"], ids=["single-launch", "two-launch"])
def test_batch_norm_counts_num_batches_tracked_once(single, monkeypatch):
    """num_batches_tracked is added to by channel 0's finalize (or the fused rung's last block) on the device: exactly
    1 per training call for every variant, both forms of the fused rung, every kernel path (rows, planes, simple,
    several column blocks), in a CUDA graph replayed 3 times too, and never in eval."""
    monkeypatch.setenv("TORCHEXT_BATCH_NORM_SINGLE", single)
    count = torch.zeros((), dtype=torch.long, device="cuda")
    expected = 0
    for shape in ((3, 16, 5, 7), (2, 8, 4, 6), (3, 5, 3, 3), (6, 264, 5, 5), (64, 32, 16, 16)):
        for layout in LAYOUTS:
            x, r, g, w, b, rm, rv = _make(shape, torch.bfloat16, layout, seed=3)
            for variant in VARIANTS:
                try:
                    ops.batch_norm_add_relu(x, r, w, b, rm, rv, True, 0.1, 1e-5, None, None, variant, count)
                except ValueError as e:  # a named variant that does not support these arguments
                    assert "does not support" in str(e)
                    continue
                expected += 1
                assert count.item() == expected, f"[{shape} {layout} {variant}] {count.item()} != {expected}"
            ops.batch_norm(x, w, b, rm, rv, False, 0.1, 1e-5)
    x, r, g, w, b, rm, rv = _make((8, 16, 4, 4), torch.float32, "nhwc", seed=4)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        ops.batch_norm_relu(x, w, b, rm, rv, True, 0.1, 1e-5, None, None, None, count)  # warm-up
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ops.batch_norm_relu(x, w, b, rm, rv, True, 0.1, 1e-5, None, None, None, count)
    before = count.item()
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    assert count.item() == before + 3, f"[CUDA graph] {count.item()} after 3 replays from {before}"
