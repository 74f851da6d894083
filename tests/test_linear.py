"""torchext.linear and torchext.nn.Linear against torch.nn.Linear followed by the activation: forward and backward
for every activation and dtype, the saved tensors, gradcheck, opcheck, torch.compile, state_dict both ways,
from_torch, autocast, a short training run, and errors."""

import pytest
import torch
import torch.nn.functional as F
from conftest import LAYOUTS, assert_accurate, device_dtype_params, device_params, gpu, make_tensor, poison_allocator
from torch import nn
from torch.library import opcheck

import torchext
from torchext.ops.matmul import ACTIVATIONS

# The reference: torch.nn.functional.linear, then the activation.
TORCH_ACTIVATIONS = {
    "none": lambda z: z,
    "relu": torch.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda z: F.gelu(z, approximate="tanh"),
    "silu": F.silu,
}


def reference(x, weight, bias, activation):
    return TORCH_ACTIVATIONS[activation](F.linear(x, weight, bias))


# (input shape, out_features): 2-D, 3-D (leading dims fold), 1-D input, odd sizes, M = 0, K = 0.
SHAPES = [((7, 13), 5), ((2, 3, 13), 5), ((13,), 5), ((129, 65), 33), ((0, 13), 5), ((4, 0), 5)]


def check_linear_matches_torch(device, dtype, activation, shape, out_features, has_bias):
    """torchext's linear against torch.nn.functional.linear + the activation, forward and the three gradients, each
    within the error bound of a float64 reference."""
    x = make_tensor(shape, dtype, device, requires_grad=True)
    w = make_tensor((out_features, shape[-1]), dtype, device, low=-0.5, high=0.5, requires_grad=True)
    b = make_tensor((out_features,), dtype, device, requires_grad=True) if has_bias else None
    params = [x, w] + ([b] if has_bias else [])
    as64 = [p.detach().double().requires_grad_(True) for p in params]
    x64, w64, b64 = as64[0], as64[1], as64[2] if has_bias else None

    poison_allocator(device, torch.empty((*shape[:-1], out_features), dtype=dtype))
    y = torchext.functional.linear(x, w, b, activation)
    y_torch = reference(x, w, b, activation)
    y_ref = reference(x64, w64, b64, activation)
    assert y.dtype == dtype and y.shape == y_torch.shape and y.is_contiguous()
    assert_accurate(y, y_torch, y_ref, f"linear {activation} forward")

    grad = make_tensor(y.shape, dtype, device)
    ours = torch.autograd.grad(y, params, grad)
    theirs = torch.autograd.grad(y_torch, params, grad)
    refs = torch.autograd.grad(y_ref, as64, grad.double())
    for name, g, g_torch, g_ref in zip(("input", "weight", "bias"), ours, theirs, refs):
        assert g.shape == g_ref.shape and g.dtype == dtype
        assert_accurate(g, g_torch, g_ref, f"linear {activation} {name}.grad")


@pytest.mark.parametrize("device,dtype", device_dtype_params())
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("shape,out_features", SHAPES, ids=str)
@pytest.mark.parametrize("has_bias", [True, False], ids=["bias", "no-bias"])
def test_linear_matches_torch(device, dtype, activation, shape, out_features, has_bias):
    check_linear_matches_torch(device, dtype, activation, shape, out_features, has_bias)


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape,out_features", [((8, 4096), 40), ((4096, 256), 256), ((512, 512), 10)], ids=str)
def test_linear_split_k_layers(dtype, shape, out_features):
    """Layers whose GEMMs take split-K on CUDA cores (cuda_ops/matmul_simt.cu): a thin 4096 -> 40 layer, a float32
    256 -> 256 layer with few output tiles and the weight gradient's k of 4096, the 10-class classifier. gelu saves
    the pre-activation, so the reduction's epilogue writes both outputs."""
    check_linear_matches_torch("cuda", dtype, "gelu", shape, out_features, has_bias=True)


def assert_wgmma_runs_layer(dtype, rows, in_features, out_features):
    """On an sm_90 GPU, the default kernel of a (rows, in) -> out layer's three GEMMs is wgmma (elsewhere: nothing
    to check), so that a test meant for wgmma fails instead of testing another kernel."""
    if torch.cuda.get_device_capability() != (9, 0):
        return
    x = torch.empty(rows, in_features, device="cuda", dtype=dtype)
    w = torch.empty(out_features, in_features, device="cuda", dtype=dtype)
    g = torch.empty(rows, out_features, device="cuda", dtype=dtype)
    for a, b in ((x, w.t()), (g, w), (g.t(), x)):  # forward, grad_input, grad_weight
        assert torchext.ops.matmul_kernel(a, b) == "wgmma"


@gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_linear_stream_k_layer(dtype, activation):
    """A 1024 -> 1024 layer on 1000 rows: each of its three GEMMs has 32 tiles of 128 x 256 and a k of 1000 or more,
    so wgmma splits them along k (stream-K, cuda_ops/matmul_wgmma.cu); the tile owners run the bias and activation
    epilogue after adding the other blocks' partial sums."""
    assert_wgmma_runs_layer(dtype, 1000, 1024, 1024)
    check_linear_matches_torch("cuda", dtype, activation, (1000, 1024), 1024, has_bias=True)


@gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("has_bias", [True, False], ids=["bias", "no-bias"])
def test_linear_wgmma_epilogues(dtype, activation, has_bias):
    """Every activation, with and without bias, through wgmma's TMA-store epilogue (cuda_ops/matmul_wgmma.cu): relu
    and none go from the accumulators to the staging buffer; gelu, gelu_tanh and silu are applied to the staging
    after z went to `saved`. 300 rows and 384 columns leave partial tiles in m and n. The shapes in
    test_linear_matches_torch are not 16-byte aligned, so they run on the other kernels."""
    assert_wgmma_runs_layer(dtype, 300, 512, 384)
    check_linear_matches_torch("cuda", dtype, activation, (300, 512), 384, has_bias)


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("x_layout", LAYOUTS)
@pytest.mark.parametrize("w_layout", LAYOUTS)
def test_linear_reads_strided_operands(device, x_layout, w_layout):
    """Transposed and non-contiguous input and weight are read through their strides, forward and backward."""
    x = make_tensor((9, 17), torch.float64, device, x_layout, requires_grad=True)
    w = make_tensor((6, 17), torch.float64, device, w_layout, requires_grad=True)
    b = make_tensor((6,), torch.float64, device, requires_grad=True)
    y = torchext.functional.linear(x, w, b, "silu")
    y_ref = reference(x, w, b, "silu")
    torch.testing.assert_close(y, y_ref)
    grad = make_tensor(y.shape, torch.float64, device, "transposed")
    for g, g_ref in zip(torch.autograd.grad(y, (x, w, b), grad), torch.autograd.grad(y_ref, (x, w, b), grad)):
        torch.testing.assert_close(g, g_ref)


@pytest.mark.parametrize("device", device_params())
def test_linear_input_with_unfoldable_leading_dims(device):
    """A 3-D input whose leading dimensions cannot be viewed as one (batch innermost in memory)."""
    x = make_tensor((5, 3, 8), torch.float64, device).transpose(0, 1).requires_grad_(True)
    w = make_tensor((4, 8), torch.float64, device, requires_grad=True)
    y = torchext.functional.linear(x, w, None, "relu")
    torch.testing.assert_close(y, reference(x, w, None, "relu"))
    gx, gw = torch.autograd.grad(y.sum(), (x, w))
    gx_ref, gw_ref = torch.autograd.grad(reference(x, w, None, "relu").sum(), (x, w))
    torch.testing.assert_close(gx, gx_ref)
    torch.testing.assert_close(gw, gw_ref)


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_linear_saved_tensor(device, activation):
    """`saved` is the pre-activation for gelu, gelu_tanh and silu, empty for none and relu."""
    x, w, b = (make_tensor(s, torch.float64, device) for s in ((6, 7), (3, 7), (3,)))
    out, saved = torch.ops.torchext.linear(x, w, b, activation)
    torch.testing.assert_close(out, reference(x, w, b, activation))
    if activation in ("gelu", "gelu_tanh", "silu"):
        torch.testing.assert_close(saved, F.linear(x, w, b))
    else:
        assert saved.numel() == 0


@pytest.mark.parametrize("device", device_params())
def test_linear_backward_output_mask(device):
    """Outputs not asked for come back empty; the others are unchanged."""
    x, w, b = (make_tensor(s, torch.float64, device) for s in ((6, 7), (3, 7), (3,)))
    out, saved = torch.ops.torchext.linear(x, w, b, "gelu")
    g = make_tensor(out.shape, torch.float64, device)
    full = torch.ops.torchext.linear_backward(g, x, w, out, saved, "gelu", True, [True, True, True])
    for mask in ([True, False, False], [False, True, False], [False, False, True], [False, False, False]):
        part = torch.ops.torchext.linear_backward(g, x, w, out, saved, "gelu", True, mask)
        for wanted, got, expected in zip(mask, part, full):
            if wanted:
                torch.testing.assert_close(got, expected, rtol=0, atol=0)
            else:
                assert got.numel() == 0
    no_bias = torch.ops.torchext.linear_backward(g, x, w, out, saved, "gelu", False, [True, True, True])
    assert no_bias[2].numel() == 0


