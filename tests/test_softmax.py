"""softmax and log_softmax over the last dimension against PyTorch, forward and backward, on every kernel path."""

import pytest
import torch
import torch.nn.functional as F
from conftest import (
    LAYOUTS,
    assert_accurate,
    device_dtype_params,
    device_params,
    gpu,
    make_tensor,
    max_error,
    poison_allocator,
)
from torch.library import opcheck

import torchext

# id -> (torchext function, torch reference over the last dimension, op name)
SOFTMAXES = {
    "softmax": (torchext.ops.softmax, lambda x: torch.softmax(x, -1), "softmax"),
    "log_softmax": (torchext.ops.log_softmax, lambda x: torch.log_softmax(x, -1), "log_softmax"),
}

# Widths around every boundary of the CUDA paths (tile <= 32 < warp <= 1024 < block) and tiles of rows that end
# part-way (300 rows of 10: the tile kernel takes 256 or 128 rows per block). 1-D, 3-D and empty tensors too.
SHAPES = [
    (5, 1),
    (3, 7),
    (300, 10),
    (4, 31),
    (4, 32),
    (4, 33),
    (3, 1023),
    (2, 1024),
    (2, 1025),
    (2, 2047),
    (1023,),
    (2, 3, 10),
    (0, 10),
    (4, 0),
    (0,),
]
# Wide rows, GPU only to keep CPU CI fast: the register-cached block path up to its capacity (32768 forward and
# 16384 backward in float32) and the two-pass path past it.
WIDE_SHAPES = [(3, 4096 + 3), (2, 16384), (2, 16384 + 8), (2, 32768), (2, 32768 + 3), (1, 65536 + 8)]


def _shape_params():
    params = [pytest.param(s, id=str(s)) for s in SHAPES]
    params += [pytest.param(s, id=str(s), marks=gpu) for s in WIDE_SHAPES]
    return params


def _check_forward_backward(name, x, grad, what):
    """Forward and x.grad of ours and torch's, against a float64 reference; no input modified."""
    ours_fn, torch_fn, _ = SOFTMAXES[name]
    x = x.detach().requires_grad_(True)
    x64 = x.detach().to(torch.float64).requires_grad_(True)
    x_before, grad_before = x.detach().clone(), grad.clone()

    poison_allocator(x.device, x)
    y = ours_fn(x)
    y_torch = torch_fn(x)
    y_ref = torch_fn(x64)
    assert y.dtype == x.dtype and y.shape == x.shape and y.is_contiguous(), f"[{what} forward] metadata"
    assert_accurate(y, y_torch, y_ref, f"{what} forward")

    poison_allocator(x.device, x)
    (gx,) = torch.autograd.grad(y, x, grad)
    (gx_torch,) = torch.autograd.grad(y_torch, x, grad)
    (gx_ref,) = torch.autograd.grad(y_ref, x64, grad.to(torch.float64))
    assert gx.dtype == x.dtype and gx.shape == x.shape, f"[{what} x.grad] metadata"
    assert_accurate(gx, gx_torch, gx_ref, f"{what} x.grad")
    assert torch.equal(x.detach(), x_before) and torch.equal(grad, grad_before), f"[{what}] an input was modified"


@pytest.mark.parametrize("name", SOFTMAXES)
@pytest.mark.parametrize("device,dtype", device_dtype_params())
@pytest.mark.parametrize("shape", _shape_params())
@pytest.mark.parametrize("layout", LAYOUTS)
def test_softmax_matches_torch(name, device, dtype, shape, layout):
    x = make_tensor(shape, dtype, device, layout)
    grad = make_tensor(shape, dtype, device, layout)
    _check_forward_backward(name, x, grad, f"{name} {shape} {layout}")


# One width per CUDA path: tile, warp (smallest and largest bucket), block (smallest and largest bucket forward),
# two-pass (past the block path's capacity: 16384 backward, 32768 forward).
PATH_WIDTHS = {
    "tile": [10, 32],
    "warp": [33, 1000, 1024],
    "block": [1025, 8192 + 2, 16384, 32768],
    "two_pass": [16384 + 8, 32768 + 8],
}


