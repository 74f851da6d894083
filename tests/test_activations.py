"""relu, leaky_relu, sigmoid, tanh, gelu (exact and tanh) and silu against PyTorch, forward and backward."""

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

# id -> (torchext function, torch function, op name, extra positional args, extra keyword args of the op)
ACTIVATIONS = {
    "relu": (torchext.ops.relu, torch.relu, "relu", (), {}),
    "leaky_relu": (lambda x: torchext.ops.leaky_relu(x, 0.2), lambda x: F.leaky_relu(x, 0.2), "leaky_relu", (0.2,), {}),
    "sigmoid": (torchext.ops.sigmoid, torch.sigmoid, "sigmoid", (), {}),
    "tanh": (torchext.ops.tanh, torch.tanh, "tanh", (), {}),
    "gelu": (torchext.ops.gelu, F.gelu, "gelu", (), {}),
    "gelu_tanh": (
        lambda x: torchext.ops.gelu(x, "tanh"),
        lambda x: F.gelu(x, approximate="tanh"),
        "gelu",
        (),
        {"approximate": "tanh"},
    ),
    "silu": (torchext.ops.silu, F.silu, "silu", (), {}),
}
SHAPES = [(1,), (7,), (1023,), (3, 7, 10), (4, 33, 65), (0,), (2, 0, 3)]


@pytest.mark.parametrize("name", ACTIVATIONS)
@pytest.mark.parametrize("device,dtype", device_dtype_params())
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_activation_matches_torch(name, device, dtype, shape, layout):
    ours_fn, torch_fn = ACTIVATIONS[name][:2]
    x = make_tensor(shape, dtype, device, layout, requires_grad=True)
    x64 = x.detach().to(torch.float64).requires_grad_(True)
    grad = make_tensor(shape, dtype, device, layout)
    x_before, grad_before = x.detach().clone(), grad.clone()

    poison_allocator(device, x)
    y = ours_fn(x)
    y_torch = torch_fn(x)
    y_ref = torch_fn(x64)
    assert y.dtype == dtype and y.shape == x.shape
    assert_accurate(y, y_torch, y_ref, f"{name} forward")

    (gx,) = torch.autograd.grad(y, x, grad)
    (gx_torch,) = torch.autograd.grad(y_torch, x, grad)
    (gx_ref,) = torch.autograd.grad(y_ref, x64, grad.to(torch.float64))
    assert_accurate(gx, gx_torch, gx_ref, f"{name} x.grad")
    assert torch.equal(x.detach(), x_before) and torch.equal(grad, grad_before), "an input was modified"


@pytest.mark.parametrize("name", ACTIVATIONS)
@pytest.mark.parametrize("device,dtype", device_dtype_params())
@pytest.mark.parametrize("shape", [(1,), (7,), (3, 7, 10), (4, 33, 65)], ids=str)
def test_activation_backward_of_expanded_gradient(name, device, dtype, shape):
    """The gradient of a sum or mean reaches the backward kernel as one element expanded to the whole shape; the
    kernels read that element in place (csrc/checks.h, is_broadcast_scalar). Every element must still get it, at
    every size (vector body and tail) and for a value other than 1."""
    ours_fn, torch_fn = ACTIVATIONS[name][:2]
    x = make_tensor(shape, dtype, device, requires_grad=True)
    grad = torch.tensor(-1.75, dtype=dtype, device=device).expand(shape)
    poison_allocator(device, x)
    (gx,) = torch.autograd.grad(ours_fn(x), x, grad)
    (gx_torch,) = torch.autograd.grad(torch_fn(x), x, grad)
    x64 = x.detach().to(torch.float64).requires_grad_(True)
    (gx_ref,) = torch.autograd.grad(torch_fn(x64), x64, grad.to(torch.float64))
    assert_accurate(gx, gx_torch, gx_ref, f"{name} x.grad from an expanded gradient")
    assert gx.stride() == x.stride(), f"[{name}] gradient strides {gx.stride()} != input strides {x.stride()}"


@pytest.mark.parametrize("name", ACTIVATIONS)
@pytest.mark.parametrize("device", device_params())
def test_activation_special_values(name, device):
    ours_fn, torch_fn = ACTIVATIONS[name][:2]
    # Signed zeros, tiny and huge finite values (exp overflows), NaN. (Infinities are left out: torch's own CPU and
    # CUDA kernels disagree on gelu(inf).)
    x = torch.tensor([0.0, -0.0, 1e-30, -1e-30, 40.0, -40.0, 1e4, -1e4, float("nan")])
    x = x.to(device)
    assert max_error(ours_fn(x), torch_fn(x)) <= 1e-6, f"[{name}] special values differ from torch"


@pytest.mark.parametrize("name", ACTIVATIONS)
@pytest.mark.parametrize("device", device_params())
def test_activation_gradcheck(name, device):
    ours_fn = ACTIVATIONS[name][0]
    x = make_tensor((4, 9), torch.float64, device, requires_grad=True)
    assert torch.autograd.gradcheck(ours_fn, (x,))