@pytest.mark.parametrize("device", device_params())
def test_linear_bias_grad_is_deterministic(device):
    x = make_tensor((3000, 16), torch.float32, device)
    w = make_tensor((64, 16), torch.float32, device)
    out, saved = torch.ops.torchext.linear(x, w, None, "silu")
    g = make_tensor(out.shape, torch.float32, device)
    first = torch.ops.torchext.linear_backward(g, x, w, out, saved, "silu", True, [False, False, True])[2]
    for _ in range(3):
        again = torch.ops.torchext.linear_backward(g, x, w, out, saved, "silu", True, [False, False, True])[2]
        assert torch.equal(first, again), "the bias gradient changed between identical calls"


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_linear_gradcheck(device, activation):
    x = make_tensor((2, 3, 5), torch.float64, device, requires_grad=True)
    w = make_tensor((4, 5), torch.float64, device, requires_grad=True)
    b = make_tensor((4,), torch.float64, device, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w, b: torchext.functional.linear(x, w, b, activation), (x, w, b))
    assert torch.autograd.gradcheck(lambda x, w: torchext.functional.linear(x, w, None, activation), (x, w))


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_linear_opcheck(device, activation):
    x = make_tensor((2, 3, 5), torch.float32, device, requires_grad=True)
    w = make_tensor((4, 5), torch.float32, device, "transposed", requires_grad=True)
    b = make_tensor((4,), torch.float32, device, requires_grad=True)
    opcheck(torch.ops.torchext.linear.default, (x, w, b, activation))
    opcheck(torch.ops.torchext.linear.default, (x, w, None, activation))
    out, saved = torch.ops.torchext.linear(x.detach(), w.detach(), b.detach(), activation)
    g = make_tensor(out.shape, torch.float32, device)
    opcheck(torch.ops.torchext.linear_backward.default, (g, x.detach(), w.detach(), out, saved, activation, True,
                                                         [True, True, True]))  # fmt: skip
    opcheck(torch.ops.torchext.linear_backward.default, (g, x.detach(), w.detach(), out, saved, activation, False,
                                                         [False, True, False]))  # fmt: skip


class _MLP(nn.Module):
    def __init__(self, make):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = make(12, 32, "relu"), make(32, 16, "gelu_tanh"), make(16, 4, None)

    def forward(self, x):
        return self.fc3(self.fc2(self.fc1(x)))


def _torchext_layer(i, o, activation):
    return torchext.Linear(i, o, activation=activation)


def _torch_layer(i, o, activation):
    act = {"relu": nn.ReLU(), "gelu_tanh": nn.GELU("tanh"), None: nn.Identity()}[activation]
    return nn.Sequential(nn.Linear(i, o), act)


