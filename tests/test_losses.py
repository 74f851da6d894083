"""mse_loss, binary_cross_entropy_with_logits and multi_margin_loss against PyTorch, forward and backward (with
respect to input and, for the first two, target)."""

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
    poison_allocator,
)
from torch.library import opcheck

import torchext

REDUCTIONS = ("none", "mean", "sum")
SHAPES = [(1,), (7,), (1023,), (4, 10), (3, 7, 10), (0,), (2, 0, 3)]


# The pure-PyTorch references: torch.nn.functional itself (run in float64 on the same values for the reference).
def mse_loss_reference(input, target, weight=None, reduction="mean"):
    return F.mse_loss(input, target, reduction=reduction, weight=weight)


def binary_cross_entropy_with_logits_reference(input, target, weight=None, pos_weight=None, reduction="mean"):
    return F.binary_cross_entropy_with_logits(input, target, weight, reduction=reduction, pos_weight=pos_weight)


def multi_margin_loss_reference(input, target, p=1, margin=1.0, weight=None, reduction="mean"):
    return F.multi_margin_loss(input, target, p, margin, weight, reduction=reduction)


def _f64(t):
    return None if t is None else t.detach().to(torch.float64).requires_grad_(t.requires_grad)


def _grad_like(loss, dtype, device, layout):
    """grad_output: loss-shaped in the given layout under 'none', 0-dim otherwise."""
    if loss.dim() == 0:
        return torch.empty((), dtype=torch.float64).uniform_(0.5, 2.0).to(device=device, dtype=dtype)
    return make_tensor(loss.shape, dtype, device, layout)


def _check_against_torch(name, ours_fn, torch_fn, grad_inputs, other_inputs, device, dtype, layout):
    """ours_fn / torch_fn take (*grad_inputs, *other_inputs). Compares the loss and the gradients of grad_inputs with
    PyTorch's, both against a float64 reference, and checks that no input was modified."""
    everything = [t for t in (*grad_inputs, *other_inputs) if isinstance(t, torch.Tensor)]
    before = [t.detach().clone() for t in everything]
    grad_inputs64 = [_f64(t) for t in grad_inputs]
    other64 = [_f64(t) if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in other_inputs]

    poison_allocator(device, grad_inputs[0])
    loss = ours_fn(*grad_inputs, *other_inputs)
    loss_torch = torch_fn(*grad_inputs, *other_inputs)
    loss_ref = torch_fn(*grad_inputs64, *other64)
    assert loss.dtype == dtype and loss.shape == loss_torch.shape, f"[{name}] result {loss.dtype} {loss.shape}"
    assert_accurate(loss, loss_torch, loss_ref, f"{name} forward")

    grad = _grad_like(loss, dtype, device, layout)
    grad_before = grad.clone()
    poison_allocator(device, grad_inputs[0])
    grads = torch.autograd.grad(loss, grad_inputs, grad)
    grads_torch = torch.autograd.grad(loss_torch, grad_inputs, grad)
    grads_ref = torch.autograd.grad(loss_ref, grad_inputs64, grad.to(torch.float64))
    for i, (g, g_torch, g_ref) in enumerate(zip(grads, grads_torch, grads_ref)):
        assert g.dtype == dtype and g.shape == grad_inputs[i].shape
        assert_accurate(g, g_torch, g_ref, f"{name} grad of input {i}")
    for t, b in zip(everything, before):
        assert torch.equal(t.detach(), b), f"[{name}] an input was modified"
    assert torch.equal(grad, grad_before), f"[{name}] grad_output was modified"


# ---------------------------------------------------------------------------------------------------------------
# mse_loss


@pytest.mark.parametrize("device,dtype", device_dtype_params())
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_mse_loss_matches_torch(device, dtype, shape, layout, reduction, weighted):
    x = make_tensor(shape, dtype, device, layout, requires_grad=True)
    y = make_tensor(shape, dtype, device, layout, requires_grad=True)
    w = make_tensor(shape, dtype, device, layout, low=0.1, high=2.0) if weighted else None
    _check_against_torch(
        "mse_loss",
        lambda x, y, w: torchext.ops.mse_loss(x, y, w, reduction),
        lambda x, y, w: mse_loss_reference(x, y, w, reduction),
        (x, y),
        (w,),
        device,
        dtype,
        layout,
    )