@pytest.mark.parametrize("name", ACTIVATIONS)
@pytest.mark.parametrize("device", device_params())
def test_activation_opcheck(name, device):
    _, _, op, args, kwargs = ACTIVATIONS[name]
    for layout in ("contiguous", "transposed"):
        x = make_tensor((5, 6), torch.float32, device, layout, requires_grad=True)
        opcheck(getattr(torch.ops.torchext, op).default, (x, *args), kwargs)
    g = make_tensor((5, 6), torch.float32, device)
    saved = make_tensor((5, 6), torch.float32, device)
    opcheck(getattr(torch.ops.torchext, f"{op}_backward").default, (g, saved, *args), kwargs)


@pytest.mark.parametrize("name", ACTIVATIONS)
@pytest.mark.parametrize("device", device_params())
def test_activation_keeps_channels_last(name, device):
    ours_fn = ACTIVATIONS[name][0]
    x = make_tensor((2, 3, 5, 4), torch.float32, device).to(memory_format=torch.channels_last).requires_grad_(True)
    y = ours_fn(x)
    assert y.stride() == x.stride(), "channels-last input should give a channels-last output"
    (gx,) = torch.autograd.grad(y, x, torch.randn_like(y))
    assert gx.stride() == x.stride()


# grad_output layouts that differ from a channels-last input's: the contiguous gradient a pooling layer may give,
# the expanded gradient of a mean over H and W, a gradient with unit spatial dimensions (strides that do not matter).
GRAD_LAYOUTS = {
    "contiguous": lambda g: g.contiguous(),
    "expanded": lambda g: g.mean((2, 3), keepdim=True).expand_as(g),
    "transposed": lambda g: g.transpose(2, 3).contiguous().transpose(2, 3),
}


@pytest.mark.parametrize("name", ACTIVATIONS)
@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("grad_layout", GRAD_LAYOUTS)
def test_activation_gradient_takes_the_input_layout(name, device, grad_layout):
    """The gradient keeps the forward's layout whatever grad_output's is, as torch's backward kernels do, so a
    channels-last network's gradients stay channels-last (a contiguous one makes cuDNN and batch norm run their
    NCHW kernels in every layer before it)."""
    ours_fn, torch_fn = ACTIVATIONS[name][:2]
    x = make_tensor((3, 5, 4, 6), torch.float32, device).to(memory_format=torch.channels_last).requires_grad_(True)
    x64 = x.detach().to(torch.float64).requires_grad_(True)
    grad = GRAD_LAYOUTS[grad_layout](make_tensor((3, 5, 4, 6), torch.float32, device))
    assert grad.stride() != x.stride()
    y = ours_fn(x)
    (gx,) = torch.autograd.grad(y, x, grad)
    assert gx.stride() == x.stride(), f"{name}: gradient strides {gx.stride()}, input strides {x.stride()}"
    (gx_torch,) = torch.autograd.grad(torch_fn(x), x, grad)
    (gx_ref,) = torch.autograd.grad(torch_fn(x64), x64, grad.to(torch.float64))
    assert_accurate(gx, gx_torch, gx_ref, f"{name} x.grad with a {grad_layout} grad_output")


def test_unit_dimensions_strides_do_not_force_a_copy():
    """(N, C, 1, 1) channels-last and contiguous tensors lie the same way in memory, though their strides differ:
    the backward reads grad_output as it is."""
    y = torchext.ops.relu(torch.randn(4, 8, 1, 1).to(memory_format=torch.channels_last))
    g = torch.randn(4, 8, 1, 1)
    assert y.stride() != g.stride()
    gx = torch.ops.torchext.relu_backward(g, y)
    assert torch.equal(gx, torch.where(y > 0, g, torch.zeros_like(g)))
    assert gx.stride() == y.stride()


@gpu
@pytest.mark.parametrize("name", ACTIVATIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_activation_misaligned_view(name, dtype):
    """A view starting one element into its storage cannot use 16-byte vectors: the scalar path must be right."""
    ours_fn, torch_fn = ACTIVATIONS[name][:2]
    x = make_tensor((1025,), dtype, "cuda")[1:]
    assert x.data_ptr() % 16 != 0
    assert max_error(ours_fn(x), torch_fn(x)) <= 2 * max_error(torch_fn(x), torch_fn(x.double())) + 1e-6


def test_activation_rejects_bad_input():
    with pytest.raises(TypeError, match="`self` must be float32 or float64 on CPU"):
        torchext.ops.relu(torch.arange(4))
    with pytest.raises(TypeError, match="`self`"):
        torchext.ops.gelu(torch.ones(3, dtype=torch.float16))
    with pytest.raises(ValueError, match="`approximate` must be 'none' or 'tanh'"):
        torchext.ops.gelu(torch.ones(3), "fast")
    with pytest.raises(ValueError, match="`grad_output` must have the same shape"):
        torch.ops.torchext.silu_backward(torch.ones(3), torch.ones(4))
    with pytest.raises(TypeError, match="`grad_output` must have the same dtype"):
        torch.ops.torchext.tanh_backward(torch.ones(3, dtype=torch.float64), torch.ones(3))


@gpu
def test_activation_rejects_mixed_devices():
    with pytest.raises(RuntimeError, match="`grad_output` must be on the same device as `output`"):
        torch.ops.torchext.relu_backward(torch.ones(3), torch.ones(3, device="cuda"))