@pytest.mark.slow
@pytest.mark.parametrize("device", device_params())
def test_linear_compile_fullgraph(device):
    torch._dynamo.reset()
    model = _MLP(_torchext_layer).to(device)
    x = torch.randn(8, 12, device=device)
    eager = model(x)
    g_eager = torch.autograd.grad(eager.square().sum(), model.fc1.weight)[0]
    compiled = torch.compile(model, fullgraph=True)
    out = compiled(x)
    g_compiled = torch.autograd.grad(out.square().sum(), model.fc1.weight)[0]
    torch.testing.assert_close(out, eager, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g_compiled, g_eager, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("device", device_params())
def test_linear_trains_like_torch(device):
    """Five SGD steps of the same MLP built from torch.nn.Linear + activations and from torchext.Linear give the
    same losses step by step."""
    torch.manual_seed(1)
    ours = _MLP(_torchext_layer).to(device, torch.float64)
    theirs = _MLP(_torch_layer).to(device, torch.float64)
    for name in ("fc1", "fc2", "fc3"):
        getattr(theirs, name)[0].load_state_dict(getattr(ours, name).state_dict())
    x, t = torch.randn(32, 12, device=device, dtype=torch.float64), torch.randint(0, 4, (32,), device=device)
    opt_ours = torch.optim.SGD(ours.parameters(), lr=0.1)
    opt_theirs = torch.optim.SGD(theirs.parameters(), lr=0.1)
    for step in range(5):
        losses = []
        for model, opt in ((ours, opt_ours), (theirs, opt_theirs)):
            opt.zero_grad()
            loss = F.cross_entropy(model(x), t)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert losses[0] == pytest.approx(losses[1], rel=1e-10, abs=1e-12), f"step {step}: {losses}"


# The module.
def test_linear_module_matches_torch_init_and_state_dict():
    torch.manual_seed(3)
    theirs = nn.Linear(7, 5)
    torch.manual_seed(3)
    ours = torchext.Linear(7, 5)
    assert isinstance(ours, nn.Linear) and torchext.Linear is torchext.nn.Linear
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    for key in theirs.state_dict():
        assert torch.equal(ours.state_dict()[key], theirs.state_dict()[key]), f"[{key}] initialisation differs"
    assert torchext.Linear(7, 5, bias=False).bias is None


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_linear_state_dict_both_ways(activation):
    theirs = nn.Linear(6, 3)
    ours = torchext.Linear(6, 3, activation=activation)
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(4, 6)
    torch.testing.assert_close(ours(x), TORCH_ACTIVATIONS[activation](theirs(x)))
    other = torchext.Linear(6, 3, activation=activation)
    back = nn.Linear(6, 3)
    back.load_state_dict(other.state_dict())
    torch.testing.assert_close(other(x), TORCH_ACTIVATIONS[activation](back(x)))


@pytest.mark.parametrize("device", device_params())
def test_linear_from_torch(device):
    theirs = nn.Linear(6, 3, device=device, dtype=torch.float64).eval()
    theirs.bias.requires_grad_(False)
    ours = torchext.Linear.from_torch(theirs, activation="gelu")
    assert ours.weight.device == theirs.weight.device and ours.weight.dtype == torch.float64
    assert ours.activation == "gelu" and not ours.training and not ours.bias.requires_grad
    assert ours.weight.data_ptr() != theirs.weight.data_ptr(), "from_torch copies the parameters"
    x = torch.randn(2, 6, device=device, dtype=torch.float64)
    torch.testing.assert_close(ours(x), F.gelu(theirs(x)))
    with torch.no_grad():
        theirs.weight.zero_()
    assert ours.weight.abs().sum() > 0
    assert torchext.Linear.from_torch(nn.Linear(6, 3, bias=False)).bias is None


def test_linear_module_repr_and_bad_activation():
    assert "activation='relu'" in repr(torchext.Linear(3, 4, activation="relu"))
    assert "in_features=3, out_features=4, bias=True, activation='none'" in repr(torchext.Linear(3, 4))
    with pytest.raises(ValueError, match=r"unknown activation 'tanh'; valid: None, 'none', 'relu', 'gelu'"):
        torchext.Linear(3, 4, activation="tanh")


def test_linear_cpu_autocast_runs_float32():
    x, w = torch.randn(4, 5), torch.randn(3, 5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = torchext.functional.linear(x, w, None, "relu")
    assert y.dtype == torch.float32


@gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_linear_cuda_autocast_casts_like_torch(dtype):
    layer = torchext.Linear(5, 3, activation="silu").cuda()
    x = torch.randn(4, 5, device="cuda", requires_grad=True)
    with torch.autocast("cuda", dtype=dtype):
        y = layer(x)
        y_torch = F.silu(F.linear(x, layer.weight, layer.bias))
    assert y.dtype == y_torch.dtype == dtype
    y.float().sum().backward()
    assert x.grad.dtype == torch.float32 and layer.weight.grad.dtype == torch.float32


# Errors name the argument.
def test_linear_rejects_bad_input():
    x, w = torch.ones(4, 5), torch.ones(3, 5)
    with pytest.raises(ValueError, match=r"`weight` must be 2-D \(out_features, in_features\), got 1-D"):
        torchext.functional.linear(x, torch.ones(5))
    with pytest.raises(ValueError, match=r"`weight` must have 5 columns \(in_features\) to match `input`'s last"):
        torchext.functional.linear(x, torch.ones(3, 6))
    with pytest.raises(ValueError, match=r"`bias` must have shape \(3,\)"):
        torchext.functional.linear(x, w, torch.ones(4))
    with pytest.raises(TypeError, match=r"`weight` must have the same dtype as `input`"):
        torchext.functional.linear(x, w.double())
    with pytest.raises(TypeError, match=r"`input` must be float32 or float64 on CPU"):
        torchext.functional.linear(x.half(), w.half())
    with pytest.raises(ValueError, match=r"unknown activation 'gelu_erf'"):
        torchext.functional.linear(x, w, None, "gelu_erf")
    with pytest.raises(ValueError, match=r"`activation` must be one of 'none', 'relu', 'gelu', 'gelu_tanh', 'silu'"):
        torch.ops.torchext.linear(x, w, None, "tanh")
    with pytest.raises(ValueError, match=r"`grad_out` must have shape \[4, 3\]"):
        torch.ops.torchext.linear_backward(torch.ones(4, 4), x, w, x, x, "none", False, [True, True, True])
    with pytest.raises(ValueError, match=r"`saved` must be the forward's pre-activation"):
        torch.ops.torchext.linear_backward(torch.ones(4, 3), x, w, x, torch.ones(0), "gelu", False, [True] * 3)


@gpu
def test_linear_rejects_mixed_devices():
    x, w = torch.ones(4, 5, device="cuda"), torch.ones(3, 5)
    with pytest.raises(RuntimeError, match=r"`weight` must be on the same device as `input`"):
        torchext.functional.linear(x, w)
    with pytest.raises(RuntimeError, match=r"`bias` must be on the same device as `input`"):
        torchext.functional.linear(x, w.cuda(), torch.ones(3))
