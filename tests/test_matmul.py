"""torchext.matmul against torch.matmul: bit-exact integer products for every version of the CUDA ladder (and the
CPU GEMM with each of its micro-kernels), transposed / non-contiguous / batched / broadcast / empty operands,
low-precision accuracy against a float64 reference, tf32 permission, gradients, opcheck and errors."""

import pytest
import torch
from conftest import LAYOUTS, assert_accurate, device_params, gpu, make_tensor, poison_allocator
from torch.library import opcheck

import torchext
from torchext.ops.matmul import MATMUL_KERNELS

TENSOR_CORE_KERNELS = ("mma_sync", "wgmma")
EXACT_SHAPES = [(1, 1, 1), (7, 13, 5), (1023, 1025, 17), (17, 1023, 1025)]  # (M, K, N)
BIG_SHAPE = (4096, 4096, 4096)


def kernel_params(dtypes_cpu=(torch.float32, torch.float64), dtypes_cuda=(torch.float32, torch.float64,
                  torch.float16, torch.bfloat16)):  # fmt: skip
    """(device, kernel, dtype): the CPU GEMM (kernel None), then every version of the ladder on CUDA."""
    out = [pytest.param("cpu", None, dt, id=f"cpu-{_name(dt)}") for dt in dtypes_cpu]
    for kernel in MATMUL_KERNELS:
        for dt in dtypes_cuda:
            out.append(pytest.param("cuda", kernel, dt, id=f"cuda-{kernel}-{_name(dt)}", marks=gpu))
    return out


def _name(dtype):
    return str(dtype).split(".")[-1]


class allow_tf32:
    """Sets torch's tf32 permission for matmul inside the block, restoring it after."""

    def __init__(self, allow: bool):
        self.allow = allow

    def __enter__(self):
        self.before = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = self.allow

    def __exit__(self, *exc):
        torch.backends.cuda.matmul.allow_tf32 = self.before


def tf32_for(kernel, dtype) -> bool:
    """The tensor-core kernels take float32 only as tf32; integer inputs below 2^11 are exact in tf32."""
    return kernel in TENSOR_CORE_KERNELS and dtype == torch.float32


def run(a, b, kernel):
    """torchext.matmul(a, b, kernel), or skip where matmul_kernel says this kernel cannot run these arguments
    on this GPU (an architecture, dtype or alignment rule)."""
    if kernel is not None:
        try:
            assert torchext.ops.matmul_kernel(a, b, kernel) == kernel
        except NotImplementedError as e:
            pytest.skip(f"{kernel}: {e}")
    return torchext.matmul(a, b, kernel)


def layout(t, kind):
    """t's values in the given layout: contiguous, transposed (column-major matrices) or strided (every other
    element of the last dimension of a larger buffer)."""
    if kind == "contiguous":
        return t.contiguous()
    if kind == "transposed":
        return t.mT.contiguous().mT
    big = torch.zeros(t.shape[:-1] + (2 * t.shape[-1],), dtype=t.dtype, device=t.device)
    big[..., ::2] = t
    return big[..., ::2]


def integers(shape, dtype, device, kind="contiguous"):
    """Integer values in [-3, 3]: every product and sum of up to 2^20 terms is exact in float32 accumulation, and
    the one rounding to a 16-bit output is that of the exact result."""
    return layout(torch.randint(-3, 4, shape, device=device).to(dtype), kind)


def assert_exact(c, a, b, what):
    expected = torch.matmul(a.double(), b.double()).to(c.dtype)
    assert c.shape == expected.shape, f"[{what}] shape {tuple(c.shape)} != {tuple(expected.shape)}"
    assert c.is_contiguous(), f"[{what}] output must be contiguous"
    mismatch = (c != expected).sum().item()
    assert mismatch == 0, f"[{what}] {mismatch} of {c.numel()} elements differ from the exact product"


# Shapes whose grid has fewer tiles than any Hopper GPU has multiprocessors, with a long k: v2-v5 cut k into chunks
# (split-K, cuda_ops/matmul_simt.cu) and add the chunks' partial sums up in a second kernel. k = 3000 leaves a short
# last chunk; the batched case puts each batch's chunks side by side in the workspace.
SPLIT_K_CASES = [((10, 4096, 10), 1), ((40, 3000, 100), 1), ((130, 1000, 7), 1), ((20, 777, 30), 3)]
SPLIT_K_KERNELS = ("smem_tiled", "register_blocked", "vectorized", "warp_tiled")