@gpu
@pytest.mark.parametrize("name", SOFTMAXES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("path", PATH_WIDTHS)
def test_softmax_kernel_paths_half(name, dtype, path):
    """Every kernel path in the half types, with aligned rows (16-byte vectors), then with a view that starts one
    element into its storage (misaligned: element loads)."""
    for cols in PATH_WIDTHS[path]:
        rows = 300 if cols <= 32 else 5
        x = make_tensor((rows, cols), dtype, "cuda")
        grad = make_tensor((rows, cols), dtype, "cuda")
        _check_forward_backward(name, x, grad, f"{name} {path} {cols} aligned")
        x = make_tensor((rows * cols + 1,), dtype, "cuda")[1:].view(rows, cols)
        grad = make_tensor((rows * cols + 1,), dtype, "cuda")[1:].view(rows, cols)
        assert x.data_ptr() % 16 != 0 and x.is_contiguous()
        _check_forward_backward(name, x, grad, f"{name} {path} {cols} misaligned")


def _extreme_rows(width, device):
    """Rows that need the max subtracted or follow torch's special cases: huge magnitudes, -inf entries, all -inf
    (NaN), one +inf (NaN), one NaN (NaN)."""
    x = torch.empty(6, width, dtype=torch.float64).uniform_(-1, 1)
    x[0] *= 1e4
    x[1] = x[1] * 1e30
    x[2, ::2] = float("-inf")
    x[2, 0] = 0.5 if width == 1 else x[2, 0]
    x[3] = float("-inf")
    x[4, width // 2] = float("inf")
    x[5, width // 3] = float("nan")
    return x.to(device=device, dtype=torch.float32)


@pytest.mark.parametrize("name", SOFTMAXES)
@pytest.mark.parametrize(
    "device,width",
    [pytest.param("cpu", w, id=f"cpu-{w}") for w in (1, 10, 100, 2000)]
    + [pytest.param("cuda", w, id=f"cuda-{w}", marks=gpu) for w in (1, 10, 100, 2000, 40000)],
)
def test_softmax_extreme_values(name, device, width):
    ours_fn, torch_fn, _ = SOFTMAXES[name]
    x = _extreme_rows(width, device)
    y, y_torch = ours_fn(x), torch_fn(x)
    assert max_error(y, y_torch) <= 1e-6, f"[{name} forward, extreme rows] differs from torch"
    assert torch.isnan(y[3:]).all(), f"[{name} forward] rows of all -inf, +inf or NaN must be NaN"
    # Finite rows only for the gradient: the others are NaN in torch as well.
    xf = x[:3].clone().requires_grad_(True)
    x64 = x[:3].to(torch.float64).requires_grad_(True)
    grad = torch.randn_like(xf)
    (gx,) = torch.autograd.grad(ours_fn(xf), xf, grad)
    (gx_torch,) = torch.autograd.grad(torch_fn(xf), xf, grad)
    (gx_ref,) = torch.autograd.grad(torch_fn(x64), x64, grad.to(torch.float64))
    assert_accurate(gx, gx_torch, gx_ref, f"{name} x.grad, extreme rows")


@pytest.mark.parametrize("name", SOFTMAXES)
@pytest.mark.parametrize("device", device_params())
def test_softmax_zero_dim(name, device):
    ours_fn, torch_fn, _ = SOFTMAXES[name]
    x = torch.tensor(1.5, device=device)
    y = ours_fn(x)
    assert y.shape == () and torch.equal(y, torch_fn(x)), f"[{name} 0-dim] differs from torch"


@pytest.mark.parametrize("name", SOFTMAXES)
@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("shape", [(4, 9), (2, 3, 40)], ids=str)
def test_softmax_gradcheck(name, device, shape):
    ours_fn = SOFTMAXES[name][0]
    x = make_tensor(shape, torch.float64, device, requires_grad=True)
    assert torch.autograd.gradcheck(ours_fn, (x,))


@pytest.mark.parametrize("name", SOFTMAXES)
@pytest.mark.parametrize("device", device_params())
def test_softmax_opcheck(name, device):
    op = SOFTMAXES[name][2]
    for layout in ("contiguous", "transposed", "strided"):
        x = make_tensor((5, 6), torch.float32, device, layout, requires_grad=True)
        opcheck(getattr(torch.ops.torchext, op).default, (x,))
    g = make_tensor((5, 6), torch.float32, device)
    y = SOFTMAXES[name][0](make_tensor((5, 6), torch.float32, device))
    opcheck(getattr(torch.ops.torchext, f"{op}_backward").default, (g, y))


def test_softmax_rejects_bad_input():
    with pytest.raises(TypeError, match="torchext::softmax: `self` must be float32 or float64 on CPU"):
        torchext.ops.softmax(torch.arange(4))
    with pytest.raises(TypeError, match="torchext::log_softmax: `self`"):
        torchext.ops.log_softmax(torch.ones(3, dtype=torch.float16))
    with pytest.raises(ValueError, match="`grad_output` must have the same shape as `output`"):
        torch.ops.torchext.softmax_backward(torch.ones(2, 3), torch.ones(2, 4))
    with pytest.raises(TypeError, match="`grad_output` must have the same dtype as `output`"):
        torch.ops.torchext.log_softmax_backward(torch.ones(3, dtype=torch.float64), torch.ones(3))
    with pytest.raises(TypeError, match="torchext::softmax_backward: `output`"):
        torch.ops.torchext.softmax_backward(torch.ones(3, dtype=torch.int32), torch.ones(3, dtype=torch.int32))


@gpu
def test_softmax_rejects_mixed_devices():
    with pytest.raises(RuntimeError, match="`grad_output` must be on the same device as `output`"):
        torch.ops.torchext.softmax_backward(torch.ones(3), torch.ones(3, device="cuda"))
    with pytest.raises(RuntimeError, match="`grad_output` must be on the same device as `output`"):
        torch.ops.torchext.log_softmax_backward(torch.ones(3, device="cuda"), torch.ones(3))


@pytest.mark.parametrize("name", SOFTMAXES)
@pytest.mark.parametrize(
    "device,autocast_dtype",
    [
        pytest.param("cpu", torch.bfloat16, id="cpu-bfloat16"),
        pytest.param("cuda", torch.float16, id="cuda-float16", marks=gpu),
        pytest.param("cuda", torch.bfloat16, id="cuda-bfloat16", marks=gpu),
    ],
)
def test_softmax_autocast_float32(name, device, autocast_dtype):
    """Under autocast the ops run in float32 (as PyTorch's softmax does), also for low-precision inputs."""
    ours_fn, torch_fn, _ = SOFTMAXES[name]
    for in_dtype in (torch.float32, autocast_dtype):
        x = make_tensor((4, 50), in_dtype, device, requires_grad=True)
        with torch.autocast(device, dtype=autocast_dtype):
            y = ours_fn(x)
        assert y.dtype == torch.float32, f"[{name} autocast] result dtype {y.dtype}"
        assert max_error(y, torch_fn(x.detach().float())) <= 1e-6, f"[{name} autocast] differs from float32 torch"
        (gx,) = torch.autograd.grad(y.sum(), x)
        assert gx.dtype == in_dtype, f"[{name} autocast] x.grad dtype {gx.dtype}"


@pytest.mark.parametrize("name", SOFTMAXES)
@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dim", [0, 1, -2])
def test_functional_softmax_other_dim(name, device, dim):
    ours_fn = getattr(torchext.functional, name)
    torch_fn = getattr(F, name)
    x = make_tensor((3, 5, 7), torch.float64, device, requires_grad=True)
    grad = make_tensor((3, 5, 7), torch.float64, device)
    y, y_torch = ours_fn(x, dim=dim), torch_fn(x, dim=dim)
    assert max_error(y, y_torch) <= 1e-12, f"[functional.{name} dim={dim}] forward differs from torch"
    (gx,) = torch.autograd.grad(y, x, grad)
    (gx_torch,) = torch.autograd.grad(y_torch, x, grad)
    assert max_error(gx, gx_torch) <= 1e-12, f"[functional.{name} dim={dim}] x.grad differs from torch"