@pytest.mark.parametrize("device", device_params())
def test_mse_loss_broadcasts_target_like_torch(device):
    x = make_tensor((4, 5), torch.float64, device, requires_grad=True)
    y = make_tensor((5,), torch.float64, device, requires_grad=True)
    with pytest.warns(UserWarning, match="target size"):
        loss = torchext.ops.mse_loss(x, y, reduction="sum")
    with pytest.warns(UserWarning, match="target size"):
        ref = F.mse_loss(x, y, reduction="sum")
    torch.testing.assert_close(loss, ref)
    grads = torch.autograd.grad(loss, (x, y))
    grads_ref = torch.autograd.grad(ref, (x, y))
    torch.testing.assert_close(grads, grads_ref, msg="[mse_loss broadcast grads]")


# ---------------------------------------------------------------------------------------------------------------
# binary_cross_entropy_with_logits

# (weight, pos_weight): absent, one value (0-dim), one per class (last dimension), a column broadcast over the last
# dimension (expanded by the wrapper), or a full tensor of the input's shape.
BCE_WEIGHTS = [
    (None, None),
    ("scalar", None),
    ("class", None),
    ("column", None),
    ("full", None),
    (None, "scalar"),
    (None, "class"),
    ("full", "class"),
    ("class", "full"),
]


def _weight_shape(kind, shape):
    return {"scalar": (), "class": shape[-1:], "column": shape[:-1] + (1,), "full": shape}[kind]


def _bce_operand(kind, shape, dtype, device, layout):
    if kind is None:
        return None
    return make_tensor(_weight_shape(kind, shape), dtype, device, layout, low=0.1, high=3.0)


@pytest.mark.parametrize("device,dtype", device_dtype_params())
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("weights", BCE_WEIGHTS, ids=lambda w: f"w={w[0]}-pw={w[1]}")
def test_binary_cross_entropy_with_logits_matches_torch(device, dtype, shape, layout, reduction, weights):
    x = make_tensor(shape, dtype, device, layout, low=-6.0, high=6.0, requires_grad=True)
    y = make_tensor(shape, dtype, device, layout, low=0.0, high=1.0, requires_grad=True)
    w = _bce_operand(weights[0], shape, dtype, device, layout)
    pw = _bce_operand(weights[1], shape, dtype, device, layout)
    _check_against_torch(
        "binary_cross_entropy_with_logits",
        lambda x, y, w, pw: torchext.ops.binary_cross_entropy_with_logits(x, y, w, pw, reduction),
        lambda x, y, w, pw: binary_cross_entropy_with_logits_reference(x, y, w, pw, reduction),
        (x, y),
        (w, pw),
        device,
        dtype,
        layout,
    )


@pytest.mark.parametrize("device", device_params())
def test_binary_cross_entropy_with_logits_extreme_logits(device):
    x = torch.tensor([-1e4, -100.0, -30.0, -1e-30, 0.0, 1e-30, 30.0, 100.0, 1e4], device=device, requires_grad=True)
    y = torch.tensor([0.0, 1.0, 0.5, 1.0, 0.3, 0.0, 1.0, 0.0, 0.7], device=device)
    pw = torch.full((9,), 2.5, device=device)
    loss = torchext.ops.binary_cross_entropy_with_logits(x, y, None, pw, "none")
    ref = binary_cross_entropy_with_logits_reference(x, y, None, pw, "none")
    assert torch.isfinite(loss).all(), "[bce extreme logits] loss overflowed"
    torch.testing.assert_close(loss, ref, msg="[bce extreme logits forward]")
    (g,) = torch.autograd.grad(loss.sum(), x)
    (g_ref,) = torch.autograd.grad(ref.sum(), x)
    torch.testing.assert_close(g, g_ref, msg="[bce extreme logits x.grad]")


# ---------------------------------------------------------------------------------------------------------------
# multi_margin_loss

# (input shape, target shape): a batch, one row with 1-D or 0-dim target, one class, many classes, no rows.
MARGIN_SHAPES = [
    ((5, 10), (5,)),
    ((1, 7), (1,)),
    ((10,), ()),
    ((10,), (1,)),
    ((3, 1), (3,)),
    ((33, 1023), (33,)),
    ((0, 10), (0,)),
]