@gpu
@pytest.mark.parametrize("kernel", SPLIT_K_KERNELS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16], ids=_name)
@pytest.mark.parametrize("case", SPLIT_K_CASES, ids=str)
def test_matmul_split_k_exact_and_deterministic(kernel, dtype, case):
    (m, k, n), batch = case
    a, b = integers((batch, m, k), dtype, "cuda"), integers((batch, k, n), dtype, "cuda")
    poison_allocator("cuda", torch.empty(batch, m, n, dtype=dtype))
    c = run(a, b, kernel)
    assert_exact(c, a, b, f"{kernel} split-K {case}")
    a, b = make_tensor((batch, m, k), dtype, "cuda"), make_tensor((batch, k, n), dtype, "cuda")
    first, second = torchext.matmul(a, b, kernel), torchext.matmul(a, b, kernel)
    assert torch.equal(first, second), "split-K sums its chunks in a fixed order: the same bits every call"
    assert_accurate(first, torch.matmul(a, b), torch.matmul(a.double(), b.double()), f"{kernel} split-K {case}")


# Products of few 128 x 256 tiles (at most half of any Hopper GPU's multiprocessors) and a long k: wgmma cuts the
# tiles along k over all blocks (stream-K, cuda_ops/matmul_wgmma.cu), and the blocks hand partial sums to each tile's
# owner through the workspace. (M, K, N), batch, B broadcast over the batch. Leading dimensions are multiples of 8
# elements, as TMA needs 16-byte aligned rows.
STREAM_K_CASES = [((296, 4000, 520), 1, False), ((200, 2000, 304), 3, False), ((200, 2000, 304), 3, True),
                  ((1000, 3000, 1104), 1, False)]  # fmt: skip


