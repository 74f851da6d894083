"""add, the residual add where it is not fused (torchext.functional.fork's backward sums gradients with it), against
torch.add: values bit for bit in every floating dtype and layout, gradients, the layout rule, bad inputs, opcheck and
gradcheck. (Double backward: tests/test_double_backward.py; fake kernels: tests/test_fake_parity.py; the forks in a
swapped model: tests/test_fusion.py.)"""

import pytest
import torch
from conftest import device_params, gpu, make_tensor, poison_allocator
from torch._prims_common import is_non_overlapping_and_dense_or_false as is_non_overlapping_and_dense
from torch.library import opcheck

import torchext
import torchext.functional as TF

# add has all four floating dtypes on the CPU too (a bfloat16 model's gradients meet in it).
DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)
SHAPES = [(1,), (7,), (1023,), (3, 7, 10), (4, 6, 5, 9), (0,), (2, 0, 3)]
# (self's layout, other's layout): make_tensor's layouts, the same on both sides and mixed.
LAYOUT_PAIRS = [
    ("contiguous", "contiguous"),
    ("channels_last", "channels_last"),
    ("channels_last", "contiguous"),
    ("contiguous", "channels_last"),
    ("transposed", "contiguous"),
    ("strided", "strided"),
    ("contiguous", "strided"),
    ("expanded", "contiguous"),
    ("contiguous", "expanded"),
    ("offset", "transposed"),
]

# Every shape with every pair, channels-last only for the 4-D shape.
CASES = [
    pytest.param(shape, layouts, id=f"{shape}-{'-'.join(layouts)}")
    for shape in SHAPES
    for layouts in LAYOUT_PAIRS
    if "channels_last" not in layouts or len(shape) == 4
]


def _expected_strides(t: torch.Tensor) -> tuple[int, ...]:
    """The layout rule: self's strides where it is non-overlapping and dense, contiguous ones otherwise."""
    return t.stride() if is_non_overlapping_and_dense(t) else torch.empty(t.shape).stride()


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape, layouts", CASES)
def test_add_matches_torch_bit_for_bit(device, dtype, shape, layouts):
    """torch.add adds the half types in float32 and rounds once, as ours does: every dtype compares exactly. Both
    gradients are grad_output itself."""
    a, b = (make_tensor(shape, dtype, device, layout, requires_grad=True) for layout in layouts)
    before = (a.detach().clone(), b.detach().clone())
    poison_allocator(device, a)
    out = TF.add(a, b)
    expected = torch.add(a, b)
    assert out.dtype == dtype and out.shape == a.shape and out.device == a.device
    assert torch.equal(out, expected), f"[add {layouts} {dtype}] max error {(out - expected).abs().max().item()}"
    assert out.stride() == _expected_strides(a), f"[add {layouts}] strides {out.stride()}, self's {a.stride()}"
    g = make_tensor(shape, dtype, device)
    ga, gb = torch.autograd.grad(out, (a, b), g)
    assert torch.equal(ga, g) and torch.equal(gb, g), f"[add {layouts}] the gradients are not grad_output"
    assert torch.equal(a.detach(), before[0]) and torch.equal(b.detach(), before[1]), "an input was modified"


@pytest.mark.parametrize("device", device_params())
def test_add_special_values(device):
    """Signed zeros, infinities (inf - inf is NaN), NaN and a sum that overflows float32, as torch's."""
    a = torch.tensor([0.0, -0.0, -0.0, float("inf"), float("inf"), float("nan"), 3e38, 1e-45], device=device)
    b = torch.tensor([-0.0, 0.0, -0.0, -float("inf"), 1.0, 1.0, 3e38, 1e-45], device=device)
    out, expected = TF.add(a, b), torch.add(a, b)
    assert torch.equal(out.isnan(), expected.isnan()), f"NaN positions: {out} vs {expected}"
    keep = ~expected.isnan()
    assert torch.equal(out[keep], expected[keep]) and torch.equal(out[keep].signbit(), expected[keep].signbit())


@pytest.mark.parametrize("device", device_params())
def test_add_gradcheck(device):
    for layouts in (("contiguous", "contiguous"), ("transposed", "channels_last")):
        shape = (2, 3, 4, 5)
        a, b = (make_tensor(shape, torch.float64, device, layout, requires_grad=True) for layout in layouts)
        assert torch.autograd.gradcheck(TF.add, (a, b)), f"[add {layouts}]"


@pytest.mark.parametrize("device", device_params())
def test_add_opcheck(device):
    for layouts in (("contiguous", "contiguous"), ("channels_last", "contiguous"), ("strided", "transposed")):
        a, b = (make_tensor((2, 3, 4, 5), torch.float32, device, layout, requires_grad=True) for layout in layouts)
        opcheck(torch.ops.torchext.add.default, (a, b))


def test_add_bad_inputs_name_the_argument():
    x = torch.randn(4, 5)
    with pytest.raises(ValueError, match=r"`other` must have the same shape as `self` \[4, 5\], got \[1, 5\]"):
        TF.add(x, x[:1])  # no broadcasting
    with pytest.raises(TypeError, match="`other` must have the same dtype as `self` \\(Float\\), got Double"):
        TF.add(x, x.double())  # no type promotion
    with pytest.raises(TypeError, match="`self` must be float32, float64, float16 or bfloat16, got Long"):
        TF.add(torch.arange(4), torch.arange(4))
    with pytest.raises(RuntimeError, match=r"`other` must be on the same device as `self` \(cpu\), got meta"):
        TF.add(x, x.to("meta"))  # the meta kernel is the fake, with the same checks
    with pytest.raises(TypeError, match="argument `other` must be a Tensor, got float"):
        TF.add(x, 1.0)
    with pytest.raises(TypeError, match="argument `input` must be a Tensor, got NoneType"):
        torchext.ops.add(None, x)


def test_add_keeps_its_dtype_under_cpu_autocast():
    """No autocast rule: its kernels take every floating dtype and its operands share one (torch's add promotes)."""
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert TF.add(x, y).dtype == torch.float32
        assert TF.add(x.bfloat16(), y.bfloat16()).dtype == torch.bfloat16


@gpu
def test_add_rejects_mixed_devices():
    with pytest.raises(RuntimeError, match=r"`other` must be on the same device as `self` \(cuda:0\), got cpu"):
        TF.add(torch.ones(3, device="cuda"), torch.ones(3))
    with pytest.raises(RuntimeError, match=r"`other` must be on the same device as `self` \(cpu\), got cuda:0"):
        TF.add(torch.ones(3), torch.ones(3, device="cuda"))


@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("n", [1, 7, 8, 1023, 4097, 65537])
@pytest.mark.parametrize("offsets", [(0, 0), (1, 0), (0, 3), (5, 5)], ids=str)
def test_add_cuda_odd_sizes_and_misaligned_storage(dtype, n, offsets):
    """Sizes that are not a multiple of the 16-byte vector (the tail), and views starting inside a vector (the
    one-element path): the output starts as NaN (poisoned), so an element the kernel skips shows."""
    a, b = (torch.randn(n + off, device="cuda").to(dtype)[off:] for off in offsets)
    poison_allocator("cuda", a)
    out = TF.add(a, b)
    assert torch.equal(out, torch.add(a, b)), f"[add n={n} offsets={offsets} {dtype}]"