def _targets(input_shape, target_shape, device):
    classes = input_shape[-1] if input_shape else 1
    return torch.randint(0, classes, target_shape, device=device)


@pytest.mark.parametrize("device,dtype", device_dtype_params())
@pytest.mark.parametrize("shapes", MARGIN_SHAPES, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_multi_margin_loss_matches_torch(device, dtype, shapes, layout, reduction, p, weighted):
    input_shape, target_shape = shapes
    x = make_tensor(input_shape, dtype, device, layout, requires_grad=True)
    t = _targets(input_shape, target_shape, device)
    w = make_tensor(input_shape[-1:], dtype, device, layout, low=0.1, high=2.0) if weighted else None
    margin = 0.7
    if input_shape[0] == 0 and reduction != "none":
        # torch returns an uninitialised tensor here; ours is the sum over no rows (0) or their mean (NaN).
        loss = torchext.ops.multi_margin_loss(x, t, p, margin, w, reduction)
        expected = torch.tensor(float("nan") if reduction == "mean" else 0.0, dtype=dtype, device=device)
        torch.testing.assert_close(loss, expected, equal_nan=True, msg="[multi_margin_loss] reduction over no rows")
        return
    _check_against_torch(
        "multi_margin_loss",
        lambda x, t, w: torchext.ops.multi_margin_loss(x, t, p, margin, w, reduction),
        lambda x, t, w: multi_margin_loss_reference(x, t, p, margin, w, reduction),
        (x,),
        (t, w),
        device,
        dtype,
        layout,
    )


@pytest.mark.parametrize("device", device_params())
def test_multi_margin_loss_zero_dim_input(device):
    x = torch.tensor(0.3, dtype=torch.float64, device=device, requires_grad=True)
    t = torch.tensor(0, device=device)
    loss = torchext.ops.multi_margin_loss(x, t)
    torch.testing.assert_close(loss, multi_margin_loss_reference(x, t))
    (g,) = torch.autograd.grad(loss, x)
    assert g.shape == () and g.item() == 0.0


@pytest.mark.parametrize("device", device_params())
def test_multi_margin_loss_strided_target(device):
    x = make_tensor((6, 4), torch.float32, device, requires_grad=True)
    t = torch.randint(0, 4, (12,), device=device)[::2]
    assert not t.is_contiguous()
    loss = torchext.ops.multi_margin_loss(x, t, reduction="none")
    torch.testing.assert_close(loss, multi_margin_loss_reference(x, t, reduction="none"))


# ---------------------------------------------------------------------------------------------------------------
# Every loss: gradcheck, opcheck, autocast, errors.


def _gradcheck_cases(device):
    x = make_tensor((4, 6), torch.float64, device, requires_grad=True)
    y = make_tensor((4, 6), torch.float64, device, requires_grad=True)
    prob = make_tensor((4, 6), torch.float64, device, low=0.0, high=1.0, requires_grad=True)
    w_full = make_tensor((4, 6), torch.float64, device, low=0.1, high=2.0)
    w_class = make_tensor((6,), torch.float64, device, low=0.1, high=2.0)
    t = torch.randint(0, 6, (4,), device=device)
    for reduction in REDUCTIONS:
        yield f"mse_loss-{reduction}", lambda a, b, r=reduction: torchext.ops.mse_loss(a, b, None, r), (x, y)
        yield (
            f"mse_loss-weighted-{reduction}",
            lambda a, b, r=reduction: torchext.ops.mse_loss(a, b, w_full, r),
            (x, y),
        )
        yield (
            f"bce-{reduction}",
            lambda a, b, r=reduction: torchext.ops.binary_cross_entropy_with_logits(a, b, w_full, w_class, r),
            (x, prob),
        )
        for p in (1, 2):
            yield (
                f"multi_margin_loss-p{p}-{reduction}",
                lambda a, r=reduction, p=p: torchext.ops.multi_margin_loss(a, t, p, 0.9, w_class, r),
                (x,),
            )


@pytest.mark.parametrize("device", device_params())
def test_losses_gradcheck(device):
    for name, fn, inputs in _gradcheck_cases(device):
        assert torch.autograd.gradcheck(fn, inputs), f"[{name}] gradcheck"


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_losses_opcheck(device, reduction):
    ops = torch.ops.torchext
    x = make_tensor((5, 6), torch.float32, device, "transposed", requires_grad=True)
    y = make_tensor((5, 6), torch.float32, device, requires_grad=True)
    prob = make_tensor((5, 6), torch.float32, device, low=0.0, high=1.0, requires_grad=True)
    w = make_tensor((5, 6), torch.float32, device, low=0.1, high=2.0)
    w_class = make_tensor((6,), torch.float32, device, low=0.1, high=2.0)
    t = torch.randint(0, 6, (5,), device=device)
    g = make_tensor((5, 6), torch.float32, device) if reduction == "none" else torch.tensor(1.5, device=device)
    g_rows = make_tensor((5,), torch.float32, device) if reduction == "none" else g
    xd, yd, probd = x.detach(), y.detach(), prob.detach()

    opcheck(ops.mse_loss.default, (x, y, None, reduction))
    opcheck(ops.mse_loss.default, (x, y, w, reduction))
    opcheck(ops.mse_loss_backward.default, (g, xd, yd, w, reduction))
    opcheck(ops.binary_cross_entropy_with_logits.default, (x, prob, w_class, w, reduction))
    opcheck(ops.binary_cross_entropy_with_logits.default, (x, prob, None, None, reduction))
    for wrt_target in (False, True):
        opcheck(
            ops.binary_cross_entropy_with_logits_backward.default, (g, xd, probd, w, w_class, reduction, wrt_target)
        )
    for p in (1, 2):
        opcheck(ops.multi_margin_loss.default, (x, t, p, 0.8, w_class, reduction))
        opcheck(ops.multi_margin_loss_backward.default, (g_rows, xd, t, p, 0.8, w_class, reduction))
    opcheck(ops.multi_margin_loss.default, (x, t))


def test_losses_autocast_cpu_bfloat16():
    """Under CPU autocast the losses run in float32, like PyTorch's: bfloat16 inputs give a float32 result."""
    x = make_tensor((4, 6), torch.bfloat16, "cpu", requires_grad=True)
    y = make_tensor((4, 6), torch.bfloat16, "cpu", low=0.0, high=1.0)
    t = torch.randint(0, 6, (4,))
    cases = {
        "mse_loss": (lambda a: torchext.ops.mse_loss(a, y), lambda a: mse_loss_reference(a, y.float())),
        "bce": (
            lambda a: torchext.ops.binary_cross_entropy_with_logits(a, y),
            lambda a: binary_cross_entropy_with_logits_reference(a, y.float()),
        ),
        "multi_margin_loss": (
            lambda a: torchext.ops.multi_margin_loss(a, t),
            lambda a: multi_margin_loss_reference(a, t),
        ),
    }
    for name, (ours_fn, ref_fn) in cases.items():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = ours_fn(x)
        assert loss.dtype == torch.float32, f"[{name}] autocast result is {loss.dtype}"
        x32 = x.detach().float().requires_grad_(True)
        ref = ref_fn(x32)
        torch.testing.assert_close(loss, ref, msg=f"[{name}] autocast forward")
        (g,) = torch.autograd.grad(loss, x)
        (g_ref,) = torch.autograd.grad(ref, x32)
        assert g.dtype == torch.bfloat16
        torch.testing.assert_close(g, g_ref.bfloat16(), msg=f"[{name}] autocast x.grad")


@gpu
def test_losses_autocast_cuda_float16():
    x = make_tensor((4, 6), torch.float32, "cuda", requires_grad=True)
    y = make_tensor((4, 6), torch.float32, "cuda", low=0.0, high=1.0)
    with torch.autocast("cuda", dtype=torch.float16):
        loss = torchext.ops.binary_cross_entropy_with_logits(x.half(), y.half())
    assert loss.dtype == torch.float32, f"[bce] autocast result is {loss.dtype}"
    ref = binary_cross_entropy_with_logits_reference(x.half().float(), y.half().float())
    torch.testing.assert_close(loss, ref, msg="[bce] autocast forward")


def test_losses_reject_bad_input():
    x, y = torch.randn(4, 5), torch.randn(4, 5)
    t = torch.tensor([0, 1, 2, 3])
    ops = torch.ops.torchext
    with pytest.raises(ValueError, match="`target` must have the same shape"):
        ops.mse_loss(x, torch.randn(4, 6))
    with pytest.raises(ValueError, match="`target` must have the same shape"):
        torchext.ops.binary_cross_entropy_with_logits(x, torch.rand(5))
    with pytest.raises(TypeError, match="`target` must have the same dtype"):
        torchext.ops.mse_loss(x, y.double())
    with pytest.raises(ValueError, match="`weight`"):
        torchext.ops.mse_loss(x, y, torch.ones(5))
    with pytest.raises(ValueError, match="`weight`"):
        torchext.ops.binary_cross_entropy_with_logits(x, y, torch.ones(3))
    with pytest.raises(ValueError, match="`pos_weight`"):
        torchext.ops.binary_cross_entropy_with_logits(x, y, None, torch.ones(4))
    with pytest.raises(ValueError, match="`reduction` must be 'none', 'mean' or 'sum'"):
        torchext.ops.mse_loss(x, y, reduction="avg")
    with pytest.raises(TypeError, match="`self` must be float32 or float64 on CPU"):
        torchext.ops.mse_loss(x.half(), y.half())
    with pytest.raises(TypeError, match="`self`"):
        torchext.ops.multi_margin_loss(torch.arange(20).reshape(4, 5), t)
    with pytest.raises(TypeError, match="`target` must be int64"):
        torchext.ops.multi_margin_loss(x, t.float())
    with pytest.raises(TypeError, match="`target` must be int64"):
        torchext.ops.multi_margin_loss(x, t.int())
    with pytest.raises(IndexError, match=r"`target` at row 2 is 5, outside the valid class range \[0, 5\)"):
        torchext.ops.multi_margin_loss(x, torch.tensor([0, 1, 5, 3]))
    with pytest.raises(IndexError, match=r"`target` at row 0 is -1"):
        ops.multi_margin_loss_backward(torch.tensor(1.0), x, torch.tensor([-1, 1, 2, 3]), 1, 1.0, None, "mean")
    with pytest.raises(ValueError, match="`target` must hold one class index per row"):
        torchext.ops.multi_margin_loss(x, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="`weight` must be 1-D with one element per class"):
        torchext.ops.multi_margin_loss(x, t, weight=torch.ones(4))
    with pytest.raises(ValueError, match="`p` must be 1 or 2, got 3"):
        torchext.ops.multi_margin_loss(x, t, p=3)
    with pytest.raises(ValueError, match="`self` must be"):
        torchext.ops.multi_margin_loss(torch.randn(2, 3, 4), t[:2])
    with pytest.raises(ValueError, match="`grad_output` must be 0-dim"):
        ops.mse_loss_backward(torch.ones(4, 5), x, y, None, "mean")
    with pytest.raises(ValueError, match="`grad_output` must have the loss's shape"):
        ops.binary_cross_entropy_with_logits_backward(torch.ones(5), x, y, None, None, "none", False)


@pytest.mark.parametrize("device", device_params())
def test_losses_reject_weight_grad(device):
    x = make_tensor((3, 4), torch.float64, device, requires_grad=True)
    y = make_tensor((3, 4), torch.float64, device, low=0.0, high=1.0)
    w = make_tensor((3, 4), torch.float64, device, requires_grad=True)
    t = torch.tensor([0, 3, 1], device=device)
    with pytest.raises(NotImplementedError, match="`weight`"):
        torchext.ops.mse_loss(x, y, w).backward()
    with pytest.raises(NotImplementedError, match="`pos_weight`"):
        torchext.ops.binary_cross_entropy_with_logits(x, y, None, w[0]).backward()
    with pytest.raises(NotImplementedError, match="`weight`"):
        torchext.ops.multi_margin_loss(x, t, weight=w[0]).backward()


# ---------------------------------------------------------------------------------------------------------------
# CUDA only: mixed devices, target range checks without device asserts, graph capture, determinism, big sizes.


@gpu
def test_losses_reject_mixed_devices():
    x = torch.randn(4, 5, device="cuda")
    with pytest.raises(RuntimeError, match="`target` must be on the same device as `self`"):
        torchext.ops.mse_loss(x, torch.randn(4, 5))
    with pytest.raises(RuntimeError, match="`weight` must be on the same device as `self`"):
        torchext.ops.binary_cross_entropy_with_logits(x, torch.rand(4, 5, device="cuda"), torch.ones(5))
    with pytest.raises(RuntimeError, match="`target` must be on the same device as `self`"):
        torchext.ops.multi_margin_loss(x, torch.tensor([0, 1, 2, 3]))
    with pytest.raises(RuntimeError, match="`grad_output` must be on the same device as `self`"):
        torch.ops.torchext.mse_loss_backward(torch.tensor(1.0), x, x, None, "sum")


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_multi_margin_loss_target_out_of_range_cuda(dtype):
    x = torch.randn(6, 5, device="cuda", dtype=dtype)
    bad = torch.tensor([0, 1, 7, 3, -2, 4], device="cuda")
    for reduction in REDUCTIONS:
        with pytest.raises(IndexError, match=r"`target` at row 2 is 7, outside the valid class range \[0, 5\)"):
            torchext.ops.multi_margin_loss(x, bad, reduction=reduction)
            torchext.ops.check_targets()  # deferred by default (test_cross_entropy.py covers the modes)
    g = torch.tensor(1.0, device="cuda", dtype=dtype)
    with pytest.raises(IndexError, match=r"`target` at row 2 is 7"):
        torch.ops.torchext.multi_margin_loss_backward(g, x, bad, 2, 1.0, None, "sum")
        torchext.ops.check_targets()
    # No device assert fired: the context is still usable.
    good = torch.tensor([0, 1, 2, 3, 4, 4], device="cuda")
    torch.testing.assert_close(
        torchext.ops.multi_margin_loss(x.float(), good), multi_margin_loss_reference(x.float(), good)
    )


@gpu
def test_multi_margin_loss_cuda_graph_capture():
    """While capturing, the target check's sync is skipped; an out-of-range target then shows as NaN."""
    x = torch.randn(8, 10, device="cuda")
    t = torch.randint(0, 10, (8,), device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torchext.ops.multi_margin_loss(x, t, reduction="none")
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        loss = torchext.ops.multi_margin_loss(x, t, reduction="none")
    graph.replay()
    torch.testing.assert_close(loss, multi_margin_loss_reference(x, t, reduction="none"))
    t[3] = 10
    graph.replay()
    assert torch.isnan(loss[3]) and torch.isfinite(loss[torch.arange(8, device="cuda") != 3]).all()


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_losses_cuda_deterministic_large(dtype):
    """Many blocks of partial sums: repeated runs are bit-identical, and accurate."""
    n = (1 << 22) + 3
    x = make_tensor((n,), dtype, "cuda")
    y = make_tensor((n,), dtype, "cuda", low=0.0, high=1.0)
    w = make_tensor((n,), dtype, "cuda", low=0.1, high=2.0)
    runs = {
        "mse_loss": lambda: torchext.ops.mse_loss(x, y, w),
        "bce": lambda: torchext.ops.binary_cross_entropy_with_logits(x, y, reduction="mean"),
    }
    refs = {
        "mse_loss": (mse_loss_reference(x, y, w), mse_loss_reference(x.double(), y.double(), w.double())),
        "bce": (
            binary_cross_entropy_with_logits_reference(x, y),
            binary_cross_entropy_with_logits_reference(x.double(), y.double()),
        ),
    }
    for name, run in runs.items():
        first = run()
        for _ in range(3):
            assert torch.equal(run(), first), f"[{name}] reduction is not deterministic"
        assert_accurate(first, *refs[name], f"{name} large")


@gpu
def test_losses_cuda_misaligned_views():
    """Views that start one element into their storage (no 16-byte alignment)."""
    x = make_tensor((1025,), torch.float16, "cuda")[1:]
    y = make_tensor((1025,), torch.float16, "cuda", low=0.0, high=1.0)[1:]
    assert x.data_ptr() % 16 != 0
    assert_accurate(
        torchext.ops.binary_cross_entropy_with_logits(x, y, reduction="none"),
        binary_cross_entropy_with_logits_reference(x, y, reduction="none"),
        binary_cross_entropy_with_logits_reference(x.double(), y.double(), reduction="none"),
        "bce misaligned",
    )