def require_wgmma(a, b):
    """Skip on a GPU without wgmma; on an sm_90 GPU, fail (rather than skip) if wgmma does not take (a, b)."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("wgmma needs an sm_90 GPU")
    assert torchext.ops.matmul_kernel(a, b, "wgmma") == "wgmma"


@gpu
@pytest.mark.parametrize(
    "dtype,a_layout,b_layout",
    [
        (torch.bfloat16, "contiguous", "contiguous"),
        (torch.bfloat16, "transposed", "transposed"),
        (torch.float16, "contiguous", "contiguous"),
        (torch.float16, "transposed", "contiguous"),
        (torch.float32, "contiguous", "transposed"),  # tf32 wgmma reads K-major A and B only
    ],
    ids=str,
)
@pytest.mark.parametrize("case", STREAM_K_CASES, ids=str)
def test_matmul_wgmma_stream_k_exact_and_deterministic(dtype, a_layout, b_layout, case):
    (m, k, n), batch, broadcast = case
    b_shape = (k, n) if broadcast else (batch, k, n)
    with allow_tf32(dtype == torch.float32):
        a, b = integers((batch, m, k), dtype, "cuda", a_layout), integers(b_shape, dtype, "cuda", b_layout)
        require_wgmma(a, b)
        poison_allocator("cuda", torch.empty(batch, m, n, dtype=dtype))
        c = torchext.matmul(a, b, "wgmma")
        assert_exact(c, a, b, f"wgmma stream-K {case}")
        a = layout(make_tensor((batch, m, k), dtype, "cuda"), a_layout)
        b = layout(make_tensor(b_shape, dtype, "cuda"), b_layout)
        first, second = torchext.matmul(a, b, "wgmma"), torchext.matmul(a, b, "wgmma")
        assert torch.equal(first, second), "stream-K adds the partial sums in a fixed order: the same bits every call"
        assert_accurate(first, torch.matmul(a, b), torch.matmul(a.double(), b.double()), f"wgmma stream-K {case}")


@gpu
def test_matmul_default_kernel_for_thin_and_few_tile_products():
    """A thin product of few flops (a classifier) takes smem_tiled with split-K, in every dtype; a float32 product
    of few 128 x 128 tiles and a long k takes warp_tiled, split along k."""
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        x, w = torch.randn(512, 512, device="cuda", dtype=dtype), torch.randn(10, 512, device="cuda", dtype=dtype)
        assert torchext.ops.matmul_kernel(x, w.t()) == "smem_tiled", dtype
        assert torchext.ops.matmul_kernel(w, x) == "smem_tiled", dtype  # the weight gradient's (10, 512) output
    a, b = torch.randn(256, 4096, device="cuda"), torch.randn(4096, 256, device="cuda")
    assert torchext.ops.matmul_kernel(a, b) == "warp_tiled"


@pytest.mark.parametrize("device,kernel,dtype", kernel_params())
@pytest.mark.parametrize("shape", EXACT_SHAPES + [pytest.param(BIG_SHAPE, marks=[gpu, pytest.mark.slow])], ids=str)
def test_matmul_exact(device, kernel, dtype, shape):
    if device == "cpu" and shape == BIG_SHAPE:
        pytest.skip("GPU only")
    m, k, n = shape
    a, b = integers((m, k), dtype, device), integers((k, n), dtype, device)
    with allow_tf32(tf32_for(kernel, dtype)):
        poison_allocator(device, torch.empty(m, n, dtype=dtype))
        c = run(a, b, kernel)
    assert_exact(c, a, b, f"{kernel} {shape}")


@pytest.mark.parametrize("device,kernel,dtype", kernel_params((torch.float32,), (torch.float32, torch.bfloat16)))
@pytest.mark.parametrize("a_layout", LAYOUTS)
@pytest.mark.parametrize("b_layout", LAYOUTS)
def test_matmul_exact_layouts(device, kernel, dtype, a_layout, b_layout):
    """Transposed and non-contiguous operands are read through their strides, by every kernel that takes them."""
    a = integers((37, 45), dtype, device, a_layout)
    b = integers((45, 29), dtype, device, b_layout)
    with allow_tf32(tf32_for(kernel, dtype)):
        c = run(a, b, kernel)
    assert_exact(c, a, b, f"{kernel} a {a_layout}, b {b_layout}")


@pytest.mark.parametrize("device,kernel,dtype", kernel_params((torch.float32,), (torch.float32,)))
def test_matmul_exact_misaligned_views(device, kernel, dtype):
    """Views that start one element into their storage (no 16-byte alignment) and odd leading dimensions."""
    a = integers((33, 66), dtype, device)[1:, 1:]
    b = integers((66, 41), dtype, device)[1:, 1:]
    with allow_tf32(tf32_for(kernel, dtype)):
        c = run(a, b, kernel)
    assert_exact(c, a, b, f"{kernel} misaligned")


# (a shape, b shape, how a is laid out): folding into one GEMM, batch strides, broadcasting, host loops.
BATCH_CASES = {
    "fold-1": ((2, 7, 5), (5, 3), "contiguous"),
    "fold-2": ((2, 3, 7, 5), (5, 3), "contiguous"),
    "fold-m1": ((4, 1, 5), (5, 3), "contiguous"),
    "no-fold": ((2, 7, 5), (5, 3), "batch-inside"),
    "batched": ((3, 7, 5), (3, 5, 4), "contiguous"),
    "batched-transposed": ((3, 7, 5), (3, 5, 4), "transposed"),
    "a-broadcast": ((7, 5), (4, 5, 3), "contiguous"),
    "b-broadcast": ((2, 3, 7, 5), (1, 5, 4), "contiguous"),
    "both-broadcast": ((2, 1, 7, 5), (3, 5, 4), "contiguous"),
    "host-loop": ((2, 1, 7, 5), (1, 3, 5, 4), "contiguous"),
    "permuted-batch": ((2, 3, 7, 5), (2, 3, 5, 4), "batch-inside"),
}


def batch_operand(shape, kind, dtype, device, random=False):
    """Integer (or uniform random) values of the given shape: contiguous, transposed matrices, or "batch-inside"
    (memory order (M, *batch, K): the batch dimensions cannot fold into M)."""

    def values(s):
        return make_tensor(s, dtype, device) if random else integers(s, dtype, device)

    if kind == "transposed":
        return values(shape).mT.contiguous().mT
    if kind == "batch-inside":
        return values((shape[-2], *shape[:-2], shape[-1])).movedim(0, -2)
    return values(shape)


@pytest.mark.parametrize("device,kernel,dtype", kernel_params((torch.float32, torch.float64), (torch.float32,)))
@pytest.mark.parametrize("case", BATCH_CASES)
def test_matmul_exact_batched(device, kernel, dtype, case):
    a_shape, b_shape, a_kind = BATCH_CASES[case]
    a = batch_operand(a_shape, a_kind, dtype, device)
    b = integers(b_shape, dtype, device)
    with allow_tf32(tf32_for(kernel, dtype)):
        c = run(a, b, kernel)
    assert_exact(c, a, b, f"{kernel} {case}")


def random_strided(shape, dtype, device, gen):
    """Integer values of `shape` in a random memory layout: dimensions stored in a random order, sometimes every
    other element of a larger buffer, size-1 dimensions sometimes expanded from stride 0."""
    order = torch.randperm(len(shape), generator=gen).tolist()
    stored = [shape[d] for d in order]
    step = [1 + int(torch.randint(0, 4, (), generator=gen) == 0) for _ in shape]
    base = integers([s * k for s, k in zip(stored, step)], dtype, device)
    view = base[tuple(slice(None, None, k) for k in step)]
    t = view.permute(*[order.index(d) for d in range(len(shape))])
    for d in range(len(shape)):
        if shape[d] > 1 and torch.rand((), generator=gen) < 0.15:
            t = t.narrow(d, 0, 1).expand(*shape)
    return t


@pytest.mark.parametrize("device,kernel,dtype", kernel_params((torch.float32,), (torch.float32,)))
def test_matmul_exact_random_layouts(device, kernel, dtype):
    """Random batch shapes, broadcasting and memory layouts (the stride plan's folds, merges and host loops)."""
    gen = torch.Generator().manual_seed(1234)
    sizes = (1, 2, 3)
    for case in range(100):
        nb = int(torch.randint(0, 4, (), generator=gen))
        batch = [sizes[int(torch.randint(0, 3, (), generator=gen))] for _ in range(nb)]
        a_batch = [d if torch.rand((), generator=gen) < 0.7 else 1 for d in batch]
        b_batch = [d if torch.rand((), generator=gen) < 0.7 else 1 for d in batch]
        a_batch = a_batch[int(torch.randint(0, nb + 1, (), generator=gen)) :]
        b_batch = b_batch[int(torch.randint(0, nb + 1, (), generator=gen)) :]
        m, k, n = (int(x) for x in torch.randint(1, 9, (3,), generator=gen))
        a = random_strided([*a_batch, m, k], dtype, device, gen)
        b = random_strided([*b_batch, k, n], dtype, device, gen)
        with allow_tf32(tf32_for(kernel, dtype)):
            try:
                c = torchext.matmul(a, b, kernel)
            except NotImplementedError:
                continue
        assert_exact(c, a, b, f"{kernel} case {case}: a {tuple(a.shape)} {a.stride()}, b {tuple(b.shape)} {b.stride()}")


EMPTY_CASES = [((0, 5), (5, 3)), ((7, 0), (0, 3)), ((7, 5), (5, 0)), ((0, 7, 5), (5, 3)), ((2, 0, 5), (2, 5, 3)),
               ((2, 7, 0), (2, 0, 3)), ((3, 7, 5), (0, 1, 5, 3))]  # fmt: skip


@pytest.mark.parametrize("device,kernel,dtype", kernel_params((torch.float32,), (torch.float32,)))
@pytest.mark.parametrize("shapes", EMPTY_CASES, ids=str)
def test_matmul_empty(device, kernel, dtype, shapes):
    """Empty results run nothing; k == 0 gives zeros."""
    a, b = integers(shapes[0], dtype, device), integers(shapes[1], dtype, device)
    with allow_tf32(tf32_for(kernel, dtype)):
        poison_allocator(device, torch.empty(torch.matmul(a, b).shape))
        c = run(a, b, kernel)
    assert_exact(c, a, b, f"{kernel} {shapes}")


@pytest.mark.parametrize("isa", ["avx512", "avx2", "generic"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matmul_cpu_micro_kernels(isa, dtype, monkeypatch):
    """Each CPU micro-kernel this machine runs (TORCHEXT_CPU_GEMM_ISA lowers the choice), on a shape with several
    K blocks and row blocks, partial edge tiles, and a transposed operand."""
    monkeypatch.setenv("TORCHEXT_CPU_GEMM_ISA", isa)
    a = integers((251, 601), dtype, "cpu")
    b = integers((601, 75), dtype, "cpu", "transposed")
    assert_exact(torchext.matmul(a, b), a, b, f"cpu {isa}")
    assert_exact(torchext.matmul(b.mT, a.mT), b.mT, a.mT, f"cpu {isa} transposed")


def test_matmul_cpu_rejects_bad_isa_setting(monkeypatch):
    monkeypatch.setenv("TORCHEXT_CPU_GEMM_ISA", "sse9")
    with pytest.raises(ValueError, match="TORCHEXT_CPU_GEMM_ISA must be"):
        torchext.matmul(torch.ones(2, 2), torch.ones(2, 2))


def test_matmul_cpu_result_does_not_depend_on_threads():
    a, b = torch.randn(300, 200), torch.randn(200, 150)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = torchext.matmul(a, b)
        torch.set_num_threads(max(2, before))
        many = torchext.matmul(a, b)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, many), "the CPU GEMM's result changed with the thread count"


# Accuracy against a float64 reference, at most twice torch's own error (conftest.assert_accurate).
@pytest.mark.parametrize("device,kernel,dtype", kernel_params())
@pytest.mark.parametrize("shape", [(64, 300, 96), (1023, 1025, 17)], ids=str)
def test_matmul_accuracy(device, kernel, dtype, shape):
    m, k, n = shape
    a, b = make_tensor((m, k), dtype, device), make_tensor((k, n), dtype, device)
    with allow_tf32(tf32_for(kernel, dtype)):
        c = run(a, b, kernel)
        theirs = torch.matmul(a, b)
    assert_accurate(c, theirs, torch.matmul(a.double(), b.double()), f"{kernel} {_name(dtype)} {shape}")


@gpu
@pytest.mark.parametrize("kernel", [None, *TENSOR_CORE_KERNELS])
def test_matmul_tf32_accuracy(kernel):
    """With tf32 allowed, float32 may use tensor cores: error within twice cuBLAS's tf32 error."""
    a, b = make_tensor((512, 768), torch.float32, "cuda"), make_tensor((768, 384), torch.float32, "cuda")
    with allow_tf32(True):
        c = run(a, b, kernel)
        theirs = torch.matmul(a, b)
    assert_accurate(c, theirs, torch.matmul(a.double(), b.double()), f"tf32 {kernel}")


@gpu
@pytest.mark.parametrize("a_t", [False, True], ids=["a_rowmajor", "a_colmajor"])
@pytest.mark.parametrize("b_t", [False, True], ids=["b_rowmajor", "b_colmajor"])
@pytest.mark.parametrize("batch", [None, 3], ids=["2d", "batched"])
def test_matmul_tf32_default_every_layout(a_t, b_t, batch):
    """tf32 wgmma reads K-major operands only; the default path transposes the others into K-major copies
    (cuda_ops::transpose_copy) on sm_90. Every layout, 2-D and batched with b broadcast: same accuracy bound."""
    lead = () if batch is None else (batch,)
    a = make_tensor((*lead, 512, 768), torch.float32, "cuda")  # sizes where cuBLAS itself uses tf32
    b = make_tensor((768, 384), torch.float32, "cuda")
    if a_t:
        a = a.mT.contiguous().mT
    if b_t:
        b = b.mT.contiguous().mT
    if batch is not None:
        b = b.expand(batch, 768, 384)
    with allow_tf32(True):
        c = torchext.matmul(a, b)
        theirs = torch.matmul(a, b)
    assert_accurate(c, theirs, torch.matmul(a.double(), b.double()), f"tf32 default a_t={a_t} b_t={b_t} {batch}")


@gpu
def test_matmul_respects_tf32_setting():
    """With tf32 off (torch's default), float32 stays float32: no tensor-core kernel, float32-level error."""
    a, b = make_tensor((512, 768), torch.float32, "cuda"), make_tensor((768, 384), torch.float32, "cuda")
    with allow_tf32(False):
        assert torchext.ops.matmul_kernel(a, b) not in TENSOR_CORE_KERNELS
        for kernel in TENSOR_CORE_KERNELS:
            with pytest.raises(NotImplementedError, match=f"kernel '{kernel}' cannot run"):
                torchext.ops.matmul_kernel(a, b, kernel)
        c, theirs = torchext.matmul(a, b), torch.matmul(a, b)
    assert_accurate(c, theirs, torch.matmul(a.double(), b.double()), "float32 without tf32")


@gpu
def test_matmul_default_kernel_uses_tensor_cores_for_16_bit():
    if torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("mma.sync needs sm_80")
    a = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
    assert torchext.ops.matmul_kernel(a, a) in TENSOR_CORE_KERNELS


def test_matmul_kernel_on_cpu():
    a = torch.ones(3, 4)
    assert torchext.ops.matmul_kernel(a, a.t()) == "cpu"
    assert torchext.ops.matmul_kernel(a, a.t(), "cpu") == "cpu"
    assert torch.equal(torchext.matmul(a, a.t(), "cpu"), torch.full((3, 3), 4.0))


@gpu
def test_matmul_kernel_names_every_ladder_version():
    a = torch.ones(64, 64, device="cuda")
    assert torchext.ops.matmul_kernel(a, a) in MATMUL_KERNELS
    assert torchext.ops.matmul_kernel(a, a, "naive") == "naive"


@gpu
def test_matmul_on_a_side_stream():
    a, b = integers((300, 200), torch.float32, "cuda"), integers((200, 100), torch.float32, "cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        c = torchext.matmul(a, b)
    torch.cuda.current_stream().wait_stream(stream)
    assert_exact(c, a, b, "side stream")


# Gradients.
GRAD_CASES = ["fold-1", "no-fold", "batched", "a-broadcast", "both-broadcast", "host-loop"]


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("case", GRAD_CASES)
def test_matmul_backward_matches_torch(device, case):
    a_shape, b_shape, a_kind = BATCH_CASES[case]
    a = batch_operand(a_shape, a_kind, torch.float32, device).requires_grad_(True)
    b = integers(b_shape, torch.float32, device).requires_grad_(True)
    grad = integers(torch.matmul(a, b).shape, torch.float32, device)
    ga, gb = torch.autograd.grad(torchext.matmul(a, b), (a, b), grad)
    ga_ref, gb_ref = torch.autograd.grad(torch.matmul(a.double(), b.double()), (a, b), grad.double())
    assert ga.shape == a.shape and gb.shape == b.shape
    assert torch.equal(ga, ga_ref.float()), f"[a.grad {case}]"
    assert torch.equal(gb, gb_ref.float()), f"[b.grad {case}]"


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("case", ["fold-1", "no-fold", "both-broadcast", "host-loop"])
def test_matmul_gradcheck(device, case):
    a_shape, b_shape, a_kind = BATCH_CASES[case]
    a = batch_operand(a_shape, a_kind, torch.float64, device, random=True).requires_grad_(True)
    b = make_tensor(b_shape, torch.float64, device, requires_grad=True)
    assert torch.autograd.gradcheck(torchext.matmul, (a, b))


@pytest.mark.parametrize("device", device_params())
def test_matmul_opcheck(device):
    cases = [
        (make_tensor((5, 6), torch.float32, device), make_tensor((6, 4), torch.float32, device, "transposed")),
        (make_tensor((2, 5, 6), torch.float32, device, requires_grad=True), make_tensor((6, 3), torch.float32, device)),
        (make_tensor((3, 5, 6), torch.float32, device), make_tensor((1, 6, 3), torch.float32, device)),
    ]
    for a, b in cases:
        opcheck(torch.ops.torchext.matmul.default, (a, b))
    kernel = "cpu" if device == "cpu" else "naive"
    opcheck(torch.ops.torchext.matmul.default, cases[0], {"variant": kernel})


def test_matmul_cpu_autocast_runs_float32():
    a, b = torch.randn(4, 5), torch.randn(5, 3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torchext.matmul(a, b).dtype == torch.float32


@gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_matmul_cuda_autocast_casts_like_torch(dtype):
    a, b = torch.randn(4, 5, device="cuda"), torch.randn(5, 3, device="cuda")
    with torch.autocast("cuda", dtype=dtype):
        ours, theirs = torchext.matmul(a, b), torch.matmul(a, b)
        assert torchext.ops.matmul_kernel(a, b) == torchext.ops.matmul_kernel(a.to(dtype), b.to(dtype))
    assert ours.dtype == theirs.dtype == dtype
    a64 = a.double()
    with torch.autocast("cuda", dtype=dtype):
        assert torchext.matmul(a64, a64.t()).dtype == torch.float64, "autocast leaves float64 alone"


def test_matmul_registered_on_every_backend():
    from torchext import _loader

    for name in ("matmul", "matmul_kernel", "linear", "linear_backward"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"torchext::{name}", "CPU")
        if _loader.built_with_cuda():
            assert torch._C._dispatch_has_kernel_for_dispatch_key(f"torchext::{name}", "CUDA")
    assert torchext.matmul is torchext.ops.matmul and callable(torchext.functional.matmul)


# Errors name the argument.
def test_matmul_rejects_bad_input():
    a = torch.ones(5, 5)
    with pytest.raises(ValueError, match=r"`b` must have 5 rows to match `a`'s 5 columns, got 7"):
        torchext.matmul(a, torch.ones(7, 3))
    with pytest.raises(ValueError, match=r"`a` must have at least 2 dimensions"):
        torchext.matmul(torch.ones(5), a)
    with pytest.raises(ValueError, match=r"`b` must have at least 2 dimensions"):
        torchext.matmul(a, torch.ones(5))
    with pytest.raises(ValueError, match=r"batch dimensions of `a` \[2\] and `b` \[3\] do not broadcast"):
        torchext.matmul(torch.ones(2, 5, 5), torch.ones(3, 5, 5))
    with pytest.raises(TypeError, match=r"`a` must be float32 or float64 on CPU"):
        torchext.matmul(torch.ones(5, 5, dtype=torch.int64), torch.ones(5, 5, dtype=torch.int64))
    with pytest.raises(TypeError, match=r"`a` must be float32 or float64 on CPU"):
        torchext.matmul(a.half(), a.half())
    with pytest.raises(TypeError, match=r"`b` must have the same dtype as `a`"):
        torchext.matmul(a, a.double())
    with pytest.raises(ValueError, match=r"unknown kernel 'fastest'; valid names are 'cpu'"):
        torchext.matmul(a, a, "fastest")
    with pytest.raises(ValueError, match=r"kernel 'wgmma' runs on CUDA tensors"):
        torchext.matmul(a, a, "wgmma")
    with pytest.raises(ValueError, match=r"unknown kernel"):
        torchext.ops.matmul_kernel(a, a, "fastest")


@gpu
def test_matmul_rejects_bad_input_on_cuda():
    a = torch.ones(5, 5, device="cuda")
    with pytest.raises(RuntimeError, match=r"`b` must be on the same device as `a`"):
        torchext.matmul(a, torch.ones(5, 5))
    with pytest.raises(ValueError, match=r"unknown kernel 'fastest'; valid names on CUDA are 'naive', 'smem_tiled'"):
        torchext.matmul(a, a, "fastest")
    with pytest.raises(ValueError, match=r"kernel 'cpu' runs on CPU tensors"):
        torchext.matmul(a, a, "cpu")
    with pytest.raises(TypeError, match=r"`a` must be float32, float64, float16 or bfloat16 on CUDA"):
        torchext.matmul(a.long(), a.long())
    for kernel in TENSOR_CORE_KERNELS:  # tensor cores do not take float64
        with pytest.raises(NotImplementedError, match=f"kernel '{kernel}' cannot run these arguments"):
            torchext.matmul(a.double(), a.double(), kernel)
        with pytest.raises(NotImplementedError, match=f"kernel '{kernel}' cannot run these arguments"):
            torchext.ops.matmul_kernel(a.double(), a.double(), kernel)
